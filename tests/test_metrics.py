import math

import pytest
import torch

from poslens.metrics import (
    adjacency_probability_score,
    diagonal_means,
    diagonal_normalize,
    is_flat,
    locality,
    norm_score,
    relativity_index,
    rising_pair_fraction,
)

S = 12


def toeplitz(f):
    i = torch.arange(S, dtype=torch.float64)
    m = f(i[:, None] - i[None, :])
    return m.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("nan"))


def test_diagonal_normalisation_flattens_toeplitz():
    m = toeplitz(lambda k: torch.exp(-0.3 * k))
    dn = diagonal_normalize(m)
    lower = torch.ones(S, S, dtype=torch.bool).tril()
    assert torch.allclose(dn[lower], torch.zeros(int(lower.sum()), dtype=torch.float64), atol=1e-15)
    assert torch.isnan(dn[0, 1])
    torch.testing.assert_close(diagonal_means(m), torch.exp(-0.3 * torch.arange(S, dtype=torch.float64)))


def test_diagonal_normalisation_batched_matches_single():
    maps = torch.randn(3, S, S, dtype=torch.float64)
    dn = diagonal_normalize(maps)
    for b in range(3):
        torch.testing.assert_close(dn[b], diagonal_normalize(maps[b]), equal_nan=True)


def test_relativity_index_bounds():
    assert relativity_index(toeplitz(lambda k: 1.0 / (1 + k))) == pytest.approx(1.0)
    # a map depending on the key column only, constant along... j: purely non-relative structure
    j = torch.arange(S, dtype=torch.float64)
    col = (j[None, :] * torch.ones(S, 1, dtype=torch.float64)).masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("nan"))
    ri = relativity_index(col)
    assert 0.0 <= ri < 0.5


def test_relativity_index_known_mixture():
    # m = a(i - j) + b(j) with var contributions known: the index is Var(a-part)/Var(total)
    # when the two parts are uncorrelated over the lower triangle; check the formula directly.
    i = torch.arange(S, dtype=torch.float64)
    rel = (i[:, None] - i[None, :]) * 0.1
    absj = torch.sin(i)[None, :].expand(S, S)
    m = (rel + absj).masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("nan"))
    lower = torch.ones(S, S, dtype=torch.bool).tril(-1)
    dn = diagonal_normalize(m)[lower]
    v = m[lower]
    want = 1 - float((dn**2).mean()) / float(v.var(unbiased=False))
    assert relativity_index(m) == pytest.approx(want)


def test_flat_map_is_null_and_noise_is_recognised():
    g = torch.Generator().manual_seed(0)
    se = torch.full((S, S), 0.01, dtype=torch.float64)
    noisy = 0.3 + 0.01 * torch.randn(S, S, generator=g, dtype=torch.float64)
    assert is_flat(noisy, se)
    assert relativity_index(noisy, se) is None
    assert locality(noisy, se) is None
    # the same noise with a real trend 20x the stderr is not flat
    trend = noisy + toeplitz(lambda k: -0.2 * k / S).nan_to_num(0)
    assert not is_flat(trend, se)
    assert relativity_index(trend, se) == pytest.approx(1.0, abs=0.05)
    # exactly constant map without stderr is flat
    assert relativity_index(torch.full((S, S), 0.5, dtype=torch.float64)) is None


def test_locality_extremes():
    rising = toeplitz(lambda k: -k)  # closer keys (smaller k) score higher
    assert locality(rising) == pytest.approx(1.0)
    assert locality(toeplitz(lambda k: k)) == pytest.approx(-1.0)


def test_aps_known_values():
    i = torch.arange(1, S + 1, dtype=torch.float64)
    running = (torch.minimum(i[:, None], i[None, :]) / torch.maximum(i[:, None], i[None, :])).sqrt()
    assert float(adjacency_probability_score(running)) == pytest.approx(1.0)
    assert float(adjacency_probability_score(torch.ones(S, S))) == 0.0  # ties never count
    # random symmetric matrix: close to chance
    g = torch.Generator().manual_seed(1)
    r = torch.rand(64, 64, generator=g, dtype=torch.float64)
    assert abs(float(adjacency_probability_score(r)) - 0.5) < 0.03
    # brute-force triple count on a small random matrix
    r = torch.rand(7, 7, generator=g, dtype=torch.float64)
    hits = sum(r[a, k] > r[a, j] for a in range(7) for k in range(a) for j in range(k))
    assert float(adjacency_probability_score(r)) == pytest.approx(float(hits) / math.comb(7, 3))


def test_norm_score():
    assert float(norm_score(torch.arange(S, 0, -1, dtype=torch.float64))) == pytest.approx(1.0)
    assert float(norm_score(torch.arange(S, dtype=torch.float64))) == pytest.approx(0.0)


def test_rising_pair_fraction_batched():
    m = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    out = rising_pair_fraction(m)
    assert out.shape == (2, 3)
    assert float(out[1, 2]) == pytest.approx(float(rising_pair_fraction(m[1, 2])))
