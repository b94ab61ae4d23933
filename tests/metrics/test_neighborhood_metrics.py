"""metrics.neighborhood against a pure-Python triple count (arXiv 2501.00073's APS definition).

APS = #{(j, k, i): j < k < i, S[i, k] > S[i, j]} / #{such triples}; the expected values are
counted here by plain loops over nested lists, never by poslens.metrics.neighborhood.
"""

import math

import numpy as np
import pytest
import torch

from poslens.metrics.neighborhood import (adjacency_probability_score, aps_positions, norm_score,
                                          ordered_pair_counts, per_sequence_aps, rising_pair_counts,
                                          rising_pair_fraction, self_cosine,
                                          theory_gap)
from references import brute_aps, brute_cos, brute_cos_aps, brute_rising


def test_aps_positions_all_or_evenly_spaced():
    assert aps_positions(5, 10).tolist() == [0, 1, 2, 3, 4]
    assert aps_positions(5, 5).tolist() == [0, 1, 2, 3, 4]
    assert aps_positions(10, 4).tolist() == [0, 3, 6, 9]
    assert aps_positions(101, 3).tolist() == [0, 50, 100]


def test_aps_of_an_integer_map():
    gen = torch.Generator().manual_seed(4)
    m = torch.randint(0, 5, (2, 7, 7), generator=gen)  # integer entries, many ties
    got = adjacency_probability_score(m)
    assert got.dtype == torch.float64
    for b in range(2):
        assert float(got[b]) == pytest.approx(brute_aps(m[b].tolist()), abs=1e-12)


def test_aps_merge_path_not_taken_with_masked_subdiagonal():
    gen = torch.Generator().manual_seed(5)
    m = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    m[3, 2] = float("nan")  # only the first sub-diagonal is masked: must be skipped, not counted
    m[5, 4] = float("nan")
    assert float(adjacency_probability_score(m)) == pytest.approx(brute_aps(m.tolist()), abs=1e-12)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 9])
def test_aps_small_and_odd_sizes(T):
    gen = torch.Generator().manual_seed(T)
    m = torch.randn(3, T, T, generator=gen, dtype=torch.float64)
    got = adjacency_probability_score(m)
    for b in range(3):
        want = brute_aps(m[b].tolist())
        assert (math.isnan(want) and math.isnan(float(got[b]))) or float(got[b]) == pytest.approx(want, abs=1e-12)


def test_ordered_pair_counts_loop():
    gen = torch.Generator().manual_seed(6)
    x = torch.randint(0, 4, (5, 7), generator=gen).to(torch.float64)
    x[1, 4:] = float("-inf")  # a finite prefix of 4
    x[2, 1:] = float("-inf")
    gt, eq, n = ordered_pair_counts(x)
    for r in range(5):
        v = [a for a in x[r].tolist() if a != float("-inf")]
        pairs = [(v[j], v[k]) for j in range(len(v)) for k in range(j + 1, len(v))]
        assert float(gt[r]) == sum(b > a for a, b in pairs)
        assert float(eq[r]) == sum(b == a for a, b in pairs)
        assert float(n[r]) == len(pairs)


def _loop_rises(row):
    """Pairs j < k of a row (a list) with row[k] > row[j]: a plain double loop."""
    return sum(row[k] > row[j] for j in range(len(row)) for k in range(j + 1, len(row)))


def _rows_with_ties_and_inf(T, gen, dtype):
    """Rows of length T: Gaussian, integer-valued (many ties), +-0 only, -inf suffixes and -inf
    scattered anywhere, one all -inf, one constant."""
    rows = [torch.randn(T, generator=gen, dtype=torch.float64),
            torch.randint(0, 3, (T,), generator=gen).to(torch.float64),
            torch.randint(-1, 2, (T,), generator=gen).to(torch.float64) * 0.0,  # -0.0 and +0.0: equal
            torch.full((T,), float("-inf"), dtype=torch.float64),
            torch.full((T,), 0.25, dtype=torch.float64)]
    for cut in (T // 2, 1, T - 1):
        r = torch.randint(-2, 3, (T,), generator=gen).to(torch.float64)
        r[cut:] = float("-inf")
        rows.append(r)
    r = torch.randn(T, generator=gen, dtype=torch.float64)
    r[torch.rand(T, generator=gen) < 0.3] = float("-inf")
    rows.append(r)
    return torch.stack(rows).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rising_pair_counts_every_length_loop(dtype):
    """The O(T log T) count against a double loop for every length from 1 to 300 (powers of two and
    not), ties, signed zeros and -inf entries, in each input dtype."""
    gen = torch.Generator().manual_seed(21)
    for T in range(1, 301):
        x = _rows_with_ties_and_inf(T, gen, dtype)
        got = rising_pair_counts(x)
        assert got.dtype == torch.int64 and got.shape == (x.shape[0],)
        want = [_loop_rises(r) for r in x.to(torch.float64).tolist()]
        assert got.tolist() == want, T


def test_rising_pair_counts_hand_cases():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0],      # every pair rises: 6
                      [4.0, 3.0, 2.0, 1.0],      # none: 0
                      [1.0, 1.0, 1.0, 1.0],      # ties never count
                      [0.0, -0.0, 0.0, -0.0],    # signed zeros are equal
                      [2.0, 1.0, 3.0, float("-inf")],  # (0,2), (1,2): 2
                      [float("-inf"), 1.0, float("-inf"), 5.0]])  # (0,1), (0,3), (1,3), (2,3): 4
    assert rising_pair_counts(x).tolist() == [6, 0, 0, 0, 2, 4]
    assert rising_pair_counts(x[:, :1]).tolist() == [0] * 6
    assert rising_pair_counts(x.to(torch.int64)[:3]).tolist() == [6, 0, 0]  # integers: counted exactly


