"""metrics.fingerprint on planted structure whose answer is known in closed form: a sink column,
q/k energy in one frequency pair (both RoPE layouts, partial rotary, grouped-query heads), a massive
dimension. Expected values are written here from the definitions, never by calling the module."""

import math

import pytest
import torch

from poslens.errors import PoslensError
from poslens.metrics.fingerprint import (SINK_EPS, UNROTATED, band_shares, dim_bands, frequency_usage, head_sink,
                                         massive_by_band, massive_dims, pair_energy, rotary_pairs, sink_share)
from poslens.rope import apply_rope, cos_sin, frequency_bands


def _causal_softmax(logits):
    S = logits.shape[-1]
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    return logits.masked_fill(~mask, float("-inf")).softmax(-1)


def test_sink_planted_column_and_uniform_heads():
    # head (0, 1): every query i >= 1 puts weight w on key 0, the rest spread evenly; other heads uniform
    S, w = 12, 0.8
    A = _causal_softmax(torch.zeros(2, 3, S, S, dtype=torch.float64))
    for i in range(1, S):
        A[0, 1, i, : i + 1] = (1 - w) / i
        A[0, 1, i, 0] = w
    sink_heads = A[..., :, 0]  # the scan's map: [L, H, S], weight on key 0 per query
    s = head_sink(sink_heads)
    uniform = sum(1 / (i + 1) for i in range(1, S)) / (S - 1)  # (H_S - 1) / (S - 1)
    assert s[0, 1].item() == pytest.approx(w, abs=1e-12)
    for l, h in [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2)]:
        assert s[l, h].item() == pytest.approx(uniform, abs=1e-12)
    assert uniform < SINK_EPS < w
    share = sink_share(s)
    assert share.tolist() == pytest.approx([1 / 3, 0.0])
    assert sink_share(s, eps=0.05).tolist() == pytest.approx([1.0, 1.0])  # uniform (about 0.2) is above 0.05


def test_sink_leaves_query_zero_out():
    sink_heads = torch.tensor([[[1.0, 0.5, 0.25, 0.25]]])  # query 0 always has weight 1 on key 0
    assert head_sink(sink_heads).item() == pytest.approx(1 / 3)
    assert math.isnan(head_sink(torch.ones(1, 1, 1)).item())


def test_sink_share_strictly_above_eps():
    assert sink_share(torch.tensor([[0.3, 0.31, 0.29, 0.9]], dtype=torch.float64)).tolist() == [0.5]


def _gram(x):
    """per-token second moment of tokens x [n, D]"""
    return x.T @ x / x.shape[0]


