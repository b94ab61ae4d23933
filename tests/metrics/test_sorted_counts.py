"""The score-map readings counted by sorting against slow references kept here.

The references compare every pair directly (numpy, row by row) or compose the public functions one
by one, as the readings were computed before they were batched; the fast paths must give the same
numbers bit for bit on random maps with ties, NaN and infinite entries, excluded keys and sign-flip
groups (arXiv 2501.00073's pair count for locality; the diagonal trend and noise tests of
poslens.metrics.diagonal).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from poslens.metrics.diagonal import (_centred, _entries, _groups, _slope_functional, _within, describe_map,
                                      diagonal_trend, diagonal_trends, is_flat, locality, mask_keys, relativity_index,
                                      within_diagonal_rms)
from poslens.metrics.neighborhood import (_compared_pair_counts, _merged_pair_counts, adjacency_probability_score,
                                          finite_prefix, key_pair_counts, norm_score, ordered_pair_counts,
                                          rising_pair_fraction, row_pair_counts)
from poslens.metrics.noise import (_flip_patterns, _flip_statistics, cross_mean_square, decisive, jackknife_se,
                                   jackknife_se_of, leave_one_out_means, min_pvalue, signflip_pvalue)


# ------------------------------------------------------------------------------------------------
# slow references
# ------------------------------------------------------------------------------------------------
def reference_row_counts(m: torch.Tensor, include_diagonal: bool) -> tuple[int, int, int]:
    """(rising, tied, pairs) of one map ``[T, T]``: every pair j < k of row i's visible finite keys
    compared directly (numpy, one row at a time)."""
    a = m.to(torch.float64).numpy() if m.is_floating_point() else m.numpy().astype(np.float64)
    T = a.shape[-1]
    rise = tie = pairs = 0
    for i in range(T):
        v = a[i, : i + 1 if include_diagonal else i]
        v = v[np.isfinite(v)]
        up = np.triu(np.ones((v.size, v.size), dtype=bool), 1)  # [j, k]: j < k
        rise += int(((v[None, :] > v[:, None]) & up).sum())
        tie += int(((v[None, :] == v[:, None]) & up).sum())
        pairs += int(up.sum())
    return rise, tie, pairs


def reference_describe_map(m, groups=None, weights=None, *, include_diagonal=False, exclude_keys=(),
                           locality_map=None) -> dict:
    """describe_map composed of its functions one by one, each reading its inputs afresh (the noise
    numbers on the entries valid in the groups and in the map, the jackknife one group at a time)."""
    m = torch.as_tensor(m, dtype=torch.float64)
    G = 0 if groups is None else int(groups.shape[0])
    out = {
        "relativity_index": relativity_index(m, groups, weights, include_diagonal, exclude_keys),
        "locality": None,
        "diagonal_trend": diagonal_trend(m, include_diagonal, exclude_keys),
        "within_diag_rms": within_diagonal_rms(m, include_diagonal, exclude_keys),
    }
    flat = is_flat(m, groups, weights, include_diagonal, exclude_keys)
    if not flat:
        lm = m if locality_map is None else torch.as_tensor(locality_map, dtype=torch.float64)
        v = float(rising_pair_fraction(mask_keys(lm, exclude_keys), include_diagonal=include_diagonal, ties=0.5))
        out["locality"] = None if math.isnan(v) else 2.0 * v - 1.0
    out["flat"] = flat
    if G >= 2:
        g, w = _groups(groups, weights, exclude_keys)
        mask = _entries(g, include_diagonal) & _entries(mask_keys(m, exclude_keys), include_diagonal)
        if bool(mask.any()):
            sig, noise = cross_mean_square(_within(g, mask), w)
            out.update({
                "flat_p": signflip_pvalue(_centred(g, mask), w),
                "nonrelative_p": signflip_pvalue(_within(g, mask), w),
                "trend_p": signflip_pvalue((g[:, mask] @ _slope_functional(mask))[:, None], w),
                "within_diag_rms_noise": float(max(noise, 0.0) ** 0.5),
                "within_diag_rms_signal": float(max(sig, 0.0) ** 0.5),
                "noise_groups": G,
                "diagonal_trend_se": jackknife_se(lambda mm: diagonal_trend(mm, include_diagonal),
                                                  g * w.reshape(-1, 1, 1), w),
            })
    return out


def _maps(T: int, gen: torch.Generator, n: int = 4) -> torch.Tensor:
    """Maps ``[n, T, T]``: Gaussian, integer-valued (many ties), with NaN scattered, and with infinite
    entries and a NaN key column."""
    ms = [torch.randn(T, T, generator=gen, dtype=torch.float64),
          torch.randint(0, 3, (T, T), generator=gen).to(torch.float64)]
    a = torch.randint(-2, 3, (T, T), generator=gen).to(torch.float64) * 0.5
    a[torch.rand(T, T, generator=gen) < 0.2] = float("nan")
    ms.append(a)
    b = torch.randn(T, T, generator=gen, dtype=torch.float64).round()
    b[:, 0] = float("nan")
    b[torch.rand(T, T, generator=gen) < 0.1] = float("inf")
    b[torch.rand(T, T, generator=gen) < 0.1] = float("-inf")
    ms.append(b)
    return torch.stack(ms[:n])


# ------------------------------------------------------------------------------------------------
# pair counts of rows
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("include_diagonal", [False, True])
def test_row_pair_counts_against_direct_comparison(include_diagonal):
    """Every map size 1 .. 70 (row bands of 64 and 128 columns crossed) and a few larger, float64."""
    gen = torch.Generator().manual_seed(50)
    for T in [*range(1, 71), 129, 130, 200]:
        ms = _maps(T, gen)
        rise, tie, pairs = row_pair_counts(ms, include_diagonal)
        for b in range(ms.shape[0]):
            want = reference_row_counts(ms[b], include_diagonal)
            assert (int(rise[b]), int(tie[b]), int(pairs[b])) == want, (T, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_row_pair_counts_in_other_dtypes(dtype):
    gen = torch.Generator().manual_seed(51)
    for T in (3, 17, 66):
        ms = torch.randint(-3, 4, (3, T, T), generator=gen).to(dtype)
        if dtype.is_floating_point:
            ms[0] = torch.randn(T, T, generator=gen).to(dtype)
            ms[1, :, 1] = float("nan")
            ms[2, 0] = -0.0  # equal to +0.0
        rise, tie, pairs = row_pair_counts(ms)
        for b in range(3):
            assert (int(rise[b]), int(tie[b]), int(pairs[b])) == reference_row_counts(ms[b], False)


@pytest.mark.parametrize("ties", [0.0, 0.5])
@pytest.mark.parametrize("include_diagonal", [False, True])
def test_rising_pair_fraction_sorted_equals_compared(ties, include_diagonal):
    """The CPU's sorted count and the other devices' direct comparison (run here on the CPU) give the
    same fractions bit for bit; NaN where no pair is left; leading dimensions kept."""
    gen = torch.Generator().manual_seed(52)
    for T in (1, 2, 3, 9, 64, 65, 100):
        ms = _maps(T, gen).reshape(2, 2, T, T)
        got = rising_pair_fraction(ms, include_diagonal, ties)
        rises, tied, total = _compared_pair_counts(ms, include_diagonal, chunk_elems=2**12)
        hits = rises + ties * tied
        want = hits / total.clamp_min(1) + torch.where(total > 0, 0.0, float("nan"))
        assert got.shape == (2, 2)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()), T


def test_finite_prefix_moves_kept_entries_forward():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    keep = torch.tensor([[False, True, False, True], [True, True, True, True]])
    out = finite_prefix(x, keep)
    inf = float("-inf")
    assert out.tolist() == [[2.0, 4.0, inf, inf], [5.0, 6.0, 7.0, 8.0]]


@pytest.mark.parametrize("count,kernel", [(ordered_pair_counts, "auto"), (ordered_pair_counts, "torch"),
                                          (_merged_pair_counts, "auto")])
def test_ordered_pair_counts_with_ties_against_loops(count, kernel, monkeypatch):
    """The CPU's count of rising and tied pairs (every pair compared in C where the kernels are built,
    one value sort per row without them) and the other devices' level-by-level count (run here on the
    CPU), rows of every length with -inf suffixes."""
    monkeypatch.setenv("POSLENS_CAPTURE_KERNEL", kernel)
    gen = torch.Generator().manual_seed(53)
    for T in range(1, 70):
        x = torch.randint(0, 4, (6, T), generator=gen).to(torch.float64)
        x[0] = torch.randn(T, generator=gen, dtype=torch.float64)
        x[1, T // 3:] = float("-inf")
        x[2] = float("-inf")
        x[3, 1:] = float("-inf")
        for dtype in (torch.float64, torch.float32):
            gt, eq, n = count(x.to(dtype))
            for r, row in enumerate(x.tolist()):
                v = [a for a in row if a != float("-inf")]
                ps = [(v[j], v[k]) for j in range(len(v)) for k in range(j + 1, len(v))]
                assert (float(gt[r]), float(eq[r]), float(n[r])) == (
                    sum(b > a for a, b in ps), sum(b == a for a, b in ps), len(ps)), (T, r, dtype)
            if count is _merged_pair_counts:  # the tie-free count of the per-sequence APS off the CPU
                assert torch.equal(count(x.to(dtype), count_ties=False)[0], gt)


# ------------------------------------------------------------------------------------------------
# diagonal trends, batched
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("include_diagonal", [False, True])
def test_diagonal_trends_batch_equals_each_map(include_diagonal):
    gen = torch.Generator().manual_seed(54)
    for T in (1, 2, 3, 8, 65, 70, 130):
        ms = _maps(T, gen)
        got = diagonal_trends(ms, include_diagonal)
        for b in range(ms.shape[0]):
            one = diagonal_trend(ms[b], include_diagonal)
            assert (one is None and math.isnan(float(got[b]))) or float(got[b]) == one, (T, b)
            # each diagonal's pairs compared directly
            m = ms[b].numpy()
            gt = lt = n = 0
            for k in range(0 if include_diagonal else 1, T):
                v = np.array([m[t + k, t] for t in range(T - k)])
                v = v[np.isfinite(v)]
                up = np.triu(np.ones((v.size, v.size), dtype=bool), 1)
                gt += int(((v[None, :] > v[:, None]) & up).sum())
                lt += int(((v[None, :] < v[:, None]) & up).sum())
                n += int(up.sum())
            assert (n == 0 and one is None) or one == (gt - lt) / n, (T, b)


# ------------------------------------------------------------------------------------------------
# noise: sign flips and the jackknife
# ------------------------------------------------------------------------------------------------
def test_flip_statistics_are_every_pattern_evaluated_directly():
    """The half-pattern form gives each pattern's eps^T K eps (in another order) to rounding, for every
    group count that enumerates its patterns, K not symmetric included; more groups draw patterns."""
    gen = torch.Generator().manual_seed(55)
    for G in range(2, 19):
        K = torch.randn(G, G, generator=gen, dtype=torch.float64)
        eps = _flip_patterns(G)
        direct = ((eps @ K) * eps).sum(1)
        got = _flip_statistics(K)
        assert got.shape == direct.shape
        torch.testing.assert_close(got.sort().values, direct.sort().values, rtol=1e-12, atol=1e-12)


def test_signflip_pvalues_against_enumeration_with_degenerate_groups():
    """Identical groups, zero-weight groups and integer-valued vectors put statistics exactly on the
    observed one: those patterns count, as in the brute-force enumeration."""
    import itertools

    gen = torch.Generator().manual_seed(56)
    for G in (2, 3, 5, 8, 9):
        for case in range(4):
            a = torch.randn(G, 4, generator=gen, dtype=torch.float64)
            if case == 1:
                a[1:] = a[0]
            if case == 2:
                a = a.round() + 1.0
            w = torch.rand(G, generator=gen, dtype=torch.float64) + 0.5
            if case == 3:
                w[-1] = 0.0
            wn = (w / w.sum()).tolist()
            obs = sum(sum(wn[g] * float(a[g, j]) for g in range(G)) ** 2 for j in range(4))
            stats = [sum(sum(e[g] * wn[g] * float(a[g, j]) for g in range(G)) ** 2 for j in range(4))
                     for e in itertools.product((1.0, -1.0), repeat=G)]
            want = sum(t >= obs * (1 - 1e-9) for t in stats) / len(stats)
            assert signflip_pvalue(a, w) == want, (G, case)
    assert min_pvalue(16) == 2.0**-15 and decisive(8) and not decisive(7)


def test_leave_one_out_means_and_jackknife_of_values():
    gen = torch.Generator().manual_seed(57)
    sums = torch.randn(5, 3, 3, generator=gen, dtype=torch.float64)
    counts = torch.tensor([1.0, 2.0, 3.0, 1.0, 4.0], dtype=torch.float64)
    loo = leave_one_out_means(sums, counts)
    total, n = sums.sum(0), counts.sum()
    for g in range(5):
        assert torch.equal(loo[g], (total - sums[g]) / (n - counts[g]))

    def stat(mm):
        return float(mm[2, 0] - mm[1, 1])

    assert jackknife_se_of([stat(x) for x in loo]) == jackknife_se(stat, sums, counts)
    assert jackknife_se_of([1.0]) is None and jackknife_se_of([1.0, None]) is None
    assert jackknife_se_of([1.0, float("nan")]) is None


# ------------------------------------------------------------------------------------------------
# describe_map: each number computed once, the same numbers
# ------------------------------------------------------------------------------------------------
def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


#: readings ``describe_map`` takes from the diagonal sums of one layout (``map_numbers``): the same
#: numbers summed in another order, equal to float64 rounding; every other reading is bit for bit
SUMMED_IN_ANOTHER_ORDER = ("relativity_index", "within_diag_rms")


def _same_reading(key, a, b) -> bool:
    if key in SUMMED_IN_ANOTHER_ORDER and isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    return _same(a, b)


@pytest.mark.parametrize("G", [0, 1, 3, 8, 16])
@pytest.mark.parametrize("include_diagonal,exclude", [(False, ()), (False, (0,)), (True, (0, 3)), (True, (99,))])
def test_describe_map_equals_its_functions_one_by_one(G, include_diagonal, exclude):
    gen = torch.Generator().manual_seed(58 + G)
    S = 12
    i = torch.arange(S, dtype=torch.float64)
    signal = 0.4 * torch.cos(0.7 * (i[:, None] - i[None, :])) + 0.05 * i[None, :]
    groups = signal + 0.5 * torch.randn(max(G, 1), S, S, generator=gen, dtype=torch.float64)
    groups[:, :, 0] += 3.0  # a sink column
    groups[:, 7, 2] = float("nan")
    groups[:, 2, 5] = float("nan")  # above the diagonal: ignored
    weights = torch.arange(1, max(G, 1) + 1, dtype=torch.float64)
    m = (groups * weights[:, None, None]).sum(0) / weights.sum()
    m[9, 4] = float("nan")  # the map alone masks an entry the groups have
    g, w = (groups, weights) if G else (None, None)
    for lm in (None, m[:7, :7]):
        got = describe_map(m, g, w, include_diagonal=include_diagonal, exclude_keys=exclude, locality_map=lm)
        want = reference_describe_map(m, g, w, include_diagonal=include_diagonal, exclude_keys=exclude,
                                      locality_map=lm)
        for key, value in want.items():
            assert _same_reading(key, got[key], value), (key, got[key], value)
        assert set(got) - set(want) <= {"noise"}


def test_describe_map_flat_groups_and_the_relativity_flatness_on_every_key():
    """Noise-only groups with a varying sink column: flat once key 0 is excluded (no locality), while
    relativity_index judges flatness on the groups with every key, as the function does alone."""
    gen = torch.Generator().manual_seed(59)
    S, G = 6, 8
    groups = 0.05 * torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    groups[:, 1:, 0] += torch.arange(1, S, dtype=torch.float64)
    m = groups.mean(0)
    got = describe_map(m, groups, exclude_keys=(0,))
    want = reference_describe_map(m, groups, exclude_keys=(0,))
    assert got["flat"] is True and got["locality"] is None
    for key, value in want.items():
        assert _same_reading(key, got[key], value), key


# ------------------------------------------------------------------------------------------------
# closed-form counts
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("include_diagonal", [False, True])
def test_key_pair_counts_complete_the_masked_counts(include_diagonal):
    """The pairs of excluded key columns added to the counts of the masked map are the counts of the
    whole map, whichever columns (first, inner, last, several, out of range) and NaN or ties."""
    gen = torch.Generator().manual_seed(60)
    for T in (1, 2, 5, 33, 70):
        ms = _maps(T, gen)
        whole = row_pair_counts(ms, include_diagonal)
        for keys in [(0,), (T - 1,), (0, T // 2, T - 1), (1, 2), (T + 3,)]:
            masked = row_pair_counts(mask_keys(ms, keys), include_diagonal)
            extra = key_pair_counts(ms, keys, include_diagonal)
            for a, b, c in zip(whole, masked, extra):
                assert torch.equal(a, b + c), (T, keys)


def test_describe_map_locality_all_keys_is_the_locality_with_every_key():
    gen = torch.Generator().manual_seed(61)
    m = torch.randint(0, 5, (20, 20), generator=gen).to(torch.float64)
    m[:, 0] += 7.0  # a raised sink column
    for lm in (None, m[::2, ::2]):
        d = describe_map(m, exclude_keys=(0,), locality_map=lm, locality_all_keys=True)
        assert d["locality_all_keys"] == locality(m if lm is None else lm)
        assert d["locality"] == locality(m if lm is None else lm, exclude_keys=(0,))
    const = torch.ones(6, 6, dtype=torch.float64)
    const[:, 0] = 2.0  # constant once key 0 is excluded: flat, no locality either way
    d = describe_map(const, exclude_keys=(0,), locality_all_keys=True)
    assert d["flat"] and d["locality"] is None and d["locality_all_keys"] is None
    assert "locality_all_keys" not in describe_map(m)


def test_norm_score_closed_form_equals_the_map_count():
    """The per-vector closed form against the APS of the map whose rows all are -||h||, bit for bit:
    ties, signed zeros, lengths across the chunking, and non-finite norms (the map's own count)."""
    gen = torch.Generator().manual_seed(62)
    for T in (1, 2, 3, 4, 9, 64, 257):
        norms = torch.rand(3, T, generator=gen, dtype=torch.float64)
        norms[1] = norms[1].round(decimals=1)
        norms[2, ::2] = 0.0
        norms[2, 1::4] = -0.0
        got = norm_score(norms)
        want = adjacency_probability_score((-norms)[..., None, :].expand(3, T, T))
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()), T
    norms = torch.rand(2, 12, generator=gen, dtype=torch.float64)
    norms[0, 4] = float("nan")
    norms[1, 7] = float("inf")
    for b in range(2):
        sim = (-norms[b])[None, :].expand(12, 12)
        assert float(norm_score(norms[b])) == float(adjacency_probability_score(sim))


