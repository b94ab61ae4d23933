"""Cause: a run directory's ``maps.safetensors`` that is a folder reached safetensors' reader
(``IsADirectoryError``) in ``poslens.load`` and ``poslens report``. The run is refused in one line naming the
file, and the report writes nothing."""

from __future__ import annotations

import os

import pytest
import torch

import poslens
from poslens.errors import PoslensError

from faultkit import one_error


def test_a_maps_folder_is_one_line_in_load_and_report(cli, tiny, tmp_path):
    run = tmp_path / "run"
    poslens.scan(str(tiny), data=torch.randint(3, 60, (2, 8)), progress=False, threads=1, out=run)
    os.remove(run / "maps.safetensors")
    os.mkdir(run / "maps.safetensors")
    with pytest.raises(PoslensError, match="maps.safetensors is not a file") as e:
        poslens.load(run)
    assert "\n" not in str(e.value)
    code, _, err = cli("report", run, "--out", tmp_path / "r.html")
    one_error(code, err, "maps.safetensors", "not a file")
    assert not (tmp_path / "r.html").exists()
