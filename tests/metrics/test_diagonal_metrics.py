"""metrics.diagonal against plain loops over the definitions (nested lists, no poslens code).

Maps are [S, S], rows = queries, columns = keys; the valid entries are i > j (i >= j with the
main diagonal); NaN entries and excluded key columns take part in nothing.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from poslens.metrics.diagonal import (diagonal_means, diagonal_normalize, diagonal_trend, is_flat, locality,
                                      mask_keys, relativity_index, trend_pvalue, valid_mask, within_diagonal_rms)


def fin(v):
    return not (math.isnan(v) or math.isinf(v))


def entries(m, include_diagonal=False, exclude=()):
    S = len(m)
    return [(i, j, m[i][j]) for i in range(S) for j in range(S)
            if (i > j or (include_diagonal and i == j)) and j not in exclude and fin(m[i][j])]


def by_offset(ents):
    d = {}
    for i, j, v in ents:
        d.setdefault(i - j, []).append(v)
    return {k: sum(v) / len(v) for k, v in d.items()}


def rand_map(S, seed, nan=()):
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(S, S, generator=gen, dtype=torch.float64)
    for i, j in nan:
        m[i, j] = float("nan")
    return m


def test_valid_mask_loop():
    for S in (1, 4):
        for diag in (False, True):
            want = [[i > j or (diag and i == j) for j in range(S)] for i in range(S)]
            assert valid_mask(S, diag).tolist() == want


def test_diagonal_means_and_normalize_loop_batched():
    ms = torch.stack([rand_map(5, 1, nan=[(3, 1), (4, 0)]), rand_map(5, 2, nan=[(2, 2)])])
    ms[0, 4, 0] = float("nan")  # diagonal 4 has one entry: all NaN -> its mean is NaN
    ms[0, 0, 4] = 100.0  # above the diagonal: ignored
    means = diagonal_means(ms)
    normed = diagonal_normalize(ms)
    assert means.shape == (2, 5) and normed.shape == (2, 5, 5)
    for b in range(2):
        m = ms[b].tolist()
        mu = by_offset(entries(m, include_diagonal=True))
        for k in range(5):
            if k in mu:
                assert float(means[b, k]) == pytest.approx(mu[k], rel=1e-12, abs=1e-14)
            else:
                assert math.isnan(float(means[b, k]))
        for i in range(5):
            for j in range(5):
                got = float(normed[b, i, j])
                if i < j or not fin(m[i][j]):
                    assert math.isnan(got)
                else:
                    assert got == pytest.approx(m[i][j] - mu[i - j], rel=1e-12, abs=1e-14)
    # integer maps are read as numbers
    assert diagonal_means(torch.tensor([[1, 0], [3, 5]])).tolist() == [3.0, 3.0]


def test_mask_keys_copies_and_ignores_out_of_range_keys():
    m = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    out = mask_keys(m, (0, 2, 7, -1))
    assert out.dtype == torch.float64 and not torch.isnan(m).any()
    for j in range(4):
        col = out[:, j]
        assert bool(col.isnan().all()) == (j in (0, 2)) and bool(col.isnan().any()) == (j in (0, 2))
    assert mask_keys(m).tolist() == m.double().tolist()


def brute_rms(m, include_diagonal=False, exclude=()):
    ents = entries(m, include_diagonal, exclude)
    if not ents:
        return float("nan")
    mu = by_offset(ents)
    return math.sqrt(sum((v - mu[i - j]) ** 2 for i, j, v in ents) / len(ents))


def brute_ri(m, include_diagonal=False, exclude=()):
    ents = entries(m, include_diagonal, exclude)
    mean = sum(v for _, _, v in ents) / len(ents)
    var = sum((v - mean) ** 2 for _, _, v in ents) / len(ents)
    mu = by_offset(ents)
    var_dn = sum((v - mu[i - j]) ** 2 for i, j, v in ents) / len(ents)
    return min(max(1 - var_dn / var, 0.0), 1.0)


@pytest.mark.parametrize("diag", [False, True])
@pytest.mark.parametrize("exclude", [(), (0,), (1, 3)])
def test_rms_and_relativity_index_loop(diag, exclude):
    S = 7
    i = torch.arange(S, dtype=torch.float64)
    toeplitz = torch.cos(i[:, None] - i[None, :])
    m = toeplitz + 0.3 * rand_map(S, 3, nan=[(5, 2)])
    ml = m.tolist()
    assert within_diagonal_rms(m, diag, exclude) == pytest.approx(brute_rms(ml, diag, exclude), rel=1e-12)
    assert relativity_index(m, include_diagonal=diag, exclude_keys=exclude) == pytest.approx(
        brute_ri(ml, diag, exclude), rel=1e-12)
    assert math.isnan(within_diagonal_rms(torch.full((3, 3), float("nan"))))


def test_relativity_index_edges():
    S = 6
    i = torch.arange(S, dtype=torch.float64)
    toeplitz = (i[:, None] - i[None, :]) ** 2
    assert relativity_index(toeplitz) == pytest.approx(1.0, abs=1e-12)
    assert relativity_index(torch.full((S, S), 2.0)) is None  # flat
    # a map whose diagonals explain nothing: rows alternate around a diagonal-constant mean
    alt = torch.tensor([[(-1.0) ** (i + j) * (1 + j) for j in range(S)] for i in range(S)])
    assert relativity_index(alt) == pytest.approx(brute_ri(alt.tolist()), rel=1e-12)
    with pytest.raises(ValueError):
        relativity_index(torch.zeros(2, S, S))


def brute_trend(m, include_diagonal=False, exclude=()):
    S = len(m)
    up = down = total = 0
    for k in range(0 if include_diagonal else 1, S):
        diag = [m[t + k][t] for t in range(S - k) if t not in exclude and fin(m[t + k][t])]
        for a, b in itertools.combinations(diag, 2):
            total += 1
            up += b > a
            down += b < a
    return None if total == 0 else (up - down) / total


@pytest.mark.parametrize("diag", [False, True])
@pytest.mark.parametrize("exclude", [(), (0,), (2,)])
def test_diagonal_trend_loop(diag, exclude):
    gen = torch.Generator().manual_seed(11)
    m = torch.randint(0, 4, (8, 8), generator=gen).to(torch.float64)  # ties included
    m[6, 3] = float("nan")
    got = diagonal_trend(m, diag, exclude)
    assert got == pytest.approx(brute_trend(m.tolist(), diag, exclude), abs=1e-12)


def test_diagonal_trend_edges():
    assert diagonal_trend(torch.zeros(2, 2)) is None  # diagonal 1 has a single entry: no pair
    assert diagonal_trend(torch.zeros(3, 3)) == 0.0  # one tied pair on diagonal 1
    assert diagonal_trend(torch.zeros(1, 1)) is None
    assert diagonal_trend(torch.zeros(2, 2), include_diagonal=True) == 0.0
    assert diagonal_trend(torch.zeros(1, 1), include_diagonal=True) is None
    i = torch.arange(5, dtype=torch.float64)
    rising = i[None, :].expand(5, 5).clone()  # later key higher along every diagonal
    assert diagonal_trend(rising) == 1.0 and diagonal_trend(-rising) == -1.0
    with pytest.raises(ValueError):
        diagonal_trend(torch.zeros(2, 3, 3))


def brute_slope_stat(m, include_diagonal=False):
    """Mean over diagonals with >= 3 entries of the least-squares slope of the entries on the column."""
    S = len(m)
    slopes = []
    for k in range(0 if include_diagonal else 1, S):
        cols = list(range(S - k))
        if len(cols) < 3:
            continue
        vals = [m[t + k][t] for t in cols]
        slopes.append(np.polyfit(cols, vals, 1)[0])
    return sum(slopes) / max(len(slopes), 1)


def brute_signflip(stats, weights):
    w = [x / sum(weights) for x in weights]
    obs = sum(wi * a for wi, a in zip(w, stats)) ** 2
    hits = n = 0
    for eps in itertools.product((1, -1), repeat=len(stats)):
        t = sum(e * wi * a for e, wi, a in zip(eps, w, stats)) ** 2
        hits += t >= obs * (1 - 1e-12)
        n += 1
    return hits / n


@pytest.mark.parametrize("diag", [False, True])
def test_trend_pvalue_is_a_signflip_of_mean_diagonal_slopes(diag):
    S, G = 7, 6
    gen = torch.Generator().manual_seed(12)
    i = torch.arange(S, dtype=torch.float64)
    groups = 0.05 * i[None, None, :] + torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    weights = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 1.0])
    stats = [brute_slope_stat(groups[g].tolist(), diag) for g in range(G)]
    assert trend_pvalue(groups, weights, include_diagonal=diag) == pytest.approx(
        brute_signflip(stats, weights.tolist()), abs=1e-12)
    assert trend_pvalue(groups) == pytest.approx(brute_signflip(stats if not diag else
                                                                [brute_slope_stat(groups[g].tolist()) for g in range(G)],
                                                                [1.0] * G), abs=1e-12)


def test_is_flat_without_groups_is_exact_constancy():
    S = 5
    c = torch.full((S, S), 3.0, dtype=torch.float64)
    assert is_flat(c)
    tiny = c.clone()
    tiny[3, 1] += 3.0 * 1e-13  # within float64 rounding of the scale
    assert is_flat(tiny)
    small = c.clone()
    small[3, 1] += 3.0 * 1e-9
    assert not is_flat(small)
    # the variation sits on the main diagonal only: flat unless the diagonal is included
    d = c + torch.eye(S, dtype=torch.float64)
    assert is_flat(d) and not is_flat(d, include_diagonal=True)
    # the variation sits in an excluded column only
    col = c.clone()
    col[2:, 0] = 7.0
    assert not is_flat(col) and is_flat(col, exclude_keys=(0,))
    assert is_flat(torch.zeros(2, 2))  # one valid entry: nothing can vary
    assert is_flat(torch.zeros(S, S))


def test_locality_loop_and_flat():
    S = 6
    gen = torch.Generator().manual_seed(13)
    m = torch.randint(0, 3, (S, S), generator=gen).to(torch.float64)
    ml = m.tolist()
    for diag in (False, True):
        hits = total = 0.0
        for i in range(S):
            keys = range(i + 1) if diag else range(i)
            for j, k in itertools.combinations(keys, 2):
                total += 1
                hits += 1.0 if ml[i][k] > ml[i][j] else (0.5 if ml[i][k] == ml[i][j] else 0.0)
        assert locality(m, include_diagonal=diag) == pytest.approx(2 * hits / total - 1, abs=1e-12)
    assert locality(torch.ones(S, S)) is None
    with pytest.raises(ValueError):
        locality(torch.zeros(2, S, S))


# --------------------------------------------------------------------------------------------
# noise from independent groups: describe_map against loops over the definitions
# --------------------------------------------------------------------------------------------
def _group_vectors(groups, mask_entries, within):
    out = []
    for g in groups:
        vals = [(i, j, g[i][j]) for i, j in mask_entries]
        if within:
            mu = by_offset(vals)
            out.append([v - mu[i - j] for i, j, v in vals])
        else:
            mean = sum(v for _, _, v in vals) / len(vals)
            out.append([v - mean for _, _, v in vals])
    return out


def _signflip_vec(vecs, w):
    w = [x / sum(w) for x in w]
    n = len(vecs[0])

    def stat(eps):
        return sum(sum(e * wi * a[k] for e, wi, a in zip(eps, w, vecs)) ** 2 for k in range(n))

    obs = stat([1] * len(vecs))
    pats = list(itertools.product((1, -1), repeat=len(vecs)))
    return sum(stat(e) >= obs * (1 - 1e-12) for e in pats) / len(pats)


def _cross(vecs, w):
    w = [x / sum(w) for x in w]
    n, G = len(vecs[0]), len(vecs)
    K = [[sum(a * b for a, b in zip(vecs[g], vecs[h])) / n for h in range(G)] for g in range(G)]
    off = sum(w[g] * w[h] * K[g][h] for g in range(G) for h in range(G) if g != h)
    woff = sum(w[g] * w[h] for g in range(G) for h in range(G) if g != h)
    obs = sum(w[g] * w[h] * K[g][h] for g in range(G) for h in range(G))
    return off / woff, obs - off / woff


@pytest.mark.parametrize("G", [8, 3])
def test_describe_map_noise_numbers_against_loops(G):
    from poslens.metrics.diagonal import describe_map

    S = 5
    gen = torch.Generator().manual_seed(20 + G)
    i = torch.arange(S, dtype=torch.float64)
    signal = 0.3 * torch.cos(i[:, None] - i[None, :]) + 0.2 * (i[None, :] / S)  # relative + a column trend
    groups = signal + 0.3 * torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    groups[:, 2, 0] = 5.0  # key 0 raised: excluded below
    weights = torch.arange(1, G + 1, dtype=torch.float64)
    m = (groups * weights[:, None, None]).sum(0) / weights.sum()
    d = describe_map(m, groups, weights, exclude_keys=(0,))
    ents = [(a, b) for a in range(S) for b in range(a) if b != 0]
    gl = groups.tolist()
    w = weights.tolist()
    cen, wit = _group_vectors(gl, ents, False), _group_vectors(gl, ents, True)
    assert d["flat_p"] == pytest.approx(_signflip_vec(cen, w), abs=1e-12)
    assert d["nonrelative_p"] == pytest.approx(_signflip_vec(wit, w), abs=1e-12)
    sig, noise = _cross(wit, w)
    assert d["within_diag_rms_signal"] == pytest.approx(math.sqrt(max(sig, 0.0)), rel=1e-9, abs=1e-12)
    assert d["within_diag_rms_noise"] == pytest.approx(math.sqrt(max(noise, 0.0)), rel=1e-9, abs=1e-12)
    assert d["noise_groups"] == G
    assert d["flat"] is False  # G = 8: p < 0.01 (the map varies); G = 3: too few groups to call anything flat
    if G >= 8:
        assert d["flat_p"] < 0.01
    vm, vd = _cross(cen, w)[0], _cross(wit, w)[0]
    assert d["relativity_index"] == pytest.approx(min(max(1 - max(vd, 0.0) / vm, 0.0), 1.0), rel=1e-9)
    assert ("noise" in d) is (G < 8)
    if G < 8:
        assert d["noise"] == "too_few_groups" and d["noise_groups"] == G


def test_describe_map_without_groups_says_why():
    from poslens.metrics.diagonal import describe_map

    m = rand_map(5, 30)
    d = describe_map(m)
    assert "flat_p" not in d and "noise_groups" not in d
    assert d["noise"] == "no_groups"
    d1 = describe_map(m, m[None])
    assert d1["noise"] == "no_groups" and "noise_groups" not in d1
    assert d["relativity_index"] == pytest.approx(brute_ri(m.tolist()), rel=1e-12)
    assert d["within_diag_rms"] == pytest.approx(brute_rms(m.tolist()), rel=1e-12)
    assert d["diagonal_trend"] == pytest.approx(brute_trend(m.tolist()), abs=1e-12)
    # locality on a position subsample, when given one
    sub = m[:3, :3]
    d2 = describe_map(m, locality_map=sub)
    assert d2["locality"] == pytest.approx(locality(sub), abs=1e-12)


def brute_locality(m, include_diagonal=False, exclude=()):
    S = len(m)
    hits = total = 0.0
    for i in range(S):
        keys = [k for k in (range(i + 1) if include_diagonal else range(i)) if k not in exclude and fin(m[i][k])]
        for j, k in itertools.combinations(keys, 2):
            total += 1
            hits += 1.0 if m[i][k] > m[i][j] else (0.5 if m[i][k] == m[i][j] else 0.0)
    return 2 * hits / total - 1


@pytest.mark.parametrize("diag,exclude", [(True, ()), (False, (0,)), (True, (1,))])
def test_describe_map_locality_options(diag, exclude):
    from poslens.metrics.diagonal import describe_map

    m = torch.randint(0, 4, (7, 7), generator=torch.Generator().manual_seed(31)).to(torch.float64)
    m[:, 0] += 10.0  # a raised sink column: the locality changes when it is excluded
    d = describe_map(m, include_diagonal=diag, exclude_keys=exclude)
    assert d["locality"] == pytest.approx(brute_locality(m.tolist(), diag, exclude), abs=1e-12)


def test_flatness_with_groups_uses_weights_diagonal_and_excluded_keys():
    from poslens.metrics.diagonal import flat_pvalue

    S, G = 5, 8
    gen = torch.Generator().manual_seed(40)
    noise = 0.05 * torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    # (a) the main diagonal alone varies: flat unless the diagonal is included
    diag_only = noise + 3.0 * torch.eye(S, dtype=torch.float64) * torch.arange(S, dtype=torch.float64)
    ents = [(i, j) for i in range(S) for j in range(i + 1)]
    want = _signflip_vec(_group_vectors(diag_only.tolist(), ents, False), [1.0] * G)
    assert flat_pvalue(diag_only, include_diagonal=True) == pytest.approx(want, abs=1e-12)
    assert want < 0.01
    # (b) the sink column alone varies: flat once key 0 is excluded, with decisive groups
    sink = noise.clone()
    sink[:, 1:, 0] += torch.arange(1, S, dtype=torch.float64)
    m = sink.mean(0)
    ents = [(i, j) for i in range(S) for j in range(i) if j != 0]
    p_excl = _signflip_vec(_group_vectors(sink.tolist(), ents, False), [1.0] * G)
    assert p_excl >= 0.01 and is_flat(m, sink, exclude_keys=(0,))
    assert not is_flat(m, sink)


def test_relativity_index_judges_flatness_with_the_groups_weights():
    """Eight identical group maps: every sign flip but the two global ones lowers ||sum_g w_g a_g||^2,
    so the unweighted sign-flip p-value is 2/256 < 0.01 (not flat). With weight 0 on one group,
    flipping that group changes nothing: 4 of 256 patterns reach the observed value, p = 4/256 >= 0.01,
    and the weighted map is flat (no relativity index)."""
    from poslens.metrics.diagonal import flat_pvalue

    S, G = 5, 8
    m = torch.tensor([[float(i * i + 3 * j) for j in range(S)] for i in range(S)], dtype=torch.float64)
    groups = m.expand(G, S, S).clone()
    equal, one_empty = torch.ones(G, dtype=torch.float64), torch.tensor([1.0] * (G - 1) + [0.0], dtype=torch.float64)
    assert flat_pvalue(groups, equal) == pytest.approx(2 / 256) and flat_pvalue(groups, one_empty) == pytest.approx(4 / 256)
    assert not is_flat(m, groups, equal) and is_flat(m, groups, one_empty)
    assert relativity_index(m, groups, equal) is not None
    assert relativity_index(m, groups, one_empty) is None


def test_causal_and_window_views_against_loops():
    from poslens.metrics.diagonal import causal_view, window_view

    S = 5
    m = torch.arange(1, S * S + 1, dtype=torch.float64).reshape(S, S)

    def check(got, keep):
        for i in range(S):
            for j in range(S):
                v = float(got[i, j])
                assert (v == float(m[i, j])) if keep(i, j) else math.isnan(v), (i, j)

    check(causal_view(m), lambda i, j: j <= i)  # the diagonal kept by default
    check(causal_view(m, include_diagonal=False), lambda i, j: j < i)
    both = causal_view(torch.stack([m, 2 * m]), include_diagonal=False)
    assert torch.equal(both[1].nan_to_num(-1), (2 * causal_view(m, include_diagonal=False)).nan_to_num(-1))
    for w in (1, 2, 4):
        check(window_view(m, w), lambda i, j, w=w: i - j < w)
    for w in (None, 0, S, S + 3):  # no window, or one that covers every key
        assert window_view(m, w) is m


def test_pvalues_with_two_entries_and_with_the_diagonal():
    """Two valid entries are enough for a flatness p-value (identical groups whose two entries differ:
    only the two global flips reach the observed statistic, p = 2/256); the non-relativity test reads
    the main diagonal when asked (offset 0 entries that grow along it are non-relative)."""
    from poslens.metrics.diagonal import flat_pvalue, nonrelative_pvalue

    G = 8
    two = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [float("nan"), 4.0, 0.0]], dtype=torch.float64)
    assert flat_pvalue(two.expand(G, 3, 3).clone()) == pytest.approx(2 / 256)
    assert flat_pvalue(two.expand(G, 3, 3).clone(), exclude_keys=(0,)) is None  # one entry left
    S = 4
    gen = torch.Generator().manual_seed(41)
    noise = 0.01 * torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    diag_grows = noise + torch.diag(torch.arange(S, dtype=torch.float64))
    assert nonrelative_pvalue(diag_grows, include_diagonal=True) == pytest.approx(2 / 256)
    assert nonrelative_pvalue(diag_grows) > 0.01


def test_relativity_index_with_two_groups_uses_their_cross_products():
    """Two groups are enough for the noise correction: both variances are the mean product of the two
    groups' centred (or within-diagonal) entries, written out here by loops; the plain one-map formula
    gives another number on these maps."""
    S = 5
    gen = torch.Generator().manual_seed(42)
    base = torch.tensor([[abs(i - j) ** 1.5 + 0.3 * j for j in range(S)] for i in range(S)], dtype=torch.float64)
    groups = base + 0.5 * torch.randn(2, S, S, generator=gen, dtype=torch.float64)
    m = groups.mean(0)
    ents = [(i, j) for i in range(S) for j in range(i)]

    def centred(g):
        mu = sum(float(g[i, j]) for i, j in ents) / len(ents)
        return [float(g[i, j]) - mu for i, j in ents]

    def within(g):
        by = {}
        for i, j in ents:
            by.setdefault(i - j, []).append(float(g[i, j]))
        return [float(g[i, j]) - sum(by[i - j]) / len(by[i - j]) for i, j in ents]

    var_map = sum(a * b for a, b in zip(centred(groups[0]), centred(groups[1]))) / len(ents)
    var_dn = sum(a * b for a, b in zip(within(groups[0]), within(groups[1]))) / len(ents)
    want = min(max(1 - max(var_dn, 0.0) / var_map, 0.0), 1.0)
    plain = 1 - (sum(v * v for v in within(m)) / len(ents)) / (sum(v * v for v in centred(m)) / len(ents))
    assert 0.0 < want < 1.0 and abs(want - plain) > 0.01
    assert relativity_index(m, groups) == pytest.approx(want, rel=1e-12)


def test_is_flat_without_groups_is_relative_to_the_maps_scale():
    """Without groups only an exactly constant map is flat, whatever its scale: a map of entries around
    1e-15 that vary by half their size is not flat; a constant one (or all zeros) is."""
    tiny = 1e-15 * torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [2.0, 1.5, 0.0]], dtype=torch.float64)
    assert not is_flat(tiny)
    assert is_flat(torch.full((3, 3), 1e-15, dtype=torch.float64)) and is_flat(torch.zeros(3, 3, dtype=torch.float64))
