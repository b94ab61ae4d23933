"""metrics.slash against plain-Python loops over the definitions (arXiv 2601.08297).

SlashScore(d) = mean over queries i >= d of A[i, i - d]; a head's best offset is searched over
the offsets where at least half the queries have a key. Every expected value below is a loop
written here, never a call into poslens.metrics.slash.
"""

import math

import pytest
import torch

from poslens.conventions import SLASH_MAX_DELTA, SLASH_MIN_DELTA
from poslens.metrics.slash import scored_offsets, sink_weight, slash_dominant, slash_profile, top_slash_heads


def brute_offsets(S, lo, hi):
    return [d for d in range(0, S) if d >= lo and (hi is None or d <= hi) and S - d >= math.ceil(S / 2)]


@pytest.mark.parametrize("S", [1, 2, 3, 4, 5, 8, 9, 31, 32, 33, 64])
@pytest.mark.parametrize("lo,hi", [(1, 16), (0, None), (2, 3), (0, 0), (-3, 5), (5, 2)])
def test_scored_offsets_brute_force(S, lo, hi):
    assert list(scored_offsets(S, lo, hi)) == brute_offsets(S, lo, hi)


def test_scored_offsets_defaults():
    assert SLASH_MIN_DELTA == 1 and SLASH_MAX_DELTA == 16
    assert list(scored_offsets(100)) == list(range(1, 17))
    assert list(scored_offsets(9)) == [1, 2, 3, 4]  # 9 - 4 = 5 >= ceil(4.5) = 5; 9 - 5 = 4 < 5


def brute_profile(a):
    S = len(a)
    return [sum(a[i][i - d] for i in range(d, S)) / (S - d) for d in range(S)]


def test_slash_profile_per_subdiagonal_mean_batched():
    gen = torch.Generator().manual_seed(1)
    a = torch.rand(2, 3, 7, 7, generator=gen).tril()
    prof = slash_profile(a)
    assert prof.shape == (2, 3, 7) and prof.dtype == torch.float64
    for i in range(2):
        for h in range(3):
            assert prof[i, h].tolist() == pytest.approx(brute_profile(a[i, h].double().tolist()), rel=1e-12)
    # integer input is read as numbers (mean of ints would fail)
    assert slash_profile(torch.eye(3, dtype=torch.long)).tolist() == [1.0, 0.0, 0.0]


def brute_top(s, k, lo, hi, layer_ids=None):
    L, H, S = len(s), len(s[0]), len(s[0][0])
    offs = brute_offsets(S, lo, hi)
    heads = []
    for l in range(L):
        for h in range(H):
            vals = [(-1.0 if s[l][h][d] != s[l][h][d] else s[l][h][d], d) for d in offs]
            best = max(v for v, _ in vals)
            d = min(d for v, d in vals if v == best)
            uniform = sum(1.0 / (i + 1) for i in range(d, S)) / (S - d)
            heads.append({"layer": layer_ids[l] if layer_ids else l, "head": h, "offset": d, "score": best,
                          "uniform": uniform})
    heads.sort(key=lambda r: -r["score"])
    return heads[:k]


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g["layer"], g["head"], g["offset"]) == (w["layer"], w["head"], w["offset"])
        assert g["score"] == pytest.approx(w["score"], rel=1e-12)
        assert g["uniform"] == pytest.approx(w["uniform"], rel=1e-12)


