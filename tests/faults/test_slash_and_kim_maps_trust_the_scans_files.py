"""Cause: ``slash`` and ``kim-maps`` read a scan's ``maps.safetensors`` as written: a file cut short gave
a SafetensorError traceback, maps of the wrong shape an IndexError. Each is one line naming the file
and saying to scan again, and nothing is written."""

from __future__ import annotations

import shutil

import pytest
from faultkit import SCAN, one_error, tree


@pytest.fixture(scope="module")
def scan_run(tiny, tmp_path_factory):
    from tests.conftest import run_cli

    out = tmp_path_factory.mktemp("scan") / "s"
    code, _, err = run_cli("scan", tiny, "--out", out, *SCAN)
    assert code == 0, err
    return out


def _truncated(d):
    f = d / "maps.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _wrong_shape(d):
    from safetensors.torch import load_file, save_file

    f = d / "maps.safetensors"
    maps = load_file(str(f))
    maps["slash"] = maps["slash"][:, :1].contiguous()  # one head where the other maps have two or more
    maps["scores"] = maps["scores"][:, :3].contiguous()
    save_file(maps, str(f))


@pytest.mark.parametrize("damage", [_truncated, _wrong_shape])
@pytest.mark.parametrize("command", ["slash", "kim-maps"])
def test_a_damaged_scan_is_one_line_naming_the_file(cli, scan_run, tmp_path, damage, command):
    d = tmp_path / "damaged"
    shutil.copytree(scan_run, d)
    damage(d)
    before = tree(d)
    out = tmp_path / "out"
    code, _, err = cli(command, d, "--out", out, "--no-figures", "--quiet")
    one_error(code, err, "maps.safetensors", "scan again")
    assert tree(d) == before and not out.exists()
