"""The figures of ``poslens compare`` on a run with a real change (B: layer 1's query rows of heads 0 and 1
scaled): every PNG is written and non-empty, the change maps colour exactly the changed cells (the rest
grey) on symmetric limits, and :meth:`CompareResult.plot` draws each figure or names the valid choices."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from archs import compare_pair  # noqa: E402

import poslens  # noqa: E402
from poslens.analysis.compare.figures import change_matrix, compare_figures  # noqa: E402
from poslens.analysis.compare.readings import HEAD_READINGS  # noqa: E402
from poslens.errors import PoslensError  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    a, b = compare_pair()
    ids = torch.randint(3, 100, (16, 64), generator=torch.Generator().manual_seed(1))
    out = tmp_path_factory.mktemp("cmp") / "run"
    poslens.compare(a, b, data=ids, seq_len=[32, 64], num_seqs=16, progress=False, threads=1, figures=True,
                    beyond_context=True, out=out)
    return poslens.load(out)


def test_every_figure_is_written(run):
    files = [f["file"] for f in run.summary["figures"]]
    assert files == ["compare_layers.png", *(f"compare_change_{r}.png" for r in HEAD_READINGS), "compare_lengths.png",
                     "compare_loss.png"]
    for f in files:
        data = (run.path / f).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, f


def test_change_map_colours_exactly_the_changed_cells(run):
    changed_somewhere = 0
    for reading in HEAD_READINGS:
        df = run.changes(reading, seq_len=64)
        cells = df[df["head"].notna()]
        want = np.ones((2, 4), dtype=bool)  # masked (grey) unless changed
        delta = np.full((2, 4), np.nan)
        for _, c in cells.iterrows():
            want[int(c["layer"]), int(c["head"])] = c["verdict"] != "changed"
            delta[int(c["layer"]), int(c["head"])] = c["delta"]
        fig = run.plot("change", reading)
        im = fig.axes[0].images[-1]  # the coloured layer, drawn over the grey one
        arr = im.get_array()
        assert np.array_equal(np.ma.getmaskarray(arr), want), reading
        assert np.array_equal(np.ma.getmaskarray(change_matrix(run.summary, reading, 64)), want)
        np.testing.assert_allclose(arr.compressed(), delta[~want])
        lo, hi = im.get_clim()
        assert lo == -hi and hi == pytest.approx(np.nanmax(np.abs(delta)))
        assert im.get_cmap().name == "RdBu_r"
        changed_somewhere += int((~want).sum())
    # the scaled queries sharpen layer 1's heads 0 and 1: their entropy changes, layer 0 keeps everything
    ent = np.ma.getmaskarray(change_matrix(run.summary, "entropy", 64))
    assert not ent[1, 0] and not ent[1, 1] and ent[0].all()
    assert changed_somewhere >= 2


def test_lengths_figure_needs_two_lengths(run, tmp_path):
    one = dict(run.summary, seq_lens=[64], changes=[r for r in run.summary["changes"] if r["seq_len"] == 64])
    files = compare_figures(one, {}, tmp_path)
    assert "compare_lengths.png" not in files and "compare_loss.png" in files
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)


def test_plot_draws_each_figure_and_names_the_valid_choices(run):
    from poslens.figures import NotebookFigure
    from poslens.rundir.figures import new_figure

    for name, reading in (("layers", "relativity"), ("lengths", "loss"), ("lengths", "sink"), ("loss", "sink")):
        fig = run.plot(name, reading)
        assert isinstance(fig, NotebookFigure) and fig.axes[0].lines, (name, reading)
    own, ax = new_figure()
    assert run.plot("change", "entropy", seq_len=32, ax=ax) is own
    with pytest.raises(PoslensError, match="change, layers, lengths, loss"):
        run.plot("heads")
    with pytest.raises(PoslensError, match="sink, slash, prev_token, entropy, distance"):
        run.plot("change", "relativity")
    with pytest.raises(PoslensError, match="lengths 32, 64"):
        run.plot("change", "sink", seq_len=128)
