"""Cause: a run that failed into a new ``--out`` left it half-written (``.poslens-files.json``,
``config.json``, ``scans/``), so a plain rerun was refused as "not empty". A failed run now removes
what it wrote where ``--out`` was new (an interrupted one keeps its checkpoint for ``--resume``; one
that fails replacing or continuing a run leaves that run alone), and ``train`` on a full disk is one
line, not a SafetensorError traceback."""

from __future__ import annotations

import errno
import sys

import pytest
from faultkit import SCAN, one_error

STAT = '''
import torch
import poslens


class Broken(poslens.Statistic):
    needs = ("probs",)

    def __init__(self):
        self.n = torch.zeros(())

    def add(self, layer, probs):
        raise ValueError("this statistic is broken")

    def merge(self, other): ...
    def state_dict(self): return {"n": self.n}
    def load_state_dict(self, state): self.n = state["n"]
    def result(self): return {"n": self.n}


class Unsaveable(Broken):
    def add(self, layer, probs):
        self.n += 1

    def state_dict(self):
        return {"n": object()}  # a state that cannot be saved
'''


@pytest.fixture
def stats_module(tmp_path, monkeypatch):
    d = tmp_path / "mods"
    d.mkdir()
    (d / "brokenstats.py").write_text(STAT)
    monkeypatch.syspath_prepend(str(d))
    yield "brokenstats"
    sys.modules.pop("brokenstats", None)


def _full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("cls", ["Broken", "Unsaveable"])
def test_a_failing_user_statistic_leaves_no_new_out(cli, tiny, tmp_path, stats_module, cls):
    out = tmp_path / "new"
    code, _, err = cli("scan", tiny, "--out", out, *SCAN, "--stats", f"probs,{stats_module}.{cls}",
                       "--checkpoint-every", "1", "--batch-size", "1")
    assert code != 0 and "Traceback" not in err, err[-2000:]
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))
    code, _, err = cli("scan", tiny, "--out", out, *SCAN)  # a plain rerun is not refused
    assert code == 0, err


def test_a_full_disk_leaves_no_new_out(cli, tiny, tmp_path, monkeypatch):
    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", _full)
    for cmd in ("scan", "fingerprint"):
        out = tmp_path / cmd
        code, _, err = cli(cmd, tiny, "--out", out, *SCAN)
        one_error(code, err, "space")
        assert not out.exists(), (cmd, sorted(p.name for p in out.rglob("*")))
    monkeypatch.undo()
    assert cli("scan", tiny, "--out", tmp_path / "scan", *SCAN)[0] == 0


def test_train_on_a_full_disk_is_one_line_and_leaves_no_new_out(cli, tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    import transformers.modeling_utils

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)  # where save_pretrained writes
    out = tmp_path / "m"
    code, _, err = cli("train", "--out", out, "--pe", "none", "--preset", "tiny", "--task", "copy", "--steps", "2",
                       "--batch-size", "2", "--seq-len", "16", "--eval-every", "0", "--checkpoint-every", "0",
                       "--quiet", "--threads", "1")
    one_error(code, err, "space")
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


def test_an_existing_run_is_left_alone_by_a_failed_resume(cli, tiny, tmp_path, stats_module):
    out = tmp_path / "old"
    assert cli("scan", tiny, "--out", out, *SCAN)[0] == 0
    before = sorted(p.name for p in out.rglob("*"))
    code, _, _ = cli("scan", tiny, "--out", out, *SCAN, "--stats", f"probs,{stats_module}.Broken", "--overwrite")
    assert code != 0
    assert sorted(p.name for p in out.rglob("*")) == before


def test_an_interrupted_train_keeps_its_checkpoint_in_a_new_out(cli, tmp_path, monkeypatch):
    import poslens.models.train as train_mod

    real, calls = train_mod._train_step, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(train_mod, "_train_step", interrupted)
    out = tmp_path / "m"
    code, _, err = cli("train", "--out", out, "--pe", "none", "--preset", "tiny", "--task", "copy", "--steps", "6",
                       "--batch-size", "2", "--eval-every", "0", "--checkpoint-every", "0", "--quiet",
                       "--threads", "1")
    assert code == 130, err[-2000:]
    assert (out / "checkpoint.json").is_file()  # kept for --resume
