"""Nothing lost, nothing mixed: the faults a new user meets, run as they would meet them.

Every case runs the real CLI (``python -m poslens``) in a subprocess on real files: two commands
writing one ``--out`` (a lock refuses the second), ``--overwrite`` of things that are not its own
run, damaged weights, configs, GGUF files, datasets and run directories (one ``poslens: error:``
line, exit 2, no traceback, no ``--out`` left behind), SIGINT and SIGTERM (one policy: exit 130 /
143, ``poslens: interrupted``, a checkpoint where the command has one), and statistics that would
be numbers from noise. A few library-level checks (the lock inside one process) run in-process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from poslens.errors import PoslensError

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg", "POSLENS_DEVICE": "cpu"}
SIM = ["--samples", "8", "--seq-len", "6", "--num-layers", "1", "--dim", "8", "--quiet"]
TRAIN_SLOW = ["--task", "copy", "--preset", "micro", "--steps", "100000", "--quiet", "--threads", "1"]


def poslens(*args, cwd=None, env=None, timeout=300):
    """``python -m poslens ARGS`` to completion: ``(exit code, stdout, stderr)``."""
    p = subprocess.run([sys.executable, "-m", "poslens", *map(str, args)], cwd=cwd, env=env or ENV,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def start(*args, cwd=None):
    return subprocess.Popen([sys.executable, "-m", "poslens", *map(str, args)], cwd=cwd, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc, timeout: float = 120.0) -> None:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.1)


def one_error_line(code: int, err: str, *expect: str) -> str:
    """The convention of every refused input: exit 2, one ``poslens: error:`` line, no traceback."""
    lines = err.strip().splitlines()
    assert code == 2, (code, err[-3000:])
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("poslens: error: "), err[-3000:]
    for e in expect:
        assert e in lines[0], lines[0]
    return lines[0]


def tiny_model(path: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    return path


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("rel") / "tiny")


@pytest.fixture(scope="module")
def scan_run(tmp_path_factory, model) -> Path:
    out = tmp_path_factory.mktemp("rel_scan") / "scan"
    code, _, err = poslens("scan", model, "--out", out, "--data", "random", "--seq-len", 16, "--num-seqs", 4,
                           "--quiet", "--threads", 1)
    assert code == 0, err
    return out


# --------------------------------------------------------------------------------------------
# one run per directory
# --------------------------------------------------------------------------------------------
def test_a_second_process_is_refused_and_sigterm_leaves_a_checkpoint(tmp_path):
    """A training run holds --out: a second command into it is refused naming the first; SIGTERM
    (a scheduler's time limit) ends it with 143 and a checkpoint that --resume continues; a
    --resume with another option names that option."""
    out = tmp_path / "run"
    holder = start("train", "--out", out, *TRAIN_SLOW, "--lr", "0.003")
    try:
        wait_for(out / "train_log.jsonl", holder)
        lock = json.loads((out / ".poslens.lock").read_text())
        assert lock["pid"] == holder.pid and lock["command"] == "train"
        code, _, err = poslens("simulate", "--out", out, *SIM, "--overwrite")
        one_error_line(code, err)  # refused: not its run, and held by another process
        code, _, err = poslens("train", "--out", out, *TRAIN_SLOW, "--lr", "0.003", "--resume")
        one_error_line(code, err, "being written by another poslens process", f"PID {holder.pid}", "poslens train")
        time.sleep(0.5)  # some steps
    finally:
        holder.send_signal(signal.SIGTERM)
        _, err = holder.communicate(timeout=120)
    assert holder.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("poslens: interrupted"), err
    step = json.loads((out / "checkpoint.json").read_text())["step"]
    assert step > 0 and (out / f"checkpoint-{step:08d}" / "model.safetensors").is_file()
    assert not (out / ".poslens.lock").exists()  # given back on the way out
    code, _, err = poslens("train", "--out", out, *TRAIN_SLOW, "--lr", "0.01", "--resume")
    one_error_line(code, err, "--lr", "0.003", "0.01")
    code, out_text, err = poslens("train", "--out", out, *TRAIN_SLOW, "--lr", "0.003", "--resume", "--stop-after",
                                  step + 2)
    assert code == 0, err
    assert json.loads((out / "checkpoint.json").read_text())["step"] == step + 2


def test_the_lock_of_a_dead_process_is_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / ".poslens.lock").write_text(json.dumps({"pid": dead.pid, "host": "here", "command": "simulate"}))
    code, _, err = poslens("simulate", "--out", out, *SIM)
    assert code == 0, err
    assert (out / "summary.json").is_file() and not (out / ".poslens.lock").exists()


def test_the_lock_within_one_process(tmp_path):
    """Holds nest and are given back; a later call of the same process is not refused; another
    process is refused while the lock is held, and the directory made for the lock alone goes."""
    from poslens.rundir.outdir import create_out_dir
    from poslens.rundir.lock import lock_out_dir, out_dir_lock, release_out_dir, unlock_out_dir

    out = tmp_path / "run"
    with out_dir_lock(out, command="scan"):
        assert (out / ".poslens.lock").is_file()
        with out_dir_lock(out):
            pass
        assert (out / ".poslens.lock").is_file()  # the outer hold remains
        probe = subprocess.run([sys.executable, "-c", "import sys; from poslens.rundir.lock import lock_out_dir;\n"
                                f"lock_out_dir({str(out)!r})"], env=ENV, capture_output=True, text=True)
        assert probe.returncode != 0 and "being written by another poslens process" in probe.stderr
    assert not out.exists()  # made for the lock, nothing written: removed
    for _ in range(2):  # a run_scan-like caller: create_out_dir takes the lock, release_out_dir gives it back
        create_out_dir(out)
        (out / "x.json").write_text("{}")
        release_out_dir(out)
        assert not (out / ".poslens.lock").exists()
    lock_out_dir(out)
    unlock_out_dir(out)
    unlock_out_dir(out)  # one more than taken: nothing happens
    assert out.is_dir()


def test_overwrite_replaces_only_its_own_run(tmp_path, model, scan_run):
    before = tree(model)
    code, _, err = poslens("scan", model, "--out", model, "--overwrite", "--data", "random", "--seq-len", 8,
                           "--num-seqs", 2, "--quiet")
    one_error_line(code, err, "model directory")
    code, _, err = poslens("simulate", "--out", model, *SIM, "--overwrite")
    one_error_line(code, err, "model directory")
    assert tree(model) == before  # the model still loads: nothing of it was touched
    scan_files = tree(scan_run)
    code, _, err = poslens("train", "--out", scan_run, *TRAIN_SLOW[:4], "--steps", 2, "--overwrite")
    one_error_line(code, err, "`poslens scan` run", "poslens train")
    code, _, err = poslens("simulate", "--out", scan_run, *SIM, "--overwrite")
    one_error_line(code, err, "`poslens scan` run")
    assert tree(scan_run) == scan_files
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "draft.docx").write_text("mine")
    code, _, err = poslens("simulate", "--out", notes, *SIM, "--overwrite")
    one_error_line(code, err, "did not write", "draft.docx")
    assert (notes / "draft.docx").read_text() == "mine"


def test_overwrite_keeps_no_file_of_the_old_run(tmp_path):
    out = tmp_path / "sim"
    code, _, err = poslens("simulate", "--out", out, *SIM)
    assert code == 0, err
    assert list(out.glob("*.png"))  # files of the old run that the new one does not write
    code, _, err = poslens("simulate", "--out", out, *SIM, "--overwrite", "--no-figures")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [".poslens-files.json", "config.json", "maps.safetensors",
                                                     "summary.json"]
    (out / "notes.docx").write_text("mine")  # a user's file in a run: --overwrite would delete it
    code, _, err = poslens("simulate", "--out", out, *SIM, "--overwrite")
    one_error_line(code, err, "notes.docx")


def test_train_overwrite_replaces_a_training_run_whole(tmp_path):
    out = tmp_path / "model"
    args = ["train", "--out", out, "--task", "copy", "--preset", "micro", "--steps", 2, "--quiet", "--threads", 1]
    code, _, err = poslens(*args)
    assert code == 0, err
    (out / "extra.json").write_text("{}")  # not the run's (its record does not list it): refused, kept
    code, _, err = poslens(*args, "--overwrite")
    one_error_line(code, err, "extra.json")
    assert (out / "extra.json").read_text() == "{}"
    (out / "extra.json").unlink()
    code, _, err = poslens(*args, "--overwrite")
    assert code == 0, err
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    umask = os.umask(0)
    os.umask(umask)
    assert modes["model.safetensors"] == 0o666 & ~umask == modes["config.json"], modes


# --------------------------------------------------------------------------------------------
# damaged inputs: one line, exit 2, nothing written
# --------------------------------------------------------------------------------------------
def _damage(tmp: Path, model: Path, scan_run: Path) -> dict[str, tuple[list, tuple[str, ...]]]:
    """The damaged inputs, each written as a user would meet it, with its command and expected words."""
    from safetensors.torch import load_file, save_file

    cases = {}
    d = shutil.copytree(model, tmp / "truncated")
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])  # a partial download
    cases["truncated-weights"] = (["scan", d], ("model.safetensors", "truncated"))
    d = shutil.copytree(model, tmp / "wrong_shape")
    t = load_file(str(d / "model.safetensors"))
    t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(16, 32)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    cases["wrong-shape"] = (["scan", d], ("q_proj.weight", "[16, 32]", "[32, 32]"))
    d = shutil.copytree(model, tmp / "bad_config")
    c = json.loads((d / "config.json").read_text())
    c["hidden_size"] = "abc"
    (d / "config.json").write_text(json.dumps(c))
    cases["hidden-size-abc"] = (["scan", d], ("config.json", "hidden_size", "'abc'"))
    (tmp / "ids.jsonl").write_text('{"input_ids": [1, 2, "x", 4, 5, 6, 7, 8]}\n')
    cases["jsonl-ids"] = (["scan", model, "--data", tmp / "ids.jsonl"], ("ids.jsonl:1", "'x'"))
    try:
        import datasets
    except ImportError:
        pass
    else:
        ds = tmp / "dataset"
        datasets.Dataset.from_dict({"input_ids": [list(range(1, 17))] * 4}).save_to_disk(str(ds))
        arrow = next(ds.glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
        cases["dataset"] = (["scan", model, "--data", ds], ("dataset", "cannot be read"))
    r = shutil.copytree(scan_run, tmp / "maps_truncated")
    m = r / "maps.safetensors"
    m.write_bytes(m.read_bytes()[: m.stat().st_size * 2 // 3])
    cases["report-maps"] = (["report", r], ("maps.safetensors", "truncated"))
    try:
        from tests.capture.test_gguf import tiny_llama, write_gguf
    except ImportError:  # no gguf package
        pass
    else:
        import gguf

        original = gguf.GGUFWriter.add_feed_forward_length
        gguf.GGUFWriter.add_feed_forward_length = lambda self, n: original(self, n + 16)  # metadata != tensors
        try:
            write_gguf(tiny_llama(), tmp / "shapes.gguf")
        finally:
            gguf.GGUFWriter.add_feed_forward_length = original
        cases["gguf-shapes"] = (["scan", tmp / "shapes.gguf"], ("shapes.gguf", "shapes do not match"))
    return cases


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, model, scan_run):
    tmp = tmp_path_factory.mktemp("damaged")
    cases = _damage(tmp, model, scan_run)
    env = {**ENV, "POSLENS_CACHE": str(tmp / "cache")}
    results = {}
    names = sorted(cases)
    for k in range(0, len(names), 2):  # two at a time: two cores
        procs = []
        for name in names[k:k + 2]:
            argv, _ = cases[name]
            out = tmp / f"out_{name}"
            extra = ["--out", f"{out}.html"] if argv[0] == "report" else \
                ["--out", out, "--seq-len", 8, "--num-seqs", 2, "--quiet"] + (["--data", "random"]
                                                                             if "--data" not in argv else [])
            procs.append((name, out, subprocess.Popen([sys.executable, "-m", "poslens", *map(str, argv + extra)],
                                                      env=env, cwd=tmp, stdout=subprocess.PIPE,
                                                      stderr=subprocess.PIPE, text=True)))
        for name, out, p in procs:
            _, err = p.communicate(timeout=300)
            results[name] = (p.returncode, err, out)
    return tmp, cases, results


CASE_NAMES = ["truncated-weights", "wrong-shape", "hidden-size-abc", "jsonl-ids", "dataset", "report-maps",
              "gguf-shapes"]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_damaged_input_is_one_line_and_leaves_nothing(damaged, name):
    tmp, cases, results = damaged
    if name not in cases:
        pytest.skip("the package that writes this input is not installed")
    code, err, out = results[name]
    one_error_line(code, err, *cases[name][1])
    assert "LOAD REPORT" not in err and "de-quantizing" not in err
    leftovers = [p.name for p in tmp.iterdir() if p.name.startswith((f"out_{name}", f".out_{name}"))]
    assert leftovers == []


def test_report_reads_past_a_summary_entry_of_the_wrong_shape(tmp_path, scan_run):
    """``"tables": 5`` in a summary.json: the report skips the entry (as it skips every odd entry) and
    renders the rest, instead of a TypeError; its maps are still drawn."""
    run = shutil.copytree(scan_run, tmp_path / "run")
    s = json.loads((run / "summary.json").read_text())
    s["tables"] = 5
    (run / "summary.json").write_text(json.dumps(s))
    code, _, err = poslens("report", run, "--out", tmp_path / "r.html")
    assert code == 0 and "Traceback" not in err, err
    assert (tmp_path / "r.html").stat().st_size > 10_000


# --------------------------------------------------------------------------------------------
# interrupts and resume
# --------------------------------------------------------------------------------------------
def test_sigint_and_sigterm_of_a_scan(tmp_path, model):
    """Ctrl-C: 130; SIGTERM: 143; both say "poslens: interrupted" and name the command that resumes
    the run; the periodic checkpoint stays and --resume continues it; a --resume with another option
    names it."""
    args = ["--data", "random", "--seq-len", 64, "--num-seqs", 100000, "--batch-size", 1, "--checkpoint-every", 1,
            "--quiet", "--threads", 1]
    for sig, code_want in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        out = tmp_path / f"scan_{code_want}"
        p = start("scan", model, "--out", out, *args)
        try:
            wait_for(out / "checkpoint.safetensors", p)
        finally:
            p.send_signal(sig)
            _, err = p.communicate(timeout=120)
        assert p.returncode == code_want, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("poslens: interrupted: ") and f"--out {out}" in last and "--resume" in last, err
        assert (out / "checkpoint.safetensors").is_file() and not (out / ".poslens.lock").exists()
    code, _, err = poslens("scan", model, "--out", out, *[a if a != 64 else 32 for a in args], "--resume")
    one_error_line(code, err, "--seq-len: saved 64 vs now 32")


def test_sigint_of_simulate_leaves_nothing(tmp_path):
    out = tmp_path / "sim"
    p = start("simulate", "--out", out, "--samples", 10_000_000, "--seq-len", 32, "--quiet", "--threads", 1)
    time.sleep(6)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and err.strip() == "poslens: interrupted", err
    assert [q.name for q in tmp_path.iterdir()] == []


# --------------------------------------------------------------------------------------------
# no numbers from noise; sizes that cannot fit
# --------------------------------------------------------------------------------------------
def test_one_sample_reports_no_relativity_from_noise(tmp_path):
    out = tmp_path / "one"
    code, _, err = poslens("simulate", "--out", out, "--samples", 1, "--seq-len", 6, "--num-layers", 2, "--dim", 8,
                           "--quiet")
    assert code == 0, err
    layers = json.loads((out / "summary.json").read_text())["layers"]
    for layer in layers:
        assert layer["relativity_index"] is None and layer["locality"] is None and layer["flat"] is None
        assert layer["missing"]["relativity_index"] == "no_groups"
    from poslens.metrics.judge.papers import judge_kim

    j = judge_kim(layers)  # unknown, not flat
    assert j["missing"] == [0, 1] and j["reason"] == "no_groups" and j["flat"] == []


def test_a_size_that_cannot_fit_is_refused_up_front(tmp_path):
    t0 = time.time()
    code, _, err = poslens("simulate", "--out", tmp_path / "big", "--seq-len", 100000)
    one_error_line(code, err, "--seq-len 100000", "TB")
    assert time.time() - t0 < 60 and not (tmp_path / "big").exists()


def test_memory_estimate_counts_the_maps():
    from poslens.capture.statistics.accumulators import NOISE_GROUPS
    from poslens.simulator import SimConfig, memory_needed

    cfg = SimConfig(layers=3, seq_len=100, dim=4)
    maps = 3 * 100 * 100 * ((3 + NOISE_GROUPS) * 8 + (NOISE_GROUPS + 2) * 4)
    assert memory_needed(cfg, 250) == maps + 250 * (2 * 100 * 4 + 2 * 100 * 100) * 4


# --------------------------------------------------------------------------------------------
# smaller ones
# --------------------------------------------------------------------------------------------
def test_checkpoint_every_zero_is_documented():
    code, out, _ = poslens("train", "--help")
    assert code == 0 and "0: only when the run stops early" in " ".join(out.split())


def test_quiet_dequantisation_prints_no_bars(tmp_path, monkeypatch, capfd):
    pytest.importorskip("gguf")
    from tests.capture.test_gguf import tiny_llama, write_gguf

    from poslens.capture.model.source import resolve_model

    monkeypatch.setenv("POSLENS_CACHE", str(tmp_path / "cache"))
    write_gguf(tiny_llama(), tmp_path / "m.gguf")
    capfd.readouterr()
    resolve_model(tmp_path / "m.gguf").directory(progress=False)
    err = capfd.readouterr().err
    assert "de-quantizing" not in err and "Loading weights" not in err, err


def test_safetensors_header_check_names_the_damage(tmp_path):
    from safetensors.torch import save_file

    from poslens.rundir.io import safetensors_shapes

    f = tmp_path / "t.safetensors"
    save_file({"a": torch.zeros(3, 4), "b": torch.ones(5)}, str(f))
    assert safetensors_shapes(f) == {"a": [3, 4], "b": [5]}
    data = f.read_bytes()
    for cut, words in ((len(data) - 4, "truncated"), (4, "truncated"), (12, "truncated")):
        f.write_bytes(data[:cut])
        with pytest.raises(PoslensError, match=words):
            safetensors_shapes(f)


def test_missing_weights_warn_in_one_line_and_verbose_shows_the_load_report(tmp_path):
    """A checkpoint missing a tensor loads with that tensor at random: one poslens warning says so;
    transformers' own load report shows only with ``poslens --verbose``."""
    import transformers as tf
    from safetensors.torch import load_file, save_file

    import sys as _sys
    _sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from archs import tiny_config

    tf.AutoModelForCausalLM.from_config(tiny_config("llama")).save_pretrained(tmp_path / "m")
    sd = load_file(tmp_path / "m" / "model.safetensors")
    sd.pop("model.layers.0.input_layernorm.weight")
    save_file(sd, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    args = ["scan", str(tmp_path / "m"), "--data", "random", "--seq-len", "16", "--num-seqs", "2", "--quiet",
            "--no-figures"]
    quiet = subprocess.run([sys.executable, "-m", "poslens", *args, "--out", str(tmp_path / "a")],
                           capture_output=True, text=True, timeout=300)
    loud = subprocess.run([sys.executable, "-m", "poslens", "--verbose", *args, "--out", str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and loud.returncode == 0
    warn = [l for l in quiet.stderr.splitlines() if l.startswith("poslens: warning:")]
    assert len(warn) == 1 and "input_layernorm" in warn[0]
    assert "LOAD REPORT" not in quiet.stderr and "LOAD REPORT" in loud.stderr
