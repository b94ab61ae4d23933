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


def test_parse_device():
    assert parse_device("cpu") == "cpu"
    assert parse_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
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
