"""poslens.runtime: device and dtype parsing, process-wide switches restored after use, and the
thread policy."""

import os
import subprocess
import sys

import pytest
import torch

from poslens import runtime
from poslens.errors import PoslensError
from poslens.runtime import no_hf_progress_bars, parse_device, resolve_dtype, torch_threads


def test_parse_device(monkeypatch):
    assert parse_device("cpu") == "cpu"
    monkeypatch.setenv("POSLENS_DEVICE", "auto")
    assert parse_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("POSLENS_DEVICE", "cpu")  # the environment replaces auto's choice, not an explicit one
    assert parse_device("auto") == "cpu"
    monkeypatch.setenv("POSLENS_DEVICE", "tpu")
    with pytest.raises(PoslensError, match="POSLENS_DEVICE='tpu'"):
        parse_device("auto")
    assert parse_device("cpu") == "cpu"
    with pytest.raises(PoslensError, match="--device 'tpu'"):
        parse_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(PoslensError, match="no CUDA GPU"):
            parse_device("cuda")


def test_resolve_dtype():
    assert resolve_dtype("bf16", "cpu", None) is torch.bfloat16
    assert resolve_dtype("auto", "cpu", None) is torch.float32

    class Cfg:
        dtype = "float16"

    assert resolve_dtype("auto", "cuda", Cfg()) is torch.float16
    with pytest.raises(PoslensError, match="--dtype 'int8'"):
        resolve_dtype("int8", "cpu", None)


def test_torch_threads_restored_even_after_an_error():
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    with torch_threads(want):
        assert torch.get_num_threads() == want
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with torch_threads(want):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_hf_progress_bars_switch_restored():
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    try:
        hf_logging.enable_progress_bar()
        with no_hf_progress_bars():
            assert not hf_logging.is_progress_bar_enabled()
        assert hf_logging.is_progress_bar_enabled()
        with no_hf_progress_bars(False):
            assert hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        with no_hf_progress_bars():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # a caller's own "off" stays off
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def test_build_model_leaves_the_global_rng_alone():
    from poslens.models.families import build_model

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = build_model("none", "micro", 32, seed=5)
    assert torch.equal(torch.rand(3), expected)
    b = build_model("none", "micro", 32, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("cpus,busy,want", [(2, 0, 2), (2, 1, 1), (2, 2, 1), (2, 7, 1), (8, 2.4, 6), (8, 2.6, 5),
                                             (1, 0, 1), (16, 0.4, 16)])
def test_default_threads_is_free_cpus_at_least_one(cpus, busy, want):
    assert runtime.default_threads(cpus=cpus, busy=busy) == want


def test_set_threads_restores_previous_count():
    before = torch.get_num_threads()
    with runtime.set_threads(3) as n:
        assert n == 3 and torch.get_num_threads() == 3
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with runtime.set_threads(2):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_resolve_threads():
    assert runtime.resolve_threads(5) == 5
    assert 1 <= runtime.resolve_threads(0) <= runtime.available_cpus()
    assert 1 <= runtime.resolve_threads(None) <= runtime.available_cpus()
    with pytest.raises(PoslensError, match="--threads -2"):
        runtime.resolve_threads(-2)


def _fake_task(root, pid, tid, state, cpu, name="python"):
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True)
    # stat: pid (comm) state ppid ... ; field 39 (index 36 after the state) is the last CPU
    rest = ["0"] * 40
    rest[36 - 1] = str(cpu)
    (d / "stat").write_text(f"{tid} ({name}) {state} " + " ".join(rest) + "\n")


def test_runnable_others_counts_running_threads_on_our_cpus(tmp_path):
    _fake_task(tmp_path, 100, 100, "R", 0)
    _fake_task(tmp_path, 100, 101, "R", 1, name="two words) R")  # a name with ")" and spaces
    _fake_task(tmp_path, 101, 101, "S", 0)  # sleeping
    _fake_task(tmp_path, 102, 102, "R", 5)  # running, but on a CPU we may not use
    _fake_task(tmp_path, os.getpid(), os.getpid(), "R", 0)  # ourselves
    assert runtime._runnable_others({0, 1}, proc=str(tmp_path)) == 2
    assert runtime._runnable_others(None, proc=str(tmp_path)) == 3
    assert runtime._runnable_others({0}, proc=str(tmp_path / "missing")) is None


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_busy_elsewhere_sees_a_busy_process():
    cpus = sorted(os.sched_getaffinity(0))
    code = "import os, time\nos.sched_setaffinity(0, {%d})\nt = time.time()\nwhile time.time() - t < 20: pass" % cpus[0]
    before = runtime._runnable_others(set(cpus))
    hog = subprocess.Popen([sys.executable, "-c", code])
    try:
        seen = 0
        for _ in range(50):  # the hog is runnable the whole time: some sample must see it
            seen = max(seen, runtime._runnable_others({cpus[0]}) or 0)
            if seen >= 1:
                break
        assert seen >= 1, (before, seen)
    finally:
        hog.kill()
        hog.wait()


