"""The slash analysis' pure functions (SDH table, persistence, best offsets, rank table, rank-one
RoPE logit, predicted profile) against plain loops over their definitions (arXiv 2601.08297)."""

import cmath
import math

import pytest
import torch

from poslens.errors import PoslensError
from poslens.metrics.rank import rank_table, top_direction
from poslens.metrics.ropefit import causal_pair_mean, pair_polar, predicted_slash_profile, rank_one_logit
from poslens.metrics.slash import best_offsets, kv_head_of, persistence, sdh_table, slash_dominant


def slash(seed, L=3, H=4, S=6):
    return torch.rand(L, H, S, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_slash_dominant_and_sdh_table_loop():
    s = slash(0)
    s[1, 2, 3] = 0.5  # exactly kappa: dominant
    L, H, S = s.shape
    assert slash_dominant(s, 0.5, 3).tolist() == [[bool(s[l, h, 3] >= 0.5) for h in range(H)] for l in range(L)]
    with pytest.raises(PoslensError):
        slash_dominant(s, 0.5, S)
    with pytest.raises(PoslensError):
        slash_dominant(s, 0.5, -1)
    with pytest.raises(PoslensError):
        sdh_table(s[0], [0.5], max_delta=3)  # the table needs [layers, heads, S]
    kappas = [0.3, 0.5, 0.9]
    t = sdh_table(s, kappas, max_delta=10, min_delta=1, layer_ids=[2, 5, 7], max_listed=2)
    rows = iter(t["rows"])
    assert t["counts"].shape == (3, S - 1)
    for a, kappa in enumerate(kappas):
        for b, d in enumerate(range(1, S)):  # max_delta is capped at S - 1
            heads = [(float(s[l, h, d]), f"{[2, 5, 7][l]}.{h}") for l in range(L) for h in range(H)
                     if s[l, h, d] >= kappa]
            heads.sort(reverse=True)
            listed = " ".join(n for _, n in heads[:2]) + (" ..." if len(heads) > 2 else "")
            assert next(rows) == [kappa, d, len(heads), len(heads) / (L * H), listed]
            assert int(t["counts"][a, b]) == len(heads)
    assert next(rows, None) is None
    t0 = sdh_table(s, [0.9], max_delta=2)
    assert [r[1] for r in t0["rows"]] == [0, 1, 2]
    with pytest.raises(PoslensError):
        sdh_table(s, [0.5], max_delta=1, min_delta=2)
    assert sdh_table(s, [0.5], max_delta=2, min_delta=2)["counts"].shape == (1, 1)


def test_persistence_loop():
    a, b = slash(1), slash(2)
    a[0, 1, 2] = 0.6
    b[0, 1, 2] = 0.6  # random score exactly kappa: persists
    a[2, 3, 1] = 0.0
    kappa = 0.6
    got = persistence(a, b, kappa, max_delta=4, min_delta=1, layer_ids=[3, 4, 8])
    want = []
    for d in range(1, 5):
        for l in range(3):
            for h in range(4):
                if a[l, h, d] >= kappa:
                    si, sr = float(a[l, h, d]), float(b[l, h, d])
                    want.append({"layer": [3, 4, 8][l], "head": h, "delta": d, "score_in": si, "score_random": sr,
                                 "ratio": sr / si, "persists": sr >= kappa})
    want.sort(key=lambda r: -r["score_in"])
    assert got == want
    assert any(r["persists"] for r in got) and not all(r["persists"] for r in got)
    # kappa 0 lists heads with score 0: their ratio is undefined
    zero = [r for r in persistence(a, b, 0.0, max_delta=1) if r["score_in"] == 0.0]
    assert zero and zero[0]["ratio"] is None
    # the random scan may be shorter: offsets stop at the shorter one
    assert max(r["delta"] for r in persistence(a, b[..., :3], 0.0, max_delta=10)) == 2
    assert min(r["delta"] for r in persistence(a, b, 0.0, max_delta=10, min_delta=0)) == 0
    with pytest.raises(PoslensError):
        persistence(a, b[:, :2], kappa, 3)


def test_best_offsets_loop():
    s = slash(3)
    s[0, 0, :] = float("nan")
    for lo, hi in ((0, None), (1, 3), (2, 100)):
        off, score = best_offsets(s, lo, hi)
        top = s.shape[-1] - 1 if hi is None else min(hi, s.shape[-1] - 1)
        for l in range(3):
            for h in range(4):
                vals = [(-1.0 if math.isnan(float(s[l, h, d])) else float(s[l, h, d]), d) for d in range(lo, top + 1)]
                v, d = max(vals)
                if all(math.isnan(float(s[l, h, d])) for d in range(lo, top + 1)):  # no finite score: NaN
                    assert math.isnan(float(score[l, h]))
                else:
                    assert float(score[l, h]) == v
                assert int(off[l, h]) == (lo if math.isnan(float(s[l, h, 0])) else d)


def test_kv_head_of_grouping():
    # 8 query heads over 2 KV heads: heads 0-3 read KV head 0, 4-7 read KV head 1
    assert [kv_head_of(h, 8, 2) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [kv_head_of(h, 6, 6) for h in range(6)] == list(range(6))


def _diag(vals):
    return torch.diag(torch.tensor(vals, dtype=torch.float64))


def test_rank_table_maps_query_heads_to_their_kv_head():
    L, H, Hk, D = 2, 4, 2, 3
    q = torch.stack([torch.stack([_diag([1.0 + h, 1.0, 1.0]) for h in range(H)]) for _ in range(L)])
    k = torch.stack([torch.stack([_diag([1.0, 0.0, 0.0]), _diag([1.0, 1.0, 1.0])]) for _ in range(L)])
    t = rank_table(q, k)
    assert set(t) == {f"{w}_{m}" for w in "qk" for m in ("top1_energy", "effective_rank", "n95")}
    for l in range(L):
        for h in range(H):
            assert float(t["q_top1_energy"][l, h]) == pytest.approx((1.0 + h) / (3.0 + h))
            kv = h // 2
            assert float(t["k_top1_energy"][l, h]) == pytest.approx([1.0, 1 / 3][kv])
            assert float(t["k_effective_rank"][l, h]) == pytest.approx([1.0, 3.0][kv])
            assert int(t["k_n95"][l, h]) == [1, 3][kv]
    for bad in ((q[0], k), (q, k[0]), (q, k[..., :2, :2]), (q, torch.cat([k, k[:, :1]], 1))):
        with pytest.raises(PoslensError):
            rank_table(*bad)


def test_top_direction_and_pair_polar():
    v = torch.tensor([3.0, 0.0, 4.0, 0.0], dtype=torch.float64) / 5
    g = 7.0 * torch.outer(v, v) + 0.1 * torch.eye(4, dtype=torch.float64)
    g[0, 1] += 0.05  # an antisymmetric part: ignored
    g[1, 0] -= 0.05
    u, lam = top_direction(g)
    assert lam == pytest.approx(7.1, rel=1e-12)
    assert abs(float(u @ v)) == pytest.approx(1.0, rel=1e-12)
    assert top_direction(-torch.eye(2))[1] == 0.0  # eigenvalues clamped at 0
    # pairs (l, l + r/2) of a rotary prefix r = 4 inside head_dim 6
    w = torch.tensor([[1.0, -2.0, 0.0, 2.0, 9.0, 9.0]])
    mag, ang = pair_polar(w, 4)
    for l, (re_, im_) in enumerate([(1.0, 0.0), (-2.0, 2.0)]):
        z = complex(re_, im_)
        assert float(mag[0, l]) == pytest.approx(abs(z)) and float(ang[0, l]) == pytest.approx(cmath.phase(z))
    assert mag.shape == (1, 2)


def test_rank_one_logit_and_causal_pair_mean():
    A, phi, theta = [2.0, 0.5], [0.3, -1.0], [1.0, 0.1]
    offs = [0, 1, 5]
    got = rank_one_logit(A, phi, theta, offs)
    for n, d in enumerate(offs):
        assert float(got[n]) == pytest.approx(sum(a * math.cos(t * d + p) for a, p, t in zip(A, phi, theta)))
    S = 5
    vals = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0], dtype=torch.float64)
    pairs = [(i, j) for i in range(S) for j in range(i + 1)]
    want = sum(float(vals[i - j]) for i, j in pairs) / len(pairs)
    assert float(causal_pair_mean(vals, S)) == pytest.approx(want, rel=1e-14)
    assert causal_pair_mean(torch.stack([vals, 2 * vals]), S).tolist() == pytest.approx([want, 2 * want])