def test_top_slash_heads_brute_force():
    gen = torch.Generator().manual_seed(2)
    L, H, S = 3, 4, 12
    s = torch.rand(L, H, S, generator=gen, dtype=torch.float64)
    s[1, 2, :] = float("nan")  # a head with no finite score is not listed (it has no SlashScore)
    s[0, 0, 0] = 5.0  # offset 0 is outside the default window: must not win
    s[2, 3, 7] = 4.0  # offset 7 > S - ceil(S/2) = 6: outside the window
    sl = s.tolist()
    scored = [r for r in brute_top(sl, L * H, 1, 16) if (r["layer"], r["head"]) != (1, 2)]
    _same(top_slash_heads(s, k=L * H), scored)
    _same(top_slash_heads(s, k=5), brute_top(sl, 5, 1, 16))
    _same(top_slash_heads(s, k=4, min_offset=0, max_offset=3, layer_ids=[4, 7, 9]),
          brute_top(sl, 4, 0, 3, layer_ids=[4, 7, 9]))
    _same(top_slash_heads(s, k=L * H, min_offset=2, max_offset=None),
          [r for r in brute_top(sl, L * H, 2, None) if (r["layer"], r["head"]) != (1, 2)])
    assert top_slash_heads(s, k=3)[-1]["score"] <= top_slash_heads(s, k=3)[0]["score"]
    assert not [r for r in top_slash_heads(s, k=L * H) if (r["layer"], r["head"]) == (1, 2)]
    assert top_slash_heads(s[:, :, :1], k=3) == []  # S = 1: no offset can be scored


def test_top_slash_heads_uniform_is_causal_uniform_slash_score():
    # uniform causal attention's own profile: the reported "uniform" is its SlashScore at the offset
    S = 10
    a = [[1.0 / (i + 1) if j <= i else 0.0 for j in range(S)] for i in range(S)]
    prof = brute_profile(a)
    s = torch.zeros(1, 1, S, dtype=torch.float64)
    s[0, 0, 3] = 1.0
    (r,) = top_slash_heads(s, k=1)
    assert r["offset"] == 3 and r["uniform"] == pytest.approx(prof[3], rel=1e-12)


def test_slash_dominant_threshold_inclusive():
    s = torch.tensor([[[0.0, 0.5, 0.2], [0.0, 0.49, 0.9]]])
    assert slash_dominant(s, 0.5, 1).tolist() == [[True, False]]
    assert slash_dominant(s, 0.2, 2).tolist() == [[True, True]]


def test_sink_weight_loop():
    gen = torch.Generator().manual_seed(3)
    p = torch.rand(2, 5, 6, 6, generator=gen)
    got = sink_weight(p)
    assert got.shape == (2, 5) and got.dtype == torch.float64
    for b in range(2):
        for h in range(5):
            want = sum(float(p[b, h, i, 0]) for i in range(1, 6)) / 5
            assert float(got[b, h]) == pytest.approx(want, rel=1e-6)
    assert sink_weight(torch.ones(3, 2, 2)).tolist() == [1.0, 1.0, 1.0]
    one = sink_weight(torch.ones(4, 1, 1))
    assert one.shape == (4,) and bool(one.isnan().all())


def test_lists_are_read_as_float64_and_defaults():
    # a Python list of scores is read in float64 directly (0.1 stays 0.1, not float32's 0.100000001)
    s = [[[0.0, 0.1, 0.3, 0.2, 0.0, 0.0, 0.0, 0.0]]]
    (top,) = top_slash_heads(s, k=1)
    assert top["score"] == 0.3 and top["offset"] == 2
    assert slash_profile([[0.1, 0.0], [0.3, 0.7]]).tolist() == [(0.1 + 0.7) / 2, 0.3]
    assert sink_weight([[1.0, 0.0], [0.1, 0.9]]).tolist() == 0.1
    # k = 10 heads by default
    many = torch.rand(3, 5, 40, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert len(top_slash_heads(many)) == 10


def test_sink_weight_keeps_every_leading_dimension():
    p = torch.rand(2, 1, 3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = sink_weight(p)
    assert got.shape == (2, 1)
    for b in range(2):
        assert float(got[b, 0]) == pytest.approx((float(p[b, 0, 1, 0]) + float(p[b, 0, 2, 0])) / 2)
    short = sink_weight(torch.ones(2, 3, 1, 1))
    assert short.dtype == torch.float64 and short.shape == (2, 3) and bool(short.isnan().all())
