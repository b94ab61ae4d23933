"""Every fault is one ``poslens: error:`` line and exit 2 (a PoslensError from Python), with
nothing written or lost: full disks, damaged checkpoints, odd --out paths, damaged or removed
runs, and values out of range."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest

from poslens.errors import PoslensError

from faultkit import SCAN, one_error, tree

SIM = ["--samples", "4", "--seq-len", "4", "--dim", "4", "--num-layers", "1", "--quiet", "--no-figures"]


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    """A finished scan (its checkpoint kept), written once per module."""
    import contextlib
    import io

    from poslens.cli import main

    out = tmp_path_factory.mktemp("one_line") / "r"
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
        main([str(a) for a in ("scan", tiny, "--out", out, *SCAN, "--keep-checkpoint")])
        raise SystemExit(0)
    assert e.value.code in (0, None)
    return out


def _full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_one_error(cli, tiny, run, tmp_path, monkeypatch):
    """Cause 7: scan, simulate --overwrite and report on a full disk gave tracebacks (exit 1)."""
    import safetensors.torch

    code, _, err = cli("simulate", "--out", tmp_path / "sim", *SIM)
    assert code == 0, err
    before = tree(tmp_path / "sim")
    with monkeypatch.context() as m:
        m.setattr(safetensors.torch, "save_file", _full)
        code, _, err = cli("scan", tiny, "--out", tmp_path / "new", *SCAN)
        one_error(code, err, "space")
        code, _, err = cli("simulate", "--out", tmp_path / "sim", *SIM, "--overwrite", "--seed", 1)
        one_error(code, err, "space")
    assert tree(tmp_path / "sim") == before
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", _full)
        code, _, err = cli("report", run, "--out", tmp_path / "report.html")
        one_error(code, err, "space")
    assert not (tmp_path / "report.html").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_a_damaged_scan_checkpoint_on_resume_is_one_error(cli, tiny, run, tmp_path, damage):
    """Cause 8: a truncated or garbled checkpoint.safetensors gave a SafetensorError traceback."""
    r = shutil.copytree(run, tmp_path / "r")
    (r / "summary.json").unlink()
    ck = r / "checkpoint.safetensors"
    ck.write_bytes(ck.read_bytes()[:1000] if damage == "truncated" else b"garbage" * 100)
    before = tree(r)
    code, _, err = cli("scan", tiny, "--out", r, *SCAN, "--keep-checkpoint", "--resume")
    one_error(code, err, "checkpoint.safetensors")
    assert tree(r) == before


@pytest.fixture(scope="module")
def stopped_training(tmp_path_factory):
    """A training run stopped after its first checkpoint."""
    from poslens.models.train import TrainConfig, train_model

    out = tmp_path_factory.mktemp("train") / "t"
    train_model(TrainConfig(out=str(out), task="copy", preset="micro", steps=6, batch_size=4, checkpoint_every=2,
                            eval_examples=8, stop_after=3, progress=False, device="cpu"))
    assert (out / "checkpoint.json").is_file()
    return out


@pytest.mark.parametrize("damage", ["truncated-model", "missing-file", "checkpoint-json"])
def test_a_damaged_training_checkpoint_on_resume_is_one_error(cli, stopped_training, tmp_path, damage):
    """Cause 8: a truncated checkpoint model.safetensors, a missing file or a non-JSON
    checkpoint.json gave tracebacks."""
    t = shutil.copytree(stopped_training, tmp_path / "t")
    ck = t / json.loads((t / "checkpoint.json").read_text())["dir"]
    if damage == "truncated-model":
        w = ck / "model.safetensors"
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    elif damage == "missing-file":
        (ck / "optimizer.safetensors").unlink()
    else:
        (t / "checkpoint.json").write_text("{not json")
    before = tree(t)
    code, _, err = cli("train", "--out", t, "--task", "copy", "--preset", "micro", "--steps", 6, "--batch-size", 4,
                       "--checkpoint-every", 2, "--eval-examples", 8, "--quiet", "--device", "cpu", "--resume")
    one_error(code, err, "--resume")
    assert tree(t) == before


@pytest.mark.parametrize("layers", ["abc", [1, "x", None]])
def test_report_refuses_layers_of_the_wrong_shape(cli, run, tmp_path, layers):
    """Cause 10: "layers": "abc" gave an AttributeError in the readings; a run's layers are checked when it
    is loaded (tests/faults/test_a_run_directory_trusted_as_written.py), one line naming the file and field."""
    r = shutil.copytree(run, tmp_path / "r")
    s = json.loads((r / "summary.json").read_text())
    s["layers"] = layers
    (r / "summary.json").write_text(json.dumps(s))
    code, _, err = cli("report", r, "--out", tmp_path / "report.html")
    one_error(code, err, "summary.json", "'layers'")
    assert not (tmp_path / "report.html").exists()


def test_odd_out_paths_are_one_error(cli, tiny, run, tmp_path):
    """Cause 11: a dangling symlink, a symlink loop, a path under a file and a non-UTF-8 name."""
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    code, _, err = cli("scan", tiny, "--out", tmp_path / "dangling", *SCAN)
    one_error(code, err, "nowhere")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    code, _, err = cli("scan", tiny, "--out", tmp_path / "loop", *SCAN)
    one_error(code, err, "loop")
    (tmp_path / "afile").write_text("x")
    code, _, err = cli("report", run, "--out", tmp_path / "afile" / "x.html")
    one_error(code, err, "afile")
    assert (tmp_path / "afile").read_text() == "x"
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xff")
    code, _, err = cli("scan", tiny, "--out", bad, *SCAN)
    one_error(code, err, "UTF-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "dangling", "loop"]


def test_a_result_whose_directory_was_removed_is_one_error(tiny, tmp_path):
    """Cause 12: r.maps was {} and r.heads() had 0 rows; r.save() raised FileNotFoundError."""
    import poslens

    r = poslens.scan(str(tiny), data="random", seq_len=8, num_seqs=2, progress=False, out=tmp_path / "r")
    shutil.rmtree(tmp_path / "r")
    for call in (lambda: r.maps, lambda: r.heads(), lambda: r.save(tmp_path / "copy")):
        with pytest.raises(PoslensError, match="no longer exists"):
            call()
    assert not (tmp_path / "copy").exists()


def test_a_run_missing_its_maps_is_refused(cli, run, tmp_path):
    """Cause 13: a run whose maps.safetensors is missing loaded with maps={} and reported exit 0."""
    import poslens

    r = shutil.copytree(run, tmp_path / "r")
    (r / "maps.safetensors").unlink()
    code, _, err = cli("report", r, "--out", tmp_path / "report.html")
    one_error(code, err, "maps.safetensors")
    assert not (tmp_path / "report.html").exists()
    with pytest.raises(PoslensError, match="maps.safetensors"):
        poslens.load(r)


def test_resume_into_a_training_run_names_it(cli, tiny, stopped_training, tmp_path):
    """Cause 16: scan --resume into a train run said "finished scan"."""
    t = shutil.copytree(stopped_training, tmp_path / "t")
    before = tree(t)
    code, _, err = cli("scan", tiny, "--out", t, *SCAN, "--resume")
    one_error(code, err, "poslens train")
    assert "finished scan" not in err and tree(t) == before


def test_an_interrupted_scan_names_the_resume_command(cli, tiny, tmp_path, monkeypatch):
    """Cause 16: an interrupted scan printed only "poslens: interrupted" with no resume hint."""
    import poslens.capture.scan.run as scan_mod

    real, calls = scan_mod.forward, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(scan_mod, "forward", interrupted)
    out = tmp_path / "o"
    code, _, err = cli("scan", tiny, "--out", out, *SCAN, "--batch-size", 1, "--checkpoint-every", 1)
    assert code == 130 and "Traceback" not in err, err
    assert err.startswith("poslens: interrupted") and "--resume" in err and f"--out {out}" in err
    monkeypatch.undo()
    code, _, err = cli("scan", tiny, "--out", out, *SCAN, "--batch-size", 1, "--checkpoint-every", 1, "--resume")
    assert code == 0, err


def test_simulate_names_the_option_that_needs_the_memory(cli, tmp_path):
    """Cause 16: --dim 100000000 blamed --seq-len and the layer count."""
    code, _, err = cli("simulate", "--out", tmp_path / "s", "--dim", 100_000_000, "--samples", 4, "--quiet")
    one_error(code, err, "--dim")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("theta", ["inf", "nan", "0"])
def test_simulate_refuses_a_rope_theta_out_of_range(cli, tmp_path, theta):
    """Cause 17: --rope-theta inf ran and recorded null."""
    code, _, err = cli("simulate", "--out", tmp_path / "s", *SIM, "--rope", "--rope-theta", theta)
    one_error(code, err, "--rope-theta")
    assert not (tmp_path / "s").exists()
