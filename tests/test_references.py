"""Independent references for the metrics and the readings' judges.

Every expected value here is computed by a plain loop written for the test (a pure-Python triple
count, an explicit per-diagonal loop, hand-labelled rotary pairs) or by hand, never by the code
under test. Inputs are sized so that the chunked paths run over several chunks, heads are grouped
as in grouped-query attention, and every reading is given numbers on both sides of its threshold.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from poslens.metrics.rank import rank_table
from poslens.metrics.slash import kv_head_of, persistence
from poslens.metrics.diagonal import (describe_map, diagonal_trend, is_flat, locality, relativity_index,
                                      within_diagonal_rms)
from poslens.metrics.neighborhood import (adjacency_probability_score, norm_score, per_sequence_aps,
                                          rising_pair_fraction)
from poslens.metrics.rank import band_contributions
from poslens.metrics.slash import slash_profile
from poslens.metrics.judge.papers import judge_kim, judge_slash
from poslens.metrics.verdicts import uniform_slash
from poslens.reporting.readings.slash import slash_top
from poslens.rope import frequency_bands
from references import brute_cos_aps, brute_rising


# --------------------------------------------------------------------------------------------
# brute-force references (pure Python over nested lists)
# --------------------------------------------------------------------------------------------
def brute_relativity(m, exclude_keys=()):
    """1 - var(entries minus their diagonal's mean) / var(entries) over i > j, excluded keys left out."""
    S = len(m)
    entries = [(i, j, m[i][j]) for i in range(S) for j in range(i) if j not in exclude_keys]
    mean = sum(v for _, _, v in entries) / len(entries)
    var_map = sum((v - mean) ** 2 for _, _, v in entries) / len(entries)
    diag = {}
    for i, j, v in entries:
        diag.setdefault(i - j, []).append(v)
    dmean = {k: sum(v) / len(v) for k, v in diag.items()}
    var_dn = sum((v - dmean[i - j]) ** 2 for i, j, v in entries) / len(entries)
    return min(max(1 - var_dn / var_map, 0.0), 1.0)


def brute_diagonal_trend(m):
    """(#pairs where the entry further right on its diagonal is higher - #lower) / #pairs, i > j."""
    S = len(m)
    up = down = total = 0
    for k in range(1, S):
        vals = [m[t + k][t] for t in range(S - k)]
        for a, b in itertools.combinations(vals, 2):
            total += 1
            up += b > a
            down += b < a
    return (up - down) / total


def _rand(shape, seed, dtype=torch.float64):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --------------------------------------------------------------------------------------------
# APS / locality / rising pairs: multi-chunk, batched, ties, masked keys
# --------------------------------------------------------------------------------------------
def test_rising_pair_fraction_over_many_chunks_matches_triple_count():
    B, T = 3, 19
    m = _rand((B, T, T), 0)
    m[1, :, :] = (m[1] * 4).round() / 4  # ties
    m[2, :, 0] = float("nan")  # a masked key column
    chunk = B * T * T * 2  # two rows per chunk: ten chunks
    for diag, ties in ((False, 0.0), (True, 0.0), (False, 0.5)):
        got = rising_pair_fraction(m, include_diagonal=diag, ties=ties, chunk_elems=chunk)
        want = [brute_rising(m[b].tolist(), diag, ties) for b in range(B)]
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-14)
        one_chunk = rising_pair_fraction(m, include_diagonal=diag, ties=ties)
        np.testing.assert_allclose(one_chunk.numpy(), want, rtol=0, atol=1e-14)


def test_aps_merge_count_and_masked_path_match_triple_count():
    m = _rand((2, 37), 1)[..., None].expand(2, 37, 37).clone() + _rand((2, 37, 37), 2)  # above 32: padding
    got = adjacency_probability_score(m)
    want = [brute_rising(m[b].tolist()) for b in range(2)]
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-14)
    q = (m * 3).round()  # heavy ties: APS counts ties as 0
    np.testing.assert_allclose(adjacency_probability_score(q).numpy(), [brute_rising(q[b].tolist()) for b in range(2)],
                               rtol=0, atol=1e-14)
    q[:, 5:, 3] = float("nan")  # masked entries: the other path
    np.testing.assert_allclose(adjacency_probability_score(q).numpy(), [brute_rising(q[b].tolist()) for b in range(2)],
                               rtol=0, atol=1e-14)