def test_predicted_profile_is_the_causal_softmax_loop():
    z = [0.5, 2.0, -1.0, 0.0, 1.5, 0.2]
    S = len(z)
    A = [[0.0] * S for _ in range(S)]
    for i in range(S):
        e = [math.exp(z[i - j]) for j in range(i + 1)]
        for j in range(i + 1):
            A[i][j] = e[j] / sum(e)
    want = [sum(A[i][i - d] for i in range(d, S)) / (S - d) for d in range(S)]
    assert predicted_slash_profile(z).tolist() == pytest.approx(want, rel=1e-12)
    assert predicted_slash_profile(z, 4).tolist() == pytest.approx(
        [sum(A[i][i - d] for i in range(d, 4)) / (4 - d) for d in range(4)], rel=1e-12)


def _rotate(x, p, theta):
    """Explicit rotate_half RoPE of one vector at position p: pair (l, l + r/2) turned by theta_l p."""
    h = len(theta)
    out = list(x)
    for l in range(h):
        c, s = math.cos(theta[l] * p), math.sin(theta[l] * p)
        out[l], out[l + h] = x[l] * c - x[l + h] * s, x[l] * s + x[l + h] * c
    return out


@pytest.mark.parametrize("coef", [1.7, -0.6, 0.05])  # 0.05: a magnitude and a fitted coefficient below 1
def test_rope_decomposition_of_an_exactly_rank_one_head(coef):
    """q_i = u, k_j = coef * v at every position: the logit depends on i - j alone and is known
    exactly from explicit rotations; the decomposition must reproduce it (sign included), coherence 1,
    pair fit 1, and the causal-softmax profile of that logit."""
    from poslens.metrics.ropefit import rope_decomposition

    D, S, base, scaling = 8, 12, 10.0, 0.5
    gen = torch.Generator().manual_seed(6)
    u = torch.randn(D, generator=gen, dtype=torch.float64)
    v = torch.randn(D, generator=gen, dtype=torch.float64)
    k = coef * v
    theta = [base ** (-2 * l / D) for l in range(D // 2)]
    q_rot = [_rotate(u.tolist(), p, theta) for p in range(S)]
    k_rot = [_rotate(k.tolist(), p, theta) for p in range(S)]
    true_logit = [scaling * sum(a * b for a, b in zip(q_rot[d], k_rot[0])) for d in range(S)]
    pairs = [(i, j) for i in range(S) for j in range(i + 1)]
    dim_logit = torch.tensor([sum(scaling * q_rot[i][c] * k_rot[j][c] for i, j in pairs) / len(pairs)
                              for c in range(D)], dtype=torch.float64)
    dec = rope_decomposition(torch.outer(u, u), torch.outer(k, k), dim_logit, rotary_dim=D, base=base,
                             scaling=scaling, seq_len=S)
    assert dec.logit.tolist() == pytest.approx(true_logit, rel=1e-9, abs=1e-12)
    # the sign is that of a·b relative to the (arbitrary) signs of the two eigenvectors: the logit above
    # already checks it; flipping the observed dim_logit must flip it
    flipped = rope_decomposition(torch.outer(u, u), torch.outer(k, k), -dim_logit, rotary_dim=D, base=base,
                                 scaling=scaling, seq_len=S)
    assert flipped.sign == -dec.sign and flipped.logit.tolist() == pytest.approx([-x for x in true_logit], rel=1e-9)
    # constant coefficients: coherence = pair fit = 1 (against the sign-folded prediction), whatever the
    # arbitrary signs of the eigenvectors
    assert dec.coherence == pytest.approx(1.0, rel=1e-9) and dec.pair_fit == pytest.approx(1.0, rel=1e-9)
    assert flipped.coherence == pytest.approx(1.0, rel=1e-9) and flipped.pair_fit == pytest.approx(1.0, rel=1e-9)
    # a rotary module that multiplies cos and sin by 1.5 (YaRN-style attention scaling) scales q and k by
    # 1.5 each: the logit (and the observed dim_logit) by 1.5^2
    scaled = rope_decomposition(torch.outer(u, u), torch.outer(k, k), 2.25 * dim_logit, rotary_dim=D, base=base,
                                scaling=scaling, seq_len=S, attention_scaling=1.5)
    assert scaled.logit.tolist() == pytest.approx([2.25 * x for x in true_logit], rel=1e-9, abs=1e-12)
    assert scaled.coherence == pytest.approx(1.0, rel=1e-9)
    A = [[0.0] * S for _ in range(S)]
    for i in range(S):
        e = [math.exp(true_logit[i - j]) for j in range(i + 1)]
        for j in range(i + 1):
            A[i][j] = e[j] / sum(e)
    want = [sum(A[i][i - d] for i in range(d, S)) / (S - d) for d in range(S)]
    assert dec.profile.tolist() == pytest.approx(want, rel=1e-9)
    # band shares of sum A_l and each band's lift of the peak above its own mean over offsets
    amp = [scaling * abs(coef) * math.hypot(u[l], u[l + D // 2]) * math.hypot(v[l], v[l + D // 2])
           for l in range(D // 2)]
    assert dec.A.tolist() == pytest.approx(amp, rel=1e-9)
    usage = dec.band_usage()
    for b in ("high", "medium", "low"):
        assert usage[b] == pytest.approx(sum(a for a, lab in zip(amp, dec.bands) if lab == b) / sum(amp), abs=1e-12)
    peak = int(max(range(S), key=lambda d: want[d]))
    contrib = dec.band_peak_contribution(peak)
    assert sum(contrib.values()) == pytest.approx(true_logit[peak] - sum(true_logit) / S, rel=1e-9, abs=1e-12)


def test_rope_decomposition_rejects_rotary_dims_that_do_not_fit():
    from poslens.metrics.ropefit import rope_decomposition

    D = 8
    gen = torch.Generator().manual_seed(7)
    u, v, dl = (torch.randn(D, generator=gen, dtype=torch.float64) for _ in range(3))
    args = dict(base=10.0, scaling=1.0, seq_len=6)
    for r in (0, 1, 3, D + 2):  # below 2, odd, wider than head_dim
        with pytest.raises(PoslensError):
            rope_decomposition(torch.outer(u, u), torch.outer(v, v), dl, rotary_dim=r, **args)
    assert rope_decomposition(torch.outer(u, u), torch.outer(v, v), dl, rotary_dim=2, **args).A.shape == (1,)


def test_rope_decomposition_without_rotary_signal():
    """Top directions outside a rotary prefix of 4 (dims 4..7 are not rotated): no pair carries them, so
    the amplitudes and the logit are 0, the fitted coefficient 0 (sign +1 by convention, coherence 0)
    and the pair fit undefined. Keys that are all zero: no magnitude, so no coherence either."""
    from poslens.metrics.ropefit import rope_decomposition

    D = 8
    e = torch.zeros(D, dtype=torch.float64)
    e[5] = 1.0
    dl = torch.arange(D, dtype=torch.float64)
    dec = rope_decomposition(2 * torch.outer(e, e), 3 * torch.outer(e, e), dl, rotary_dim=4, base=10.0, scaling=1.0,
                             seq_len=6)
    assert dec.A.tolist() == [0.0, 0.0] and float(dec.logit.abs().max()) == 0.0
    assert dec.sign == 1 and dec.coherence == 0.0 and dec.pair_fit is None
    gen = torch.Generator().manual_seed(8)
    u = torch.randn(D, generator=gen, dtype=torch.float64)
    none = rope_decomposition(torch.outer(u, u), torch.zeros(D, D, dtype=torch.float64), dl, rotary_dim=D, base=10.0,
                              scaling=1.0, seq_len=6)
    assert none.coherence is None and float(none.A.abs().max()) == 0.0


def test_band_contributions_with_empty_bands():
    """Every pair in the low band: the high and medium bands contribute exactly 0 and use no amplitude;
    the low band's lift of offset 2 over the mean is the explicit cosine sum."""
    from poslens.metrics.ropefit import RopeDecomposition

    S = 6
    A, phi, theta = [2.0, 0.5], [0.3, -1.0], [0.01, 0.002]
    dec = RopeDecomposition(A=torch.tensor(A, dtype=torch.float64), phi=torch.tensor(phi, dtype=torch.float64),
                            theta=torch.tensor(theta, dtype=torch.float64), bands=["low", "low"], sign=1,
                            coherence=None, pair_fit=None, logit=torch.zeros(S, dtype=torch.float64),
                            profile=torch.zeros(S, dtype=torch.float64))
    c = [sum(a * math.cos(t * d + p) for a, p, t in zip(A, phi, theta)) for d in range(S)]
    got = dec.band_peak_contribution(2)
    assert set(got) == {"high", "medium", "low"}
    assert got["high"] == 0.0 and got["medium"] == 0.0 and got["low"] == pytest.approx(c[2] - sum(c) / S, rel=1e-12)
    assert dec.band_usage() == {"high": 0.0, "medium": 0.0, "low": 1.0}
