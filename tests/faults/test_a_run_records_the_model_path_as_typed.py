"""Cause: a scan's config.json recorded the model's path as typed (``"model_dir": "tiny"``), so ``poslens slash
RUN`` from another directory could not find the model. The resolved path is recorded; a model that has
moved since is named in one line with the fix (``--model-dir``)."""

from __future__ import annotations

import json
import shutil

import pytest

import poslens
from poslens.errors import PoslensError

from faultkit import SCAN, one_error


def test_the_resolved_path_is_recorded_and_read_from_elsewhere(cli, tiny, tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copytree(tiny, tmp_path / "a" / "tiny")
    monkeypatch.chdir(tmp_path / "a")
    code, _, err = cli("scan", "tiny", "--out", "run", *SCAN)
    assert code == 0, err
    recorded = json.loads((tmp_path / "a" / "run" / "config.json").read_text())["options"]["model_dir"]
    assert recorded == str((tmp_path / "a" / "tiny").resolve())
    monkeypatch.chdir(tmp_path / "b")
    code, _, err = cli("slash", "../a/run", "--out", "s", "--quiet", "--no-figures")
    assert code == 0, err
    shutil.move(str(tmp_path / "a" / "tiny"), str(tmp_path / "a" / "moved"))
    code, _, err = cli("slash", "../a/run", "--out", "s2", "--quiet", "--no-figures")
    msg = one_error(code, err, "../a/run", recorded, "moved", "--model-dir")
    assert "model_dir=" not in msg and not (tmp_path / "b" / "s2").exists()
    for scan in (tmp_path / "a" / "run", poslens.load(tmp_path / "a" / "run")):
        with pytest.raises(PoslensError) as e:
            poslens.slash(scan)
        msg = str(e.value)
        assert "\n" not in msg and recorded in msg and "moved" in msg and "model_dir" in msg and "--model-dir" not in msg
    code, _, err = cli("slash", "../a/run", "--out", "s3", "--quiet", "--no-figures", "--model-dir", "../a/moved")
    assert code == 0, err