def test_aps_of_maps_with_ties_every_size_loop():
    """The APS (rows on power-of-two column prefixes) of integer-valued maps against the triple loop."""
    gen = torch.Generator().manual_seed(22)
    for T in (3, 4, 5, 8, 9, 16, 17, 31, 33):
        m = torch.randint(0, 3, (2, T, T), generator=gen).to(torch.float32)
        got = adjacency_probability_score(m)
        for b in range(2):
            assert float(got[b]) == pytest.approx(brute_aps(m[b].tolist()), abs=1e-12), T


def test_rising_pair_fraction_ties_and_diagonal_loop():
    gen = torch.Generator().manual_seed(7)
    m = torch.randint(0, 3, (2, 6, 6), generator=gen).to(torch.float32)
    m[0, 4, 1] = float("nan")
    for diag in (False, True):
        for ties in (0.0, 0.5):
            got = rising_pair_fraction(m, include_diagonal=diag, ties=ties, chunk_elems=40)
            for b in range(2):
                assert float(got[b]) == pytest.approx(brute_rising(m[b].tolist(), diag, ties), abs=1e-12)


def test_per_sequence_aps_is_the_cosine_map_count():
    gen = torch.Generator().manual_seed(8)
    x = 1e-3 * torch.randn(2, 9, 2, 3, generator=gen, dtype=torch.float64)  # norms far below 1, unequal
    x[:, :, 0] *= torch.linspace(0.1, 3.0, 9, dtype=torch.float64)[None, :, None]
    got = per_sequence_aps(x, max_positions=256)
    assert got.shape == (2,)
    for b in range(2):
        assert float(got[b]) == pytest.approx(brute_cos_aps(x[b].reshape(9, 6)), abs=1e-12)
    # longer than max_positions: the evenly spaced positions only
    sub = per_sequence_aps(x, max_positions=5)
    idx = [0, 2, 4, 6, 8]
    for b in range(2):
        assert float(sub[b]) == pytest.approx(brute_cos_aps(x[b, idx].reshape(5, 6)), abs=1e-12)


def test_per_sequence_aps_long_enough_for_the_half_products_loop():
    """From 64 positions the cosines are two products (first half against itself, second half against
    every column): the APS still equals the triple loop over the full cosine map, odd length included."""
    gen = torch.Generator().manual_seed(23)
    for S in (64, 71):
        x = torch.randn(2, S, 5, generator=gen, dtype=torch.float64).cumsum(1)  # a drifting walk: APS far from 0.5
        got = per_sequence_aps(x, max_positions=256)
        for b in range(2):
            assert float(got[b]) == pytest.approx(brute_cos_aps(x[b]), abs=1e-12), S


def test_per_sequence_aps_keeps_repeated_tokens_tied_on_two_threads():
    """Identical vectors (a repeated token's embedding) have equal cosines to every other position:
    exact ties, which the APS does not count as rises. Two threads split the products differently
    from one; the count must not see that split (a symmetric rank-k product on two BLAS threads gave
    some of the tied cosines different last bits, and the APS rose above the float64 triple count)."""
    gen = torch.Generator().manual_seed(41)
    vocab = torch.randn(8, 64, generator=gen)
    tokens = torch.randint(0, 8, (2, 96), generator=gen)
    x = vocab[tokens]  # float32, as a model's embedding output
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = per_sequence_aps(x, max_positions=256)
        torch.set_num_threads(1)
        one = per_sequence_aps(x, max_positions=256)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    for b in range(2):
        assert float(two[b]) == pytest.approx(brute_cos_aps(x[b].double()), abs=1e-12)


def test_norm_score_batched_loop():
    gen = torch.Generator().manual_seed(9)
    norms = torch.rand(2, 3, 7, generator=gen, dtype=torch.float64)
    got = norm_score(norms)
    assert got.shape == (2, 3)
    for a in range(2):
        for b in range(3):
            n = [-v for v in norms[a, b].tolist()]
            sim = [n[:] for _ in n]  # row i of the map is -||h|| for every key
            assert float(got[a, b]) == pytest.approx(brute_aps(sim), abs=1e-12)