@pytest.mark.parametrize("env,pre,want", [({}, "", "PASSIVE"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "", "ACTIVE"),
                                          ({}, "import torch; ", None)])
def test_configure_process_sets_passive_wait_only_before_torch(env, pre, want):
    src = os.path.join(os.path.dirname(runtime.__file__), "..")
    code = (f"{pre}import os; from poslens.runtime import configure_process; configure_process(); "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    clean.update(env, PYTHONPATH=os.path.abspath(src))
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(want)


COMPUTING_COMMANDS = ["simulate", "train", "zoo", "scan", "panels", "kim-maps", "slash", "slash-dynamics",
                      "neighborhood", "sweep", "probes", "demo", "reproduce"]


@pytest.mark.parametrize("command", COMPUTING_COMMANDS)
def test_every_computing_command_takes_threads(cli, command):
    code, out, _ = cli(command, "--help")
    assert code == 0 and "--threads" in out


def test_cli_threads_option_reaches_torch(cli, tmp_path, monkeypatch):
    seen = []
    real = runtime.apply_threads

    def spy(threads):
        n = real(threads)
        seen.append((threads, n, torch.get_num_threads()))
        return n

    monkeypatch.setattr(runtime, "apply_threads", spy)
    before = torch.get_num_threads()
    try:
        for t in (3, 0):
            code, _, err = cli("simulate", "--samples", 30, "--seq-len", 4, "--dim", 8, "--num-layers", 1, "--no-figures",
                               "--quiet", "--threads", t, "--out", tmp_path / f"r{t}")
            assert code == 0, err
    finally:
        torch.set_num_threads(before)
    assert seen[0] == (3, 3, 3)
    assert seen[1][0] == 0 and 1 <= seen[1][1] <= runtime.available_cpus() and seen[1][2] == seen[1][1]
    code, _, err = cli("simulate", "--samples", 30, "--seq-len", 4, "--out", tmp_path / "bad", "--threads", -1)
    assert code != 0 and "--threads" in err and not (tmp_path / "bad").exists()


# ------------------------------------------------------------------------------------------------
# library calls leave process-wide state as they found it
# ------------------------------------------------------------------------------------------------
def _global_state() -> dict:
    """Every process-wide switch poslens touches somewhere: torch threads, transformers' verbosity
    and progress-bar switch, warnings filters, the environment, the SIGTERM handler, the RNG,
    matplotlib's backend and pyplot's open figures."""
    import signal
    import sys
    import warnings

    import matplotlib
    from transformers.utils import logging as hf_logging

    plt = sys.modules.get("matplotlib.pyplot")
    return {"threads": torch.get_num_threads(), "hf_verbosity": hf_logging.get_verbosity(),
            "hf_progress_bars": hf_logging.is_progress_bar_enabled(), "warnings": list(warnings.filters),
            "environ": dict(os.environ), "sigterm": signal.getsignal(signal.SIGTERM),
            "torch_rng": torch.get_rng_state(), "mpl_backend": matplotlib.get_backend(),
            "pyplot_figures": plt.get_fignums() if plt is not None else []}


@pytest.fixture
def odd_global_state():
    """Switches set to values no poslens default has (3 threads, transformers at ERROR, Hugging
    Face's progress bars on, matplotlib's PDF backend: a notebook's own choice that drawing a figure
    must not replace); the test's own settings are undone afterwards."""
    import matplotlib
    from transformers.utils import logging as hf_logging

    before = (torch.get_num_threads(), hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(),
              matplotlib.get_backend())
    torch.set_num_threads(3)
    hf_logging.set_verbosity(hf_logging.ERROR)
    hf_logging.enable_progress_bar()
    matplotlib.use("pdf")
    yield
    matplotlib.use(before[3])
    torch.set_num_threads(before[0])
    hf_logging.set_verbosity(before[1])
    (hf_logging.enable_progress_bar if before[2] else hf_logging.disable_progress_bar)()


def _assert_unchanged(before: dict, after: dict, call: str) -> None:
    for k in before:
        same = torch.equal(before[k], after[k]) if k == "torch_rng" else before[k] == after[k]
        assert same, f"{call} changed {k}: {before[k]!r} -> {after[k]!r}"


def test_library_calls_restore_global_state(odd_global_state, tmp_path):
    """A tiny simulate, scan (with and without its bars), train, neighbourhood and slash-dynamics run from Python
    leave torch's threads, transformers' verbosity and progress-bar switch, the warnings filters,
    the environment and the global RNG as they were (each sets some of them inside its block)."""
    from archs import save_tiny

    from poslens.analysis.dynamics import DynamicsConfig, run_dynamics
    from poslens.analysis.neighborhood import NeighborhoodConfig, run_neighborhood
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.models.train import TrainConfig, train_model
    from poslens.simulator import SimConfig, run_simulation, save_result

    model = save_tiny("llama", tmp_path / "model", layers=2, hidden=32, heads=2, kv=1, positions=32)
    calls = {
        "simulate": lambda: save_result(run_simulation(SimConfig(samples=64, seq_len=6, dim=8, layers=1, device="cpu")),
                                        tmp_path / "sim", figures=True),
        "scan (progress)": lambda: run_scan(ScanConfig(model_dir=str(model), out=str(tmp_path / "s1"), data="random",
                                                       seq_len=8, num_seqs=2, batch_size=2, device="cpu",
                                                       figures=True), progress=True),
        "scan (quiet)": lambda: run_scan(ScanConfig(model_dir=str(model), out=str(tmp_path / "s2"), data="random",
                                                    seq_len=8, num_seqs=2, batch_size=2, device="cpu",
                                                    figures=False, overwrite=True), progress=False),
        "train": lambda: train_model(TrainConfig(out=str(tmp_path / "t"), pe="rope", task="copy", preset="micro",
                                                 steps=2, batch_size=4, eval_every=0, eval_examples=4,
                                                 checkpoint_every=0, device="cpu", threads=1, progress=True)),
        "neighborhood": lambda: run_neighborhood(NeighborhoodConfig(model_dir=str(model), out=str(tmp_path / "n"),
                                                                    data="random", seq_len=8, num_seqs=2, batch_size=2,
                                                                    device="cpu", figures=False), progress=False),
        "slash-dynamics": lambda: run_dynamics(DynamicsConfig(out=str(tmp_path / "d"), steps=2, snapshots=[0], hidden=16,
                                                              scan_seqs=2, seq_len=6, threads=1, device="cpu",
                                                              figures=False), progress=True),
    }
    for name, call in calls.items():
        before = _global_state()
        call()
        _assert_unchanged(before, _global_state(), name)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a caller's own "off" stays off too
    before = _global_state()
    calls["scan (quiet)"]()
    _assert_unchanged(before, _global_state(), "scan (quiet), bars off")


def test_cli_main_in_process_restores_threads_and_sigterm(tmp_path):
    """``poslens.cli.main`` called from Python (a notebook, a test) restores what a command sets for
    its process: torch's thread count (``--threads``) and the SIGTERM handler."""
    from poslens.cli import main

    torch.set_num_threads(3)
    try:
        before = _global_state()
        main(["simulate", "--samples", "30", "--seq-len", "4", "--dim", "8", "--num-layers", "1", "--no-figures",
              "--quiet", "--threads", "1", "--out", str(tmp_path / "r")])
        assert (tmp_path / "r" / "summary.json").is_file()
        _assert_unchanged(before, _global_state(), "poslens simulate --threads 1")
        with pytest.raises(SystemExit):  # an error exit restores them too
            main(["simulate", "--samples", "30", "--seq-len", "4", "--threads", "2", "--out", str(tmp_path / "r")])
        _assert_unchanged(before, _global_state(), "a failed poslens simulate")
    finally:
        torch.set_num_threads(1)