def _tokens_in_pair(n, D, dims, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, D, dtype=torch.float64)
    x[:, dims] = scale * torch.randn(n, len(dims), generator=g, dtype=torch.float64)
    return x


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_pairs_layouts(layout):
    a, b = rotary_pairs(8, layout)
    expect = [(0, 4), (1, 5), (2, 6), (3, 7)] if layout == "half" else [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert list(zip(a.tolist(), b.tolist())) == expect


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_energy_in_one_pair_has_share_one(layout):
    D, l0 = 16, 5
    a, b = rotary_pairs(D, layout)
    pair = [int(a[l0]), int(b[l0])]
    q = _tokens_in_pair(200, D, pair, 3.0, seed=1)
    k = _tokens_in_pair(200, D, pair, 0.5, seed=2)
    shares, unrot = frequency_usage(_gram(q)[None, None], _gram(k)[None, None], D, layout)
    expect = torch.zeros(D // 2, dtype=torch.float64)
    expect[l0] = 1.0
    assert torch.allclose(shares[0, 0], expect, atol=1e-12)
    assert unrot.item() == pytest.approx(0.0, abs=1e-12)


def test_shares_closed_form_two_pairs_and_grouped_heads():
    # q energy a_l, k energy b_l in pairs 0 and 3: shares sqrt(a_l b_l) / sum; 2 query heads per KV head
    D = 8
    qg = torch.zeros(1, 4, D, D, dtype=torch.float64)
    kg = torch.zeros(1, 2, D, D, dtype=torch.float64)
    for h in range(4):
        qg[0, h, 0, 0] = qg[0, h, 4, 4] = 2.0  # E|q_0|^2 = 4
        qg[0, h, 3, 3] = qg[0, h, 7, 7] = 0.5 * (h + 1)  # E|q_3|^2 = h + 1
    kg[0, 0].diagonal()[:] = 1.0  # every pair: E|k_l|^2 = 2
    kg[0, 1, 3, 3] = 8.0  # KV head 1 (query heads 2, 3): energy in pair 3 only
    shares, unrot = frequency_usage(qg, kg, D, "half")
    for h in range(4):
        if h < 2:
            u0, u3 = math.sqrt(4 * 2), math.sqrt((h + 1) * 2)
        else:
            u0, u3 = 0.0, math.sqrt((h + 1) * 8)
        tot = u0 + u3
        assert shares[0, h].tolist() == pytest.approx([u0 / tot, 0, 0, u3 / tot], abs=1e-12)
    assert torch.allclose(shares.sum(-1) + unrot, torch.ones(1, 4, dtype=torch.float64))


def test_rope_keeps_pair_energy():
    # the share is a property of the pair norms, which RoPE keeps: post-RoPE tokens give the same energies
    D, n = 8, 64
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, D, generator=g, dtype=torch.float64)
    cos, sin = cos_sin(torch.arange(n), D, 100.0, dtype=torch.float64)
    y = apply_rope(x, cos, sin)
    pe_x, _ = pair_energy(_gram(x), D)
    pe_y, _ = pair_energy(_gram(y), D)
    assert torch.allclose(pe_x, pe_y, atol=1e-12)
    assert not torch.allclose(_gram(x).diagonal(), _gram(y).diagonal(), atol=1e-3)  # single dims do change


def test_partial_rotary_energy_outside_prefix_is_unrotated():
    D, r = 12, 8
    q = _tokens_in_pair(100, D, [9, 10], seed=4)  # beyond the rotary prefix 0..7
    shares, unrot = frequency_usage(_gram(q)[None, None], _gram(q)[None, None], r, "half")
    assert shares.abs().max().item() == pytest.approx(0.0, abs=1e-12)
    assert unrot.item() == pytest.approx(1.0, abs=1e-12)


def test_band_shares_sum_pairs_by_wavelength():
    D, S = 64, 256
    labels = frequency_bands(D, 10000.0, S)
    assert labels[0] == "high" and labels[-1] == "low"
    l_low = len(labels) - 1
    q = _tokens_in_pair(100, D, [l_low, l_low + D // 2], seed=5)
    shares, unrot = frequency_usage(_gram(q)[None, None], _gram(q)[None, None], D)
    b = band_shares(shares, unrot, labels)
    assert b["low"].item() == pytest.approx(1.0) and b["high"].item() == pytest.approx(0.0)
    assert set(b) == {"high", "medium", "low", UNROTATED}
    with pytest.raises(PoslensError):
        band_shares(shares, unrot, labels[:-1])


def test_massive_dimension_planted():
    # every dim of every head has RMS 1 except head 1's dim 30 (RMS 40): mean RMS = (2*32 - 1 + 40) / 64
    H, D = 2, 32
    x = torch.randn(4000, H, D, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    x = x / x.pow(2).mean(0).sqrt()  # unit RMS exactly
    x[:, 1, 30] *= 40.0
    gram = torch.einsum("nhd,nhe->hde", x, x)[None] / x.shape[0]  # [1, H, D, D]
    mask = massive_dims(gram)
    assert mask.sum().item() == 1 and bool(mask[0, 1, 30])
    mean = (H * D - 1 + 40) / (H * D)
    assert 40 > 5 * mean > 1
    assert massive_dims(gram, lam=41 / mean).sum().item() == 0  # 40 < 41: not above lambda * mean
    # dim 30 of a rotate_half head of 32 is pair 14, the lowest-frequency but one
    labels = frequency_bands(D, 10000.0, 128)
    bands = dim_bands(D, D, labels)
    assert bands[30] == labels[14] == "low"
    counts = massive_by_band(mask[0], bands)
    assert counts["low"].item() == 1 and counts["high"].item() == 0 and counts[UNROTATED].item() == 0
    assert dim_bands(D, D, None) == [UNROTATED] * D


def test_input_errors():
    with pytest.raises(PoslensError):
        frequency_usage(torch.zeros(1, 3, 4, 4), torch.zeros(1, 2, 4, 4), 4)
    with pytest.raises(PoslensError):
        pair_energy(torch.zeros(2, 4, 4), 6)
    with pytest.raises(PoslensError):
        rotary_pairs(4, "spiral")