def test_aps_of_hand_made_maps():
    # each row rises towards the diagonal: APS 1; falls: 0
    T = 6
    rising = [[float(j) for j in range(T)] for _ in range(T)]
    assert float(adjacency_probability_score(torch.tensor(rising))) == 1.0
    assert float(adjacency_probability_score(-torch.tensor(rising))) == 0.0
    # T = 3: one triple (0, 1, 2); m[2, 1] > m[2, 0]
    m = torch.zeros(3, 3)
    m[2, 1], m[2, 0] = 0.3, 0.2
    assert float(adjacency_probability_score(m)) == 1.0
    m[2, 1] = 0.1
    assert float(adjacency_probability_score(m)) == 0.0


def test_per_sequence_aps_matches_cosine_and_triple_count():
    B, S, H, D = 3, 23, 2, 4
    x = torch.randn(B, S, H, D, generator=torch.Generator().manual_seed(3))
    got = per_sequence_aps(x, max_positions=9)
    idx = [round(i * (S - 1) / 8) for i in range(9)]
    want = []
    for b in range(B):
        want.append(brute_cos_aps([x[b, p].reshape(-1).tolist() for p in idx]))
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_norm_score_of_shrinking_and_growing_norms():
    assert float(norm_score(torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0]))) == 1.0
    assert float(norm_score(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))) == 0.0
    n = _rand(11, 4)
    want = brute_rising([[-float(v) for v in n]] * 11)
    assert float(norm_score(n)) == pytest.approx(want, abs=1e-14)


def test_locality_is_two_p_minus_one_with_half_ties_and_masked_keys():
    m = (_rand((21, 21), 5) * 5).round()
    got = locality(m)
    assert got == pytest.approx(2 * brute_rising(m.tolist(), ties=0.5) - 1, abs=1e-14)
    mk = m.clone()
    mk[:, 0] = float("nan")
    assert locality(m, exclude_keys=(0,)) == pytest.approx(2 * brute_rising(mk.tolist(), ties=0.5) - 1, abs=1e-14)
    # describe_map on a position subsample uses that subsample for locality
    d = describe_map(m, locality_map=m[:10, :10])
    assert d["locality"] == pytest.approx(2 * brute_rising(m[:10, :10].tolist(), ties=0.5) - 1, abs=1e-14)


# --------------------------------------------------------------------------------------------
# relativity index, diagonal trend, RMS: explicit per-diagonal loops
# --------------------------------------------------------------------------------------------
def test_relativity_index_matches_per_diagonal_loop():
    S = 13
    i = torch.arange(S)
    toeplitz = torch.cos(0.7 * (i[:, None] - i[None, :]).to(torch.float64))
    for seed, w in ((6, 0.1), (7, 0.5), (8, 2.0)):
        m = toeplitz + w * _rand((S, S), seed)
        assert relativity_index(m) == pytest.approx(brute_relativity(m.tolist()), abs=1e-12)
        m[:, 0] += 3.0  # a sink column
        assert relativity_index(m, exclude_keys=(0,)) == pytest.approx(
            brute_relativity(m.tolist(), exclude_keys=(0,)), abs=1e-12)
    # a Toeplitz map with a raised sink column: purely relative once key 0 is excluded
    sink = toeplitz.clone()
    sink[:, 0] += 5.0
    assert relativity_index(sink, exclude_keys=(0,)) == pytest.approx(1.0, abs=1e-12)
    assert relativity_index(sink) < 0.9
    # a map of the key position alone (m[i, j] = j): known closed form, checked by the loop
    col = i[None, :].expand(S, S).to(torch.float64)
    assert relativity_index(col) == pytest.approx(brute_relativity(col.tolist()), abs=1e-12)
    assert relativity_index(torch.ones(S, S)) is None  # flat


