"""``poslens report`` on a ``poslens compare`` run with a real change (B: layer 1's query rows of heads 0
and 1 scaled): the page names both models, carries the readings with their numbers, the table of changed
cells and every figure; :meth:`Result.readings` gives the same sentences."""

from __future__ import annotations

import html
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from archs import compare_pair  # noqa: E402

import poslens  # noqa: E402
from poslens.fmt import fmt  # noqa: E402
from poslens.reporting import render_report  # noqa: E402
from poslens.reporting.readings.compare import compare_readings  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    a, b = compare_pair()
    ids = torch.randint(3, 100, (16, 64), generator=torch.Generator().manual_seed(1))
    out = tmp_path_factory.mktemp("cmp") / "run"
    poslens.compare(a, b, data=ids, seq_len=[32, 64], num_seqs=16, progress=False, threads=1, figures=True,
                    beyond_context=True, out=out)
    return out


def test_report_of_a_compare_run(run_dir):
    r = poslens.load(run_dir)
    s = r.summary
    page = html.unescape(render_report([run_dir]))
    assert s["model_a"] == "tiny_a" and s["model_b"] == "tiny_b"
    assert "tiny_a" in page and "tiny_b" in page
    lines = compare_readings(s)
    assert r.readings() == lines and len(lines) >= 8
    for line in lines:  # every reading on the page, numbers and all
        assert line in page, line
    # the strongest changed cell: entropy of layer 1, head 0 or 1, quoted with its change ± SE
    changed = [c for c in s["changes"] if c["verdict"] == "changed"]
    top = max((c for c in changed if c["head"] is not None and c["seq_len"] == 64), key=lambda c: abs(c["delta"]))
    assert top["reading"] == "entropy" and top["layer"] == 1 and top["head"] in (0, 1)
    quoted = f"{fmt(top['delta'], signed=True)} ± {fmt(top['se'])}"
    assert any(quoted in line for line in lines) and quoted in page
    assert f"layer 1, head {top['head']}" in page
    # the table of changed cells: all of them (fewer than 20), largest against its floor first
    table = next(t for t in s["tables"] if t["name"] == "changes")
    assert len(table["rows"]) == len(changed) == s["changed"]
    ratios = [abs(row[5]) / row[7] for row in table["rows"]]
    assert ratios == sorted(ratios, reverse=True)
    assert fmt(table["rows"][0][5]) in page
    # every figure embedded
    assert page.count('src="data:image/png') >= len(s["figures"]) == 8
    # the loss past the trained context (48 positions) and the lengths past it
    assert s["beyond_context"] == {"32": False, "64": True}
    assert sum("48 positions" in line for line in lines) == 2
