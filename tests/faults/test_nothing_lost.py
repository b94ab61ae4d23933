"""Nothing lost: ``--overwrite`` removes exactly the files poslens wrote, and a new run replaces
an old one only once it has succeeded (a failure, a full disk or Ctrl-C leave it bit-identical).

Each test runs the CLI in-process (the ``cli`` fixture) on a tiny Llama model.
"""

from __future__ import annotations

import errno
import json

import pytest

from poslens.rundir.io import MANIFEST
from poslens.rundir.load import load_run

from faultkit import SCAN, one_error, tree


def _scan(cli, model, out, *extra):
    return cli("scan", model, "--out", out, *SCAN, *extra)


@pytest.fixture
def scan_run(cli, tiny, tmp_path):
    out = tmp_path / "r"
    code, _, err = _scan(cli, tiny, out)
    assert code == 0, err
    return out


def test_a_run_records_the_files_it_wrote(scan_run):
    files = json.loads((scan_run / MANIFEST).read_text())["files"]
    assert {"config.json", "summary.json", "maps.safetensors"} <= set(files)
    assert all((scan_run / f).is_file() for f in files if f != "checkpoint.safetensors")


def test_overwrite_refuses_dotfiles_and_dot_folders(cli, tiny, scan_run):
    """Cause 1: a dotfile or dot-folder in a run is the user's; --overwrite refuses, naming it."""
    (scan_run / ".git").mkdir()
    (scan_run / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (scan_run / ".hidden").write_text("mine")
    before = tree(scan_run)
    code, _, err = _scan(cli, tiny, scan_run, "--overwrite")
    one_error(code, err, ".git")
    assert tree(scan_run) == before


@pytest.mark.parametrize("name", ["my_finetuned_weights.safetensors", "experiments/my_results.json", "photo.PNG"])
def test_overwrite_refuses_user_files_with_a_poslens_suffix(cli, tiny, scan_run, name):
    """Cause 2: files are judged by the run's record, not by their suffix."""
    (scan_run / name).parent.mkdir(exist_ok=True)
    (scan_run / name).write_bytes(b"mine")
    before = tree(scan_run)
    code, _, err = _scan(cli, tiny, scan_run, "--overwrite")
    one_error(code, err, name.split("/")[0])
    assert tree(scan_run) == before


def test_overwrite_refuses_a_run_without_a_record(cli, tiny, scan_run):
    (scan_run / MANIFEST).unlink()
    before = tree(scan_run)
    code, _, err = _scan(cli, tiny, scan_run, "--overwrite")
    one_error(code, err, MANIFEST)
    assert tree(scan_run) == before


def test_overwrite_replaces_exactly_the_recorded_files(cli, tiny, scan_run):
    old = tree(scan_run)
    code, _, err = _scan(cli, tiny, scan_run, "--overwrite", "--seed", 1)
    assert code == 0, err
    new = tree(scan_run)
    assert new.keys() == old.keys() and new["maps.safetensors"] != old["maps.safetensors"]
    assert not [p for p in scan_run.parent.iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.parametrize("bad", [{"rope_theta": -5.0}, {"rope_theta": 0.0}, {"rms_norm_eps": -1.0}])
def test_a_bad_config_is_refused_before_the_old_run_is_touched(cli, tiny, scan_run, tmp_path, bad):
    """Cause 3: a config value out of range is one error before anything is written or removed."""
    import shutil

    broken = shutil.copytree(tiny, tmp_path / "broken")
    cfg = json.loads((broken / "config.json").read_text())
    cfg.update(bad)
    (broken / "config.json").write_text(json.dumps(cfg))
    before = tree(scan_run)
    code, _, err = _scan(cli, broken, scan_run, "--overwrite")
    one_error(code, err, next(iter(bad)))
    assert tree(scan_run) == before


def test_a_full_disk_during_overwrite_keeps_the_old_run(cli, tiny, scan_run, monkeypatch):
    """Cause 3: the new run fails writing its maps (ENOSPC); the old run stays loadable and
    bit-identical, and the error is one line."""
    import safetensors.torch

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    before = tree(scan_run)
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    code, _, err = _scan(cli, tiny, scan_run, "--overwrite", "--seed", 1)
    one_error(code, err, "space")
    monkeypatch.undo()
    assert tree(scan_run) == before
    assert load_run(scan_run).summary["command"] == "scan"
    assert not [p for p in scan_run.parent.iterdir() if p.name.startswith(".")]


def test_an_interrupted_overwrite_keeps_the_old_run(cli, tiny, scan_run, monkeypatch):
    """Cause 3: Ctrl-C in the middle of the new run leaves the old one bit-identical (exit 130)."""
    import poslens.capture.scan.run as scan_mod

    real = scan_mod.forward
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    before = tree(scan_run)
    monkeypatch.setattr(scan_mod, "forward", interrupted)
    code, _, err = _scan(cli, tiny, scan_run, "--overwrite", "--seed", 1, "--batch-size", 1)
    assert code == 130, err
    assert "Traceback" not in err and "--overwrite" in err
    assert tree(scan_run) == before


def test_a_failed_swap_puts_the_old_run_back(tmp_path, monkeypatch):
    """The swap itself failing half-way (a rename refused) moves every file back where it was."""
    import os

    from poslens.errors import PoslensError
    from poslens.rundir.io import _atomic_write_bytes, write_json
    from poslens.rundir.lock import lock_out_dir, unlock_out_dir
    from poslens.rundir.staging import staged_dir

    out = tmp_path / "sim"
    with staged_dir(out) as stage:
        write_json(stage / "config.json", {"command": "simulate"})
        write_json(stage / "summary.json", {"v": 1})
    before = tree(out)
    real = os.replace
    seen = []

    def failing(a, b):
        seen.append(b)
        if len(seen) == 4:  # after the old files went aside and one new file went in
            raise OSError(errno.EIO, "Input/output error")
        return real(a, b)

    lock_out_dir(out, overwrite=True)
    try:
        monkeypatch.setattr(os, "replace", failing)
        with pytest.raises(PoslensError):
            with staged_dir(out) as stage:
                real(stage, stage)  # nothing: keeps the name bound
                _atomic_write_bytes(stage / "config.json", b'{"command": "simulate"}')
                _atomic_write_bytes(stage / "summary.json", b'{"v": 2}')
    finally:
        monkeypatch.undo()
        unlock_out_dir(out)
    assert tree(out) == before


def test_an_interrupted_or_failed_train_overwrite_keeps_the_old_run(cli, tmp_path, monkeypatch):
    """A training run replacing another is written beside it and swapped in at the end: a Ctrl-C or a
    failure half-way leaves the old run bit-identical; a finished one replaces it whole."""
    import poslens.models.train as train_mod

    out = tmp_path / "t"
    args = ("train", "--task", "copy", "--max-len", 4, "--steps", 4, "--preset", "micro", "--batch-size", 4,
            "--eval-examples", 8, "--quiet", "--threads", 1, "--out", out)
    code, _, err = cli(*args)
    assert code == 0, err
    before = tree(out)
    real = train_mod._train_step
    calls = []

    def stops(s):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(s)

    monkeypatch.setattr(train_mod, "_train_step", stops)
    code, _, err = cli(*args, "--overwrite", "--seed", 1)
    assert code == 130 and "--overwrite" in err and "Traceback" not in err, err
    assert tree(out) == before
    calls.clear()

    def fails(s):
        raise RuntimeError("a failure half-way")

    monkeypatch.setattr(train_mod, "_train_step", fails)
    cfg = train_mod.TrainConfig(out=str(out), task="copy", max_len=4, steps=4, preset="micro", batch_size=4,
                                eval_examples=8, progress=False, threads=1, overwrite=True, seed=1)
    with pytest.raises(RuntimeError, match="half-way"):
        train_mod.train_model(cfg)
    assert tree(out) == before
    monkeypatch.undo()
    code, _, err = cli(*args, "--overwrite", "--seed", 1)
    assert code == 0, err
    assert tree(out) != before and (out / "summary.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
