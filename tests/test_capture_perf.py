"""Correctness of the faster capture kernels (no timing asserts; speed lives in benchmarks/).

The blocked symmetric Gram product, the fused RoPE inverse, the grouped (non-repeated) GQA keys
and the cache-sized causal chunks must give what the direct float64 computations give, for
sequences longer than one Gram block and chunk sizes that do not divide the sequence.
"""

from __future__ import annotations

import math

import pytest
import torch

from poslens.capture import attention as att
from poslens.rope import unapply_rope


def _direct(q, k, scaling, causal=True, window=None):
    """Float64 reference: scores (masked entries 0), probs, slash [H, S] for q [B,H,S,D], k [B,Hk,S,D]."""
    q, k = q.double(), k.double()
    B, H, S, D = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) * scaling
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    allowed = torch.ones(S, S, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= (i - j) < window
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
    scores = (s * (allowed if causal else torch.ones(S, S, dtype=torch.bool))).mean((0, 1))  # unseen entries 0
    slash = torch.stack([torch.diagonal(p, -d, 2, 3).sum(-1) / (S - d) for d in range(S)], -1).sum(0)
    return scores, p.mean((0, 1)), slash, s, p


def _capture(B, H, Hk, S, D, chunk_elems, heads=(), rope=False):
    spec = att.CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=[0],
                           rope_layers={0} if rope else set(), heads=list(heads), chunk_elems=chunk_elems)
    return att.Capture(spec)


@pytest.mark.parametrize("B,H,Hk,S,causal,window,chunk", [
    (2, 4, 4, 300, True, None, 4 * 4 * 300 * 7),    # 7-row chunks, MHA
    (1, 6, 2, 301, True, None, 10**9),              # one chunk, GQA 3:1
    (3, 4, 1, 97, True, 20, 3 * 4 * 97 * 5),        # sliding window, MQA
    (2, 4, 2, 130, False, None, 2 * 4 * 130 * 9),   # bidirectional control
    (2, 4, 2, 192, True, None, 2 * 4 * 192 * 50),   # S a multiple of 64: blocked dim_logit, ragged last chunk
    (1, 2, 1, 128, False, None, 2 * 128 * 24),      # bidirectional, blocked dim_logit
])
def test_chunked_attention_statistics_match_float64(B, H, Hk, S, causal, window, chunk):
    g = torch.Generator().manual_seed(0)
    D = 16
    q = torch.randn(B, H, S, D, generator=g) * 2
    k = torch.randn(B, Hk, S, D, generator=g) * 2
    out = torch.randn(B, H, S, D, generator=g)
    scaling = 1 / math.sqrt(D) * 1.3
    cap = _capture(B, H, Hk, S, D, chunk, heads=[(0, 0), (0, H - 1)])
    cap.begin_batch(B)
    cap.observe_attention(0, q, k, out, scaling, causal=causal, window=window)
    cap.end_batch()
    m = cap.means()
    scores, probs, slash, s, p = _direct(q, k, scaling, causal, window)
    assert (m["scores"][0] - scores).abs().max() <= 1e-5
    assert (m["probs"][0] - probs).abs().max() <= 1e-5
    assert (m["slash"][0] - slash / B).abs().max() <= 1e-5
    if causal:
        assert bool((m["scores"][0].triu(1) == 0).all())
    hs = s[:, H - 1].masked_fill(p[:, H - 1] == 0, 0.0).mean(0)  # masked entries (causal, window) stored as 0
    assert (m["head_scores"][1] - hs).abs().max() <= 1e-5
    assert (m["head_probs"][0] - p[:, 0].mean(0)).abs().max() <= 1e-5
    # dim_logit sums to the mean causal score over the pairs a query sees (j <= i, inside the window)
    kr = k.double().repeat_interleave(H // Hk, 1)
    tri = torch.ones(S, S, dtype=torch.bool).tril()
    if window is not None and causal:
        tri &= (torch.arange(S)[:, None] - torch.arange(S)[None, :]) < window
    ref_dim = (q.double()[..., :, None, :] * kr[..., None, :, :] * tri[..., None]).sum((2, 3)).mean(0) * scaling
    assert torch.allclose(m["dim_logit"][0], ref_dim / int(tri.sum()), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("S,d", [(5, 3), (256, 8), (257, 8), (700, 12)])
def test_symmetric_gram_equals_full_product(S, d):
    a = torch.randn(S, d, generator=torch.Generator().manual_seed(S))
    got = att._symmetric_gram(a)
    assert torch.allclose(got.double(), a.double() @ a.double().T, atol=1e-5)
    assert bool((got == got.T).all())


def test_cosine_accumulators_match_float64():
    g = torch.Generator().manual_seed(3)
    B, S, H, D = 2, 600, 3, 8
    x = torch.randn(B, S, H, D, generator=g)
    cap = _capture(B, H, H, S, D, 2**20)
    cap._add_cosine("attn_cosine", "attn_norms", 0, x)  # [B, S, H, D]: trailing dims flattened
    cap.observe_hidden(1, x.reshape(B, S, H * D))
    xf = x.reshape(B, S, H * D).double()
    xn = xf / xf.norm(dim=-1, keepdim=True)
    ref = (xn @ xn.transpose(1, 2)).sum(0)
    for name, idx in (("attn_cosine", 0), ("cosine", 1)):
        assert (cap.accs[name].sum[idx] - ref).abs().max() <= 1e-5
    assert torch.allclose(cap.accs["norms"].sum[1], xf.norm(dim=-1).sum(0), rtol=1e-6)


@pytest.mark.parametrize("D,r", [(16, 16), (16, 8)])
def test_unrotate_equals_unapply_rope(D, r):
    g = torch.Generator().manual_seed(4)
    B, H, S = 2, 3, 11
    ang = torch.rand(B, S, r // 2, generator=g) * 6
    scale = 1.7  # scaled RoPE: cos^2 + sin^2 = attention_scaling^2
    cos = torch.cat([ang.cos(), ang.cos()], -1) * scale
    sin = torch.cat([ang.sin(), ang.sin()], -1) * scale
    x = torch.randn(B, H, S, D, generator=g)
    cap = _capture(B, H, H, S, D, 2**20, rope=True)
    cap.rope_cos_sin = (cos, sin)
    got, _ = cap.unrotate(x, x)
    c, s = cos[:, None].double(), sin[:, None].double()
    ref = unapply_rope(x.double(), c, s)
    ref = torch.cat([ref[..., :r] / scale**2, ref[..., r:]], -1)
    assert (got.double() - ref).abs().max() <= 1e-5
