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
from poslens.metrics import diagonal_trend, within_diagonal_rms
from poslens.metrics.slash import sink_weight

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
    G = 16
    # group means of a flat map: shared offset per group (correlated entries) plus independent noise
    groups = 0.3 + 0.01 * torch.randn(G, 1, 1, generator=g, dtype=torch.float64) \
        + 0.01 * torch.randn(G, S, S, generator=g, dtype=torch.float64)
    noisy = groups.mean(0)
    assert is_flat(noisy, groups)
    assert relativity_index(noisy, groups) is None
    assert locality(noisy, groups) is None
    # the same noise with a real trend 20x the noise of the mean is not flat and purely relative
    trend = toeplitz(lambda k: -0.05 * k / S).nan_to_num(0)
    assert not is_flat(noisy + trend, groups + trend)
    assert relativity_index(noisy + trend, groups + trend) == pytest.approx(1.0, abs=0.05)
    # exactly constant map without groups is flat
    assert relativity_index(torch.full((S, S), 0.5, dtype=torch.float64)) is None


def test_sink_column_is_excluded():
    """A perfectly Toeplitz map with one raised column 0 (an attention sink) is purely relative once key 0
    is left out; with it, the index says otherwise (0.44 in the issue that asked for this)."""
    m = toeplitz(lambda k: torch.exp(-0.3 * k))
    m[1:, 0] += 2.0
    assert relativity_index(m, exclude_keys=(0,)) == pytest.approx(1.0)
    assert relativity_index(m) < 0.6
    assert locality(m, exclude_keys=(0,)) == pytest.approx(1.0)
    assert locality(m) < 0.9
    assert within_diagonal_rms(m, exclude_keys=(0,)) == pytest.approx(0.0, abs=1e-12)
    assert diagonal_trend(m, exclude_keys=(0,)) == 0.0  # constant diagonals: no trend
    # the sink's own number
    A = torch.tril(torch.ones(S, S, dtype=torch.float64))
    A[:, 0] += 3.0
    A = A / A.sum(-1, keepdim=True)
    want = float(sum(4.0 / (3.0 + i + 1) for i in range(1, S)) / (S - 1))
    assert float(sink_weight(A)) == pytest.approx(want)


def test_diagonal_trend_sign_against_scipy():
    """+1 when the entry further right on every diagonal is higher; equals an independent pair-weighted
    average of scipy's Kendall tau per diagonal."""
    from scipy.stats import kendalltau

    i = torch.arange(S, dtype=torch.float64)
    right_higher = (0.1 * i[None, :]).expand(S, S).clone()
    right_higher = right_higher.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("nan"))
    assert diagonal_trend(right_higher) == pytest.approx(1.0)
    assert diagonal_trend(-right_higher) == pytest.approx(-1.0)
    g = torch.Generator().manual_seed(3)
    r = torch.randn(S, S, generator=g, dtype=torch.float64) + 0.05 * i[None, :]
    r = r.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("nan"))

    def reference(m, skip):
        num = den = 0.0
        for k in range(1, S):
            d = torch.diagonal(m, offset=-k).numpy()[skip:]
            if len(d) >= 2:
                pairs = len(d) * (len(d) - 1) / 2
                num += kendalltau(d, range(len(d))).statistic * pairs
                den += pairs
        return num / den

    assert diagonal_trend(r) == pytest.approx(reference(r, 0))
    # with key 0 excluded, each diagonal loses its first entry
    assert diagonal_trend(r, exclude_keys=(0,)) == pytest.approx(reference(r, 1))
    # ties count one half: a Toeplitz map has no trend
    assert diagonal_trend(toeplitz(lambda k: torch.exp(-k))) == 0.0


def test_within_diagonal_rms_in_score_units():
    i = torch.arange(S, dtype=torch.float64)
    col = (0.5 * (-1.0) ** i)[None, :].expand(S, S).clone()  # +-0.5 by column: RMS 0.5 after centring
    m = (col + toeplitz(lambda k: k).nan_to_num(0)).masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("nan"))
    lower = torch.ones(S, S, dtype=torch.bool).tril(-1)
    dn = diagonal_normalize(m)
    assert within_diagonal_rms(m) == pytest.approx(float((dn[lower] ** 2).mean().sqrt()))
    assert 0.45 < within_diagonal_rms(m) <= 0.5


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