def test_aps_keeps_every_leading_dimension():
    gen = torch.Generator().manual_seed(10)
    m = torch.randn(2, 3, 5, 5, generator=gen, dtype=torch.float64)
    got = adjacency_probability_score(m)
    assert got.shape == (2, 3)
    for a in range(2):
        for b in range(3):
            assert float(got[a, b]) == pytest.approx(brute_aps(m[a, b].tolist()), abs=1e-12)


def test_documented_defaults():
    # ties count 0 by default (the APS definition), the main diagonal is left out
    m = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    assert float(rising_pair_fraction(m)) == brute_aps(m.tolist()) == 0.0
    # per-sequence APS subsamples sequences longer than 256 positions
    x = torch.randn(1, 257, 4, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    assert float(per_sequence_aps(x)) == float(per_sequence_aps(x, max_positions=256))
    assert float(per_sequence_aps(x)) != float(per_sequence_aps(x, max_positions=257))


def test_self_cosine_loop_and_zero_vectors():
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    x[1, 2] = 0.0
    c = self_cosine(x)
    assert c.dtype == torch.float64 and c.shape == (2, 5, 5)
    for b in range(2):
        torch.testing.assert_close(c[b], torch.tensor(brute_cos(x[b].double().tolist()), dtype=torch.float64),
                                   rtol=1e-6, atol=1e-7)


def test_theory_gap_loop():
    T = 6
    th = [[math.sqrt(min(i, j) / max(i, j)) for j in range(1, T + 1)] for i in range(1, T + 1)]
    m = torch.tensor(th) + 0.1 * torch.randn(T, T, generator=torch.Generator().manual_seed(1))
    m = m.to(torch.float32)
    diffs = [abs(float(m[i, j]) - th[i][j]) for i in range(T) for j in range(i)]
    assert theory_gap(m) == pytest.approx(sum(diffs) / len(diffs), rel=1e-6)
    assert theory_gap(torch.tensor(th, dtype=torch.float64)) == pytest.approx(0.0, abs=1e-15)


def test_ordered_pair_counts_without_ties_every_length_loop():
    """The tie-free path (the device count of the per-sequence APS off the CPU) against a double loop on
    the CPU: rows with -inf suffixes, all lengths 1 .. 40; no tie count is returned."""
    gen = torch.Generator().manual_seed(31)
    for T in range(1, 41):
        x = torch.randn(4, T, generator=gen, dtype=torch.float64)
        x[1, T // 2:] = float("-inf")
        x[2] = torch.randint(0, 3, (T,), generator=gen).to(torch.float64)  # ties do not count as rises
        gt, eq, n = ordered_pair_counts(x, count_ties=False)
        assert eq is None
        fin = [[a for a in r if a != float("-inf")] for r in x.tolist()]
        assert gt.tolist() == [float(_loop_rises(r)) for r in fin], T
        assert n.tolist() == [len(r) * (len(r) - 1) / 2 for r in fin]


def test_rising_pair_counts_of_values_much_smaller_than_one():
    """Values the order of 1e-9 apart (cosines of nearly orthogonal vectors) keep their order: nothing
    may be added to them before the float32 bits are read as sort keys."""
    x = torch.tensor([[1e-9, 2e-9, 3e-9, -1e-9, 4e-9], [3e-9, 2e-9, 1e-9, 5e-10, 0.0]], dtype=torch.float32)
    assert rising_pair_counts(x).tolist() == [_loop_rises(r) for r in x.tolist()] == [7, 0]


def _fenwick_rises(perm):
    """Pairs j < k with perm[k] > perm[j] of a permutation of 0..n-1, by a Fenwick tree (exact integers)."""
    n = len(perm)
    tree = [0] * (n + 1)
    out = 0
    for v in perm:
        i = v  # how many earlier values are below v: prefix sum over 1..v
        while i > 0:
            out += tree[i]
            i -= i & -i
        i = v + 1
        while i <= n:
            tree[i] += 1
            i += i & -i
    return out


def test_counts_beyond_float32_precision_are_exact():
    """Counts above 2^24 (where float32 stops counting by ones) stay exact: one row of 12,000 values
    (about 3.6e7 rising pairs) and a 600-position map (about 1.8e7 rising triples)."""
    gen = torch.Generator().manual_seed(32)
    perm = torch.randperm(12000, generator=gen)
    want = _fenwick_rises(perm.tolist())
    assert want > 2**24
    gt, _, _ = ordered_pair_counts(perm.to(torch.float64)[None], count_ties=False)
    assert int(gt[0]) == want and float(gt[0]) == want
    assert rising_pair_counts(perm.to(torch.float64)[None]).tolist() == [want]
    T = 600
    m = torch.randn(T, T, generator=gen, dtype=torch.float64)
    rises = sum(int(np.triu(r[None, :] > r[:, None], 1).sum()) for r in (m[i, :i].numpy() for i in range(T)))
    triples = sum(i * (i - 1) // 2 for i in range(T))
    assert rises > 2**24
    assert float(adjacency_probability_score(m)) == rises / triples
