"""Cause: what a run directory says was used unchecked. A bad ``layers`` entry in ``summary.json`` made
``heads()`` blame the maps and ``layers()`` return no rows; a ``seq_len`` of 10^23 made ``report`` run
for ever. Loading a run checks its counts and layers first: one error naming the file and the field."""

from __future__ import annotations

import json

import pytest
import torch
from faultkit import one_error, tree

import poslens
from poslens.errors import PoslensError


@pytest.fixture(scope="module")
def scan_run(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(0))
    poslens.scan(str(tiny), data=ids, progress=False, threads=1, out=out)
    return out


def _damaged(scan_run, tmp_path, change) -> object:
    import shutil

    d = tmp_path / "damaged"
    shutil.copytree(scan_run, d)
    s = json.loads((d / "summary.json").read_text())
    change(s)
    (d / "summary.json").write_text(json.dumps(s))
    return d


@pytest.mark.parametrize("change,field", [
    (lambda s: s["layers"][1].update(layer="one"), "layers"),
    (lambda s: s["layers"][1].update(layer=-1), "layers"),
    (lambda s: s["layers"].append(s["layers"][0]), "layers"),
    (lambda s: s["layers"].__setitem__(0, 7), "layers"),
    (lambda s: s.update(layers={"0": {}}), "layers"),
    (lambda s: s.update(seq_len=99999999999999999999999), "seq_len"),
    (lambda s: s.update(num_seqs=-3), "num_seqs"),
    (lambda s: s.update(seq_len="64"), "seq_len"),
])
def test_a_damaged_summary_is_one_error_naming_the_field(scan_run, tmp_path, change, field):
    d = _damaged(scan_run, tmp_path, change)
    with pytest.raises(PoslensError) as e:
        poslens.load(d).layers()
    msg = str(e.value)
    assert "summary.json" in msg and repr(field) in msg and "\n" not in msg and "maps" not in msg


def test_report_refuses_a_huge_seq_len_at_once(cli, scan_run, tmp_path):
    d = _damaged(scan_run, tmp_path, lambda s: s.update(seq_len=99999999999999999999999))
    before = tree(d)
    code, _, err = cli("report", d, "--out", tmp_path / "report.html")
    one_error(code, err, "summary.json", "seq_len")
    assert tree(d) == before and not (tmp_path / "report.html").exists()