def test_relativity_index_with_groups_removes_the_noise_exactly():
    """With group maps both variances come from cross-group products: the reference is the same
    estimator written as explicit loops over group pairs and entries; a Toeplitz map plus
    independent noise per group reads 1 to within 0.02 while the uncorrected index reads < 0.9."""
    S, G = 12, 16
    i = torch.arange(S)
    toeplitz = torch.cos(0.9 * (i[:, None] - i[None, :]).to(torch.float64))
    gen = torch.Generator().manual_seed(1)
    groups = toeplitz + 1.0 * torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    w = torch.ones(G, dtype=torch.float64)
    m = groups.mean(0)
    got = relativity_index(m, groups, w)

    entries = [(a, b) for a in range(S) for b in range(a)]
    dk = {}
    for a, b in entries:
        dk.setdefault(a - b, []).append((a, b))

    def centred(g):
        vals = [float(g[a, b]) for a, b in entries]
        mu = sum(vals) / len(vals)
        return [v - mu for v in vals]

    def within(g):
        dm = {k: sum(float(g[a, b]) for a, b in pos) / len(pos) for k, pos in dk.items()}
        return [float(g[a, b]) - dm[a - b] for a, b in entries]

    def cross(vecs):
        n = len(vecs[0])
        num = sum(sum(x * y for x, y in zip(vecs[p], vecs[q])) / n for p in range(G) for q in range(G) if p != q)
        return num / (G * (G - 1))

    want = 1 - max(cross([within(groups[g]) for g in range(G)]), 0) / cross([centred(groups[g]) for g in range(G)])
    assert got == pytest.approx(min(max(want, 0.0), 1.0), abs=1e-12)
    assert got == pytest.approx(1.0, abs=0.02)  # 0.983 here
    assert relativity_index(m) < 0.9  # 0.887 without the noise correction


def test_diagonal_trend_and_rms_match_loops():
    S = 12
    m = (_rand((S, S), 10) * 4).round()  # ties along diagonals
    assert diagonal_trend(m) == pytest.approx(brute_diagonal_trend(m.tolist()), abs=1e-14)
    i = torch.arange(S, dtype=torch.float64)
    assert diagonal_trend(i[None, :] + 0 * i[:, None]) == 1.0  # m[i, j] = j: further right is higher
    assert diagonal_trend(-i[None, :] + 0 * i[:, None]) == -1.0
    assert diagonal_trend(torch.cos(i[:, None] - i[None, :])) == 0.0  # Toeplitz
    # RMS: sqrt(mean over i > j of (m - its diagonal's mean)^2)
    vals = []
    for k in range(1, S):
        d = [float(m[t + k, t]) for t in range(S - k)]
        mu = sum(d) / len(d)
        vals += [(v - mu) ** 2 for v in d]
    assert within_diagonal_rms(m) == pytest.approx(math.sqrt(sum(vals) / len(vals)), rel=1e-12)


def test_is_flat_needs_decisive_groups():
    S, G = 8, 16
    gen = torch.Generator().manual_seed(11)
    noise = 0.1 * torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    w = torch.ones(G, dtype=torch.float64)
    assert is_flat(noise.mean(0), noise, w)  # pure noise around a constant: flat
    i = torch.arange(S, dtype=torch.float64)
    signal = noise + 0.5 * (i[:, None] - i[None, :])
    assert not is_flat(signal.mean(0), signal, w)
    # seven groups cannot reach p < 0.01: only an exactly constant map is flat then
    assert not is_flat(noise[:7].mean(0), noise[:7], w[:7])
    assert is_flat(torch.full((S, S), 0.3))


# --------------------------------------------------------------------------------------------
# slash profile, GQA mapping, persistence
# --------------------------------------------------------------------------------------------
def test_slash_profile_is_the_mean_of_each_subdiagonal():
    S = 7
    a = _rand((2, S, S), 12)
    got = slash_profile(a)
    for b in range(2):
        for d in range(S):
            vals = [float(a[b, i, i - d]) for i in range(d, S)]
            assert float(got[b, d]) == pytest.approx(sum(vals) / len(vals), abs=1e-15)


def test_uniform_slash_against_uniform_attention_matrix():
    n = 9
    uniform = torch.tril(torch.ones(n, n, dtype=torch.float64)) / torch.arange(1, n + 1, dtype=torch.float64)[:, None]
    prof = slash_profile(uniform)
    for d in range(n):
        assert uniform_slash(n, d) == pytest.approx(float(prof[d]), abs=1e-12)


