"""Results that must not go silently wrong: all-NaN slash maps list no slash head (no "SlashScore -1"), and
maps of the wrong shape are one error naming the file, not an IndexError."""

from __future__ import annotations

import pytest
import torch

import poslens
from poslens.errors import PoslensError
from poslens.metrics.slash import best_offsets, top_slash_heads
from poslens.reporting.readings.slash import slash_readings, slash_top


def test_all_nan_slash_maps_name_no_head():
    s = torch.full((2, 3, 8), float("nan"))
    assert top_slash_heads(s) == []
    off, score = best_offsets(s, 1, 4)
    assert bool(score.isnan().all())
    s[1, 2, 3] = 0.4  # one finite score: the only head listed
    assert [(t["layer"], t["head"], t["offset"]) for t in top_slash_heads(s)] == [(1, 2, 3)]
    # a summary written with the old fill value (-1) reads as no slash head at all
    summary = {"seq_len": 8, "slash_heads": [{"layer": 0, "head": 0, "offset": 1, "score": -1.0}], "layers": []}
    assert slash_top(summary) is None
    assert not any("-1" in line for line in slash_readings(summary))


def test_maps_of_the_wrong_shape_are_one_error(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    ids = torch.randint(3, 60, (4, 16), generator=torch.Generator().manual_seed(0))
    r = poslens.scan(str(tiny), data=ids, stats="probs,slash", progress=False, threads=1, out=tmp_path / "r")
    f = tmp_path / "r" / "maps.safetensors"
    maps = load_file(str(f))
    maps["slash"] = maps["slash"][:, :2].contiguous()  # two heads where the summary says four
    save_file(maps, str(f))
    with pytest.raises(PoslensError, match="maps.safetensors.*slash"):
        poslens.load(tmp_path / "r").heads()
    assert r is not None