def test_value_order_of_float64_through_float32_keys_is_the_stable_order():
    """float64 rows sorted by their float32 roundings: the order (ties latest first) and tie counts of a
    stable float64 sort, also where rounding merges different values (1 and 1 + 1e-12, 1e-320 and
    2e-320), overflows (1e39, -1e300 beside -inf) or meets signed zeros, infinities and ties."""
    from poslens.metrics.neighborhood import _value_order

    gen = torch.Generator().manual_seed(63)
    specials = [1.0, 1.0 + 1e-12, 1e-320, 2e-320, 0.0, -0.0, 1e39, -1e300, 3.5e38, float("inf"), float("-inf"),
                2.0, 2.0]
    for case in range(40):
        P = int(torch.randint(2, 70, (1,), generator=gen))
        x = torch.randn(5, P, generator=gen, dtype=torch.float64)
        if case % 2:
            pick = torch.randint(0, len(specials), (5, P), generator=gen)
            use = torch.rand(5, P, generator=gen) < 0.4
            x = torch.where(use, torch.tensor(specials, dtype=torch.float64)[pick], x)
        if case % 3 == 0:
            x = x.round(decimals=1)
        order, ties = _value_order(x, count_ties=True)
        v = x.numpy()
        want = (P - 1) - np.argsort(v[:, ::-1], axis=1, kind="stable")
        assert (order == want).all(), case
        for r in range(5):
            row = [a for a in v[r].tolist() if a != float("-inf")]
            tied = sum(row[j] == row[k] for j in range(len(row)) for k in range(j + 1, len(row)))
            assert int(ties[r]) == tied, (case, r)
