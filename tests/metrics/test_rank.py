"""metrics.rank against hand-computed spectra and explicitly labelled rotary dimensions.

Expected values come from numpy's eigen-solver or from diagonal matrices whose spectrum is read
off by hand, never from poslens.metrics.rank itself.
"""

import math

import numpy as np
import pytest
import torch

from poslens.metrics.rank import band_contributions, rank_measures, spectrum


def test_spectrum_of_the_symmetric_part_descending_batched():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 5, 5, generator=gen, dtype=torch.float64)
    sym = a @ a.transpose(-1, -2)  # PSD
    skew = a - a.transpose(-1, -2)  # dropped by the symmetrisation
    ev = spectrum((sym + skew).to(torch.float32))
    assert ev.dtype == torch.float64 and ev.shape == (2, 3, 5)
    for i in range(2):
        for j in range(3):
            want = np.sort(np.linalg.eigvalsh(sym[i, j].numpy()))[::-1]
            np.testing.assert_allclose(ev[i, j].numpy(), want, rtol=1e-5, atol=1e-4)


def test_spectrum_clamps_negative_eigenvalues():
    ev = spectrum(torch.diag(torch.tensor([3.0, -2.0, 1.0])))
    assert ev.tolist() == [3.0, 1.0, 0.0]


def _entropy_rank(p):
    return math.exp(-sum(x * math.log(x) for x in p if x > 0))


def test_rank_measures_hand_computed():
    g = torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64))
    r = rank_measures(g)
    p = [0.4, 0.3, 0.2, 0.1]
    assert float(r["top1_energy"]) == pytest.approx(0.4, rel=1e-12)
    assert float(r["effective_rank"]) == pytest.approx(_entropy_rank(p), rel=1e-12)
    assert int(r["n95"]) == 4  # 0.4, 0.7, 0.9 < 0.95 <= 1.0
    assert int(rank_measures(g, energy=0.75)["n95"]) == 3  # 0.7 < 0.75 <= 0.9
    assert int(rank_measures(g, energy=0.4)["n95"]) == 1  # the first value reaches exactly 0.4
    assert int(rank_measures(g, energy=0.41)["n95"]) == 2
    # equal values: a share that reaches the energy exactly counts as reaching it
    eq = torch.eye(4, dtype=torch.float64)
    assert int(rank_measures(eq, energy=0.5)["n95"]) == 2
    assert float(rank_measures(eq)["effective_rank"]) == pytest.approx(4.0, rel=1e-12)


def test_rank_measures_small_scale_and_rank_deficient():
    # the result is scale-free: a tiny second moment reads the same as a large one
    g = 1e-6 * torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64))
    r = rank_measures(g)
    assert float(r["top1_energy"]) == pytest.approx(0.4, rel=1e-9)
    assert float(r["effective_rank"]) == pytest.approx(_entropy_rank([0.4, 0.3, 0.2, 0.1]), rel=1e-9)
    # zero eigenvalues contribute nothing (0 log 0 = 0), not NaN
    r = rank_measures(torch.diag(torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)))
    assert float(r["effective_rank"]) == pytest.approx(2.0, rel=1e-12)
    assert int(r["n95"]) == 2 and float(r["top1_energy"]) == pytest.approx(0.5)
    # rank one: one value holds everything
    v = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.float64)
    r = rank_measures(torch.outer(v, v))
    assert float(r["top1_energy"]) == pytest.approx(1.0, abs=1e-12)
    assert float(r["effective_rank"]) == pytest.approx(1.0, abs=1e-9)
    assert int(r["n95"]) == 1


def test_rank_measures_batched_per_matrix():
    g = torch.stack([torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0])), torch.diag(torch.tensor([1.0, 0.0, 0.0, 0.0])),
                     torch.eye(4)]).to(torch.float64)
    r = rank_measures(g.view(3, 1, 4, 4))
    assert r["top1_energy"].shape == (3, 1) and r["n95"].shape == (3, 1)
    assert r["top1_energy"].flatten().tolist() == pytest.approx([0.4, 1.0, 0.25])
    assert r["effective_rank"].flatten().tolist() == pytest.approx([_entropy_rank([0.4, 0.3, 0.2, 0.1]), 1.0, 4.0])
    assert r["n95"].flatten().tolist() == [4, 1, 4]
    # the zero matrix: no energy anywhere; n95 is capped at the dimension
    z = rank_measures(torch.zeros(3, 3))
    assert int(z["n95"]) == 3 and float(z["top1_energy"]) == 0.0


def test_band_contributions_batched_labels_and_dtypes():
    D, r = 10, 8
    x = (2.0 ** torch.arange(D, dtype=torch.float64)).repeat(2, 3, 1)
    x[1] *= -1
    out = band_contributions(x.to(torch.float32), r, 10000.0, 64)
    assert set(out) == {"high", "medium", "low", "unrotated"}
    # base 10000, r = 8, context 64: pair l = 0 high, 1 medium, 2 and 3 low (wavelengths 6.3, 63, 628, 6283)
    want = {"high": [0, 4], "medium": [1, 5], "low": [2, 6, 3, 7], "unrotated": [8, 9]}
    for band, dims in want.items():
        assert out[band].dtype == torch.float64 and out[band].shape == (2, 3)
        assert out[band][0].tolist() == [float(sum(2.0**d for d in dims))] * 3
        assert out[band][1].tolist() == [-float(sum(2.0**d for d in dims))] * 3


def test_band_contributions_full_rotary_and_empty_bands():
    x = 2.0 ** torch.arange(8, dtype=torch.float64)
    out = band_contributions(x, 8, 10000.0, 64)
    assert set(out) == {"high", "medium", "low"}  # nothing beyond the rotary dims: no "unrotated" band
    # a long context: every wavelength is below sqrt(2 pi * context) or the context -> no low band
    out = band_contributions(x.repeat(3, 1), 8, 10000.0, 10**9)
    assert out["low"].tolist() == [0.0, 0.0, 0.0] and out["low"].dtype == torch.float64
    assert out["low"].shape == (3,)
    # no rotary dimension, or no base: everything is unrotated
    assert set(band_contributions(x, 0, 10000.0, 64)) == {"unrotated"}
    u = band_contributions(x.repeat(2, 1).to(torch.float32), 8, None, 64)
    assert set(u) == {"unrotated"} and u["unrotated"].tolist() == [255.0, 255.0]
    assert u["unrotated"].dtype == torch.float64