@pytest.mark.parametrize("H,Hk", [(9, 3), (8, 2), (4, 4), (6, 1)])
def test_kv_head_of_matches_transformers_repeat_kv(H, Hk):
    from transformers.models.llama.modeling_llama import repeat_kv

    k = torch.arange(Hk, dtype=torch.float32).reshape(1, Hk, 1, 1)
    rep = repeat_kv(k, H // Hk)  # the grouping the attention itself uses
    for h in range(H):
        assert kv_head_of(h, H, Hk) == int(rep[0, h, 0, 0])


def test_rank_table_reads_each_query_heads_own_kv_head():
    L, H, Hk, D = 1, 6, 3, 4
    kg = torch.zeros(L, Hk, D, D, dtype=torch.float64)
    for j in range(Hk):  # KV head j has j + 1 equal eigenvalues: top-1 energy 1 / (j + 1)
        kg[0, j, : j + 1, : j + 1] = torch.eye(j + 1)
    qg = torch.eye(D, dtype=torch.float64).expand(L, H, D, D)
    out = rank_table(qg, kg)
    assert out["k_top1_energy"][0].tolist() == pytest.approx([1.0, 1.0, 0.5, 0.5, 1 / 3, 1 / 3])
    assert out["q_top1_energy"][0].tolist() == pytest.approx([0.25] * H)


def test_persistence_is_judged_against_kappa_inclusive():
    # [L=1, H=3, S=4]; κ = 0.5 at Δ = 1 (binary fractions: "exactly κ" is exact in float32)
    s_in = torch.tensor([[[0.0, 0.9, 0.0, 0.0], [0.0, 0.75, 0.0, 0.0], [0.0, 0.625, 0.0, 0.0]]])
    s_rand = torch.tensor([[[0.0, 0.5625, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.4375, 0.0, 0.0]]])
    rows = persistence(s_in, s_rand, kappa=0.5, max_delta=1)
    by_head = {r["head"]: r for r in rows}
    assert [r["head"] for r in rows] == [0, 1, 2]  # sorted by in-distribution score
    # head 0 drops from 0.9 to 0.5625 but stays above κ: persists (judged against κ, not the in-dist. score)
    assert by_head[0]["persists"] is True and by_head[0]["ratio"] == pytest.approx(0.5625 / 0.9)
    assert by_head[1]["persists"] is True  # exactly κ: SlashScore >= κ is dominant
    assert by_head[2]["persists"] is False
    assert persistence(s_in, s_rand, kappa=0.95, max_delta=1) == []


# --------------------------------------------------------------------------------------------
# rotary bands against explicit labels
# --------------------------------------------------------------------------------------------
def test_frequency_bands_thresholds_are_exact():
    ctx = 256
    mid = math.sqrt(2 * math.pi * ctx)
    lam = [0.99 * mid, 1.01 * mid, 1.9 * mid, 0.999 * ctx, 1.0001 * ctx, 2.1 * ctx]
    theta = [2 * math.pi / w for w in lam]
    assert frequency_bands(12, None, ctx, theta=theta) == ["high", "medium", "medium", "medium", "low", "low"]
    # base 10000, r = 8, context 64: wavelengths 2π·10000^(l/4) = 6.28, 62.8, 628, 6283; mid = 20.05
    assert frequency_bands(8, 10000.0, 64) == ["high", "medium", "low", "low"]


def test_band_contributions_count_every_rotary_pair():
    D, r = 12, 8  # partial rotary: dims 8..11 are unrotated
    x = 2.0 ** torch.arange(D, dtype=torch.float64)  # each dim's share identifiable in the sums
    out = band_contributions(x, r, 10000.0, 64)
    # pairs (l, l + 4): l = 0 high, 1 medium, 2 and 3 low
    assert float(out["high"]) == 2**0 + 2**4
    assert float(out["medium"]) == 2**1 + 2**5
    assert float(out["low"]) == 2**2 + 2**6 + 2**3 + 2**7
    assert float(out["unrotated"]) == 2**8 + 2**9 + 2**10 + 2**11
    theta = [2 * math.pi / 10.0, 2 * math.pi / 10.0, 2 * math.pi / 1000.0]  # the model's own frequencies
    out = band_contributions(x[:8], None, None, 64, inv_freq=theta)
    assert float(out["high"]) == 2**0 + 2**3 + 2**1 + 2**4 and float(out["low"]) == 2**2 + 2**5
    assert float(out["medium"]) == 0.0 and float(out["unrotated"]) == 2**6 + 2**7
    assert band_contributions(x, None, None, 64) == {"unrotated": x.sum()}


# --------------------------------------------------------------------------------------------
# readings: each branch with numbers that should and should not trigger it
# --------------------------------------------------------------------------------------------
def _kim(locs, ris=None):
    ris = ris or [0.5] * len(locs)
    return judge_kim([{"layer": i, "relativity_index": r, "locality": v} for i, (r, v) in enumerate(zip(ris, locs))])


def test_kim_judge_locality_sign():
    assert _kim([0.8, 0.31])["locality"]["code"] == "near"
    assert _kim([-0.8, -0.31])["locality"]["code"] == "far"
    assert _kim([0.8, -0.8])["locality"] == {"code": "some", "strong": [0, 1], "layers": [0, 1], "threshold": 0.3}
    for one_weak in ([0.8, 0.1], [-0.8, -0.1]):  # one layer within ±0.3: neither blanket code
        assert _kim(one_weak)["locality"] == {"code": "some", "strong": [0], "layers": [0, 1], "threshold": 0.3}
    assert _kim([0.3, -0.3])["locality"]["code"] == "none"  # |locality| <= 0.3: no trend


def test_kim_judge_relativity_thresholds():
    assert _kim([0.5, 0.5], [0.98, 0.99])["relativity"]["code"] == "relative"
    assert _kim([0.5, 0.5], [0.97, 0.99])["relativity"]["code"] is None
    drop = _kim([0.5, 0.5], [0.99, 0.9])["relativity"]
    assert (drop["code"], drop["first_layer"], drop["drop"], drop["drop_layer"]) == ("drop", 0, 0.9, 1)
    part = _kim([0.5, 0.5], [0.6, 0.95])["relativity"]
    assert part["code"] == "partial" and part["unexplained"] == pytest.approx(0.4)
    flat = judge_kim([{"layer": 0, "relativity_index": None, "locality": None},
                      {"layer": 1, "relativity_index": 0.5, "locality": 0.5}])
    assert flat["flat"] == [0] and flat["live"] == [1]


def _slash_summary(score, n=8, offset=1):
    return {"seq_len": n, "slash_heads": [{"layer": 2, "head": 1, "offset": offset, "score": score}]}


def _slash(summary):
    return judge_slash(summary, slash_top(summary))


def test_slash_judge_ratio_direction():
    n = 8
    base = sum(1.0 / i for i in range(2, n + 1)) / (n - 1)  # uniform causal attention at Δ = 1, by hand
    strong = _slash(_slash_summary(3 * base, n))
    assert strong["code"] == "slash" and strong["head"]["ratio"] == pytest.approx(3)
    weak = _slash(_slash_summary(1.5 * base, n))
    assert weak["code"] == "weak" and weak["head"]["ratio"] == pytest.approx(1.5)
    edge = _slash(_slash_summary(2 * base, n))  # exactly twice uniform: a slash pattern
    assert edge["code"] == "slash"


# --------------------------------------------------------------------------------------------
# the simulator's layer against an explicit loop; the scan summary against its own maps
# --------------------------------------------------------------------------------------------
def _reference_layers(x, layers, theta, scale=1.0):
    """Q = K = RoPE(L2-normalised X) by explicit 2x2 rotations of pairs (l, l + d/2), values unrotated."""
    B, S, d = x.shape
    x = x.to(torch.float64).clone()
    h = d // 2
    scores = []
    for _ in range(layers):
        y = x / x.norm(dim=-1, keepdim=True)
        q = y.clone()
        if theta is not None:
            for p in range(S):
                for l in range(h):
                    ang = p * theta ** (-2 * l / d)
                    c, s = math.cos(ang), math.sin(ang)
                    a, b = y[:, p, l].clone(), y[:, p, l + h].clone()
                    q[:, p, l], q[:, p, l + h] = a * c - b * s, a * s + b * c
        sc = scale * q @ q.transpose(1, 2)
        sc = sc.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
        x = x + torch.softmax(sc, -1) @ y
        scores.append(sc)
    return scores


@pytest.mark.parametrize("rope", [False, True])
def test_simulator_layers_match_explicit_loop(rope):
    from poslens.rope import cos_sin
    from poslens.simulator import SimConfig, forward_layers

    cfg = SimConfig(layers=3, seq_len=6, dim=8, samples=2, rope=rope, rope_theta=100.0).validate()
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    cs = cos_sin(torch.arange(6), 8, 100.0, dtype=torch.float64) if rope else None
    neg = torch.zeros(6, 6, dtype=torch.float64).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    got = [s for s, _ in forward_layers(x, cfg, cs, neg)]
    want = _reference_layers(x, 3, 100.0 if rope else None)
    lower = torch.ones(6, 6, dtype=torch.bool).tril()
    for l in range(3):  # layers 1 and 2 see the values the layers before them added
        torch.testing.assert_close(got[l][:, lower], want[l][:, lower], rtol=0, atol=1e-10)


def test_scan_summary_reads_each_layers_own_cosine_map(tmp_path):
    from safetensors.torch import load_file

    from archs import save_tiny
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan

    model = save_tiny("llama", tmp_path / "m", layers=3)
    run_scan(ScanConfig(model_dir=str(model), out=str(tmp_path / "r"), data="random", seq_len=10, num_seqs=4,
                        batch_size=2), progress=False)
    import json

    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    maps = load_file(tmp_path / "r" / "maps.safetensors")
    cos = maps["cosine"].to(torch.float64)
    assert cos.shape[0] == 4  # embeddings + 3 layers
    layers = summary["layers"]
    assert [l["layer"] for l in layers] == [0, 1, 2]
    mm = [brute_rising(cos[k].tolist()) for k in range(4)]
    assert len(set(round(v, 9) for v in mm)) == 4  # the maps differ, so a wrong index is visible
    for li, l in enumerate(layers):
        assert l["mean_map_aps"] == pytest.approx(mm[li + 1], abs=1e-6)  # output of layer li
    assert summary["embedding_mean_map_aps"] == pytest.approx(mm[0], abs=1e-6)
    seq = maps["aps_seq"].to(torch.float64).reshape(-1)
    for li, l in enumerate(layers):
        assert l["aps_mean"] == pytest.approx(float(seq[li + 1]), abs=1e-6)


def test_main_diagonal_is_excluded_by_default():
    """Every map statistic ignores the main diagonal (a token with itself) unless told otherwise."""
    S = 9
    m = _rand((S, S), 14)
    wild = m.clone()
    wild.diagonal().copy_(100.0 * _rand(S, 15))
    flat = torch.full((S, S), 0.5, dtype=torch.float64)
    flat_wild = flat.clone()
    flat_wild.diagonal().copy_(_rand(S, 16))
    assert is_flat(flat_wild) and not is_flat(flat_wild, include_diagonal=True)
    for f in (relativity_index, locality, diagonal_trend, within_diagonal_rms):
        assert f(wild) == f(m), f.__name__
    assert locality(wild, include_diagonal=True) != locality(m, include_diagonal=True)


def test_rising_pair_fraction_with_a_single_pair():
    m = torch.zeros(3, 3, dtype=torch.float64)
    m[2, 1] = 1.0  # the one pair (j, k) = (0, 1) of row 2 rises
    assert float(rising_pair_fraction(m)) == 1.0
    assert math.isnan(float(rising_pair_fraction(m[:2, :2])))  # no pair at all: NaN


def test_diagonal_trend_se_is_the_jackknife_over_count_weighted_groups():
    from poslens.metrics.diagonal import trend_pvalue

    S, G = 7, 9
    gen = torch.Generator().manual_seed(17)
    groups = torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    counts = torch.tensor([1, 2, 3, 4, 5, 1, 2, 3, 9], dtype=torch.float64)
    mean = (groups * counts[:, None, None]).sum(0) / counts.sum()
    d = describe_map(mean, groups, counts)
    loo = []
    for g in range(G):
        keep = [h for h in range(G) if h != g]
        m = sum(counts[h] * groups[h] for h in keep) / sum(counts[h] for h in keep)
        loo.append(brute_diagonal_trend(m.tolist()))
    mu = sum(loo) / G
    assert d["diagonal_trend_se"] == pytest.approx(math.sqrt((G - 1) / G * sum((v - mu) ** 2 for v in loo)), rel=1e-9)
    # two valid entries (one masked): a p-value, not None
    two = groups[:, :3, :3].clone()
    two[:, 2, 0] = float("nan")
    assert trend_pvalue(two) == 1.0
