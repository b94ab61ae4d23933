"""Correctness of the faster capture kernels (no timing asserts; speed lives in benchmarks/).

The blocked symmetric Gram product, the fused RoPE inverse, the grouped (non-repeated) GQA keys
and the cache-sized causal chunks must give what the direct float64 computations give, for
sequences longer than one Gram block and chunk sizes that do not divide the sequence.
"""

from __future__ import annotations

import math

import pytest
import torch

from poslens.capture.backends.blocks import BlockMaps
from poslens.capture.backends.rope import half_layout_perm, unrotate_qk
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import CaptureSpec, parse_stats
from poslens.capture.backends import choice as backends
from poslens.capture.backends.attnpass import AttentionPass
from poslens.capture.backends.sums import LayerMaps, Workspace
from poslens.capture.statistics.builtin.base import LayerBatch
from poslens.capture.statistics.builtin.cosine import add_cosine, cosine_rows
from poslens.capture.statistics.builtin.qk import STATISTIC as QK
from poslens.capture.backends.gram import symmetric_gram
from poslens.capture.backends.kernels import finite
from poslens.metrics.ties import equal_row_representatives
from poslens.metrics.neighborhood import per_sequence_aps
from poslens.rope import unapply_rope
from poslens.runtime import numpy_blas_threads


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
    spec = CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=[0],
                           rope_layers={0} if rope else set(), heads=list(heads), chunk_elems=chunk_elems)
    return Capture(spec)


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
    got = symmetric_gram(a)
    assert torch.allclose(got.double(), a.double() @ a.double().T, atol=1e-5)
    assert bool((got == got.T).all())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("S,d", [(5, 3), (257, 8), (700, 12), (1030, 16)])
def test_lower_symmetric_gram_writes_the_lower_triangle_only(S, d, threads):
    """``lower=True`` (scipy's ssyrk on one thread, torch's row bands on more): the lower triangle,
    diagonal included, is the product's; the strict upper triangle keeps what the buffer held (here
    a sentinel), not a mirrored copy."""
    a = torch.randn(S, d, generator=torch.Generator().manual_seed(S))
    out = torch.full((S, S), 7.0)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = symmetric_gram(a, out=out, lower=True)
    finally:
        torch.set_num_threads(before)
    assert got.data_ptr() == out.data_ptr()
    full = symmetric_gram(a)
    below = torch.ones(S, S, dtype=torch.bool).tril()
    # ssyrk, torch's bands and the full product are different BLAS kernels (which ones depends on the CPU):
    # equal to rounding
    torch.testing.assert_close(got[below], full[below], rtol=1e-5, atol=1e-5)
    assert bool((got[~below] == 7.0).all())
    assert torch.allclose(got.tril().double(), (a.double() @ a.double().T).tril(), atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("lower", [False, True])
def test_symmetric_gram_keeps_identical_rows_tied(threads, lower):
    """Identical rows (a repeated token's embedding in a one-sequence batch) have bitwise-equal
    entries in every row and column of the Gram, as in one whole product: the quarters and leaves
    are separate products that rounded them apart, and the APS counted those last bits as rises."""
    gen = torch.Generator().manual_seed(43)
    vocab = torch.nn.functional.normalize(torch.randn(8, 64, generator=gen), dim=-1)
    tokens = torch.randint(0, 8, (300,), generator=gen)
    a = vocab[tokens]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = symmetric_gram(a, out=torch.zeros(300, 300), lower=True) if lower else symmetric_gram(a)
    finally:
        torch.set_num_threads(before)
    if lower:
        assert bool((got.triu(1) == 0).all())  # the fix-up writes the lower triangle only
        got = got + got.tril(-1).T
    assert torch.allclose(got.double(), a.double() @ a.double().T, atol=1e-5)
    first = {}
    for i, t in enumerate(tokens.tolist()):
        r = first.setdefault(t, i)
        assert torch.equal(got[i], got[r]) and torch.equal(got[:, i], got[:, r]), (i, r)
    # distinct rows are left alone: no tie is made between rows that merely share sampled columns
    b = torch.randn(300, 64, generator=gen)
    b[7] = b[100]
    b[8] = b[100]
    b[8, 1] += 1.0  # equal to row 100 except in one column
    g2 = symmetric_gram(b, out=torch.zeros(300, 300), lower=True) if lower else symmetric_gram(b)
    if lower:
        g2 = g2 + g2.tril(-1).T
    assert torch.equal(g2[7], g2[100])
    assert not torch.equal(g2[8], g2[100])
    assert equal_row_representatives(torch.randn(50, 64, generator=gen)) is None


def test_numpy_blas_threads_follow_torchs_and_are_restored():
    """The CPU Gram runs numpy's BLAS on torch's thread count, not on numpy's own pool of every CPU."""
    import numpy as np  # noqa: F401  (numpy's BLAS loaded before threadpoolctl looks)
    from threadpoolctl import threadpool_info

    def blas_threads():  # numpy's own BLAS (scipy may load another, after the controller was made)
        return {i["filepath"]: i["num_threads"] for i in threadpool_info()
                if i["user_api"] == "blas" and "numpy" in i["filepath"]}
    before = blas_threads()
    if not before:
        pytest.skip("numpy reports no BLAS library to threadpoolctl here")
    with numpy_blas_threads(1):
        assert set(blas_threads().values()) == {1}
    assert blas_threads() == before


@pytest.mark.parametrize("S", [600, 200])  # past aps_max_positions (one Gram), within it (the sequences' maps summed)
def test_cosine_accumulators_match_float64(S):
    g = torch.Generator().manual_seed(3)
    B, H, D = 2, 3, 8
    x = torch.randn(B, S, H, D, generator=g)
    cap = _capture(B, H, H, S, D, 2**20)
    add_cosine(cap, ("attn_cosine", "attn_norms", "attn_aps_seq"), 0, x)  # [B, S, H, D]: trailing dims flattened
    cap.observe_hidden(1, x.reshape(B, S, H * D))
    xf = x.reshape(B, S, H * D).double()
    xn = xf / xf.norm(dim=-1, keepdim=True)
    ref = (xn @ xn.transpose(1, 2)).sum(0)
    for name, idx in (("attn_cosine", 0), ("cosine", 1)):
        assert cap.accs[name].lower
        assert bool((cap.accs[name].sum[idx].triu(1) == 0).all())  # the CPU Gram adds its lower triangle only
        assert (cap.accs[name].sum_at(idx) - ref).abs().max() <= 1e-5  # read back whole, mirrored
    assert torch.allclose(cap.accs["norms"].sum[1], xf.norm(dim=-1).sum(0), rtol=1e-6)
    aps = per_sequence_aps(x.reshape(B, S, H * D), cap.spec.aps_max_positions).double()
    assert torch.allclose(cap.accs["aps_seq"].sum[1], aps.sum(), atol=1e-9)
    assert torch.allclose(cap.accs["aps_seq"].sumsq[1], (aps * aps).sum(), atol=1e-9)


def test_summed_sequence_cosine_maps_keep_identical_rows_tied():
    """Within aps_max_positions the batch's cosine map is the sum of the sequences' own maps; rows
    whose vectors are equal in every sequence (the same token at two positions) stay exact ties."""
    gen = torch.Generator().manual_seed(44)
    vocab = torch.randn(6, 96, generator=gen)
    tokens = torch.randint(0, 6, (200,), generator=gen)
    x = torch.stack([vocab[tokens], vocab[tokens] * 2.0])  # [2, 200, 96]: rows equal where tokens are
    cap = _capture(2, 3, 3, 200, 32, 2**20)
    cap.observe_hidden(0, x)
    got = cap.accs["cosine"].sum_at(0)
    xn = torch.nn.functional.normalize(x.double(), dim=-1)
    assert (got - (xn @ xn.transpose(1, 2)).sum(0)).abs().max() <= 1e-5
    first = {}
    for i, t in enumerate(tokens.tolist()):
        r = first.setdefault(t, i)
        assert torch.equal(got[i], got[r]) and torch.equal(got[:, i], got[:, r]), (i, r)


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


# --------------------------------------------------------------------------------------------
# the layer output from the capture's own weights, and --map-size block maps
# --------------------------------------------------------------------------------------------
def _block_means(m: torch.Tensor, f: int, valid: torch.Tensor) -> torch.Tensor:
    """Brute-force reference: mean of the ``valid`` entries of every ``f x f`` block of ``m [..., S, S]``
    (0 where a block has none), by explicit loops over the blocks."""
    S = m.shape[-1]
    n = -(-S // f)
    out = torch.zeros(m.shape[:-2] + (n, n), dtype=torch.float64)
    for bi in range(n):
        for bj in range(n):
            rows, cols = slice(bi * f, (bi + 1) * f), slice(bj * f, (bj + 1) * f)
            v = valid[rows, cols]
            if v.any():
                out[..., bi, bj] = m[..., rows, cols].double()[..., v].mean(-1)
    return out


@pytest.mark.parametrize("B,H,Hk,S,causal,window,softcap,chunk", [
    (2, 4, 4, 40, True, None, None, 2 * 4 * 40 * 7),   # MHA, 7-row chunks
    (2, 6, 2, 33, True, None, None, 10**9),            # GQA 3:1, one chunk
    (1, 4, 1, 29, True, 9, None, 4 * 29 * 5),          # sliding window, MQA
    (2, 4, 2, 21, False, None, None, 2 * 4 * 21 * 4),  # bidirectional control
    (2, 4, 2, 25, True, None, 5.0, 2 * 4 * 25 * 6),    # soft-capped logits (Gemma 2)
])
def test_own_output_equals_eager_attention(B, H, Hk, S, causal, window, softcap, chunk):
    """The output computed from the capture's chunk weights equals eager attention (float64 reference)
    within float32 tolerance, and the statistics are those of a capture given the SDPA output."""
    g = torch.Generator().manual_seed(7)
    D = 16
    q = torch.randn(B, H, S, D, generator=g) * 2
    k = torch.randn(B, Hk, S, D, generator=g) * 2
    v = torch.randn(B, Hk, S, D, generator=g)
    scaling = 1 / math.sqrt(D)
    cap = _capture(B, H, Hk, S, D, chunk, heads=[(0, 1)])
    assert cap.computes_output(0, q, k, window, softcap)
    cap.begin_batch(B)
    got = cap.observe_attention(0, q, k, None, scaling, causal=causal, window=window, softcap=softcap, value=v)
    cap.end_batch()
    # eager reference in float64: capped logits, mask, softmax, p @ v with repeated KV heads
    qd, kd, vd = q.double(), k.double().repeat_interleave(H // Hk, 1), v.double().repeat_interleave(H // Hk, 1)
    s = qd @ kd.transpose(-1, -2) * scaling
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    allowed = torch.ones(S, S, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= (i - j) < window
    ref = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ vd
    assert got.shape == (B, H, S, D)
    assert (got.double() - ref).abs().max() <= 1e-5
    # same statistics as the capture that is handed an output (SDPA's) instead
    other = _capture(B, H, Hk, S, D, chunk, heads=[(0, 1)])
    other.spec.own_output = False
    assert not other.computes_output(0, q, k, window, softcap)
    other.begin_batch(B)
    other.observe_attention(0, q, k, ref.float(), scaling, causal=causal, window=window, softcap=softcap)
    other.end_batch()
    a, b = cap.means(), other.means()
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, equal_nan=True, msg=name)


@pytest.mark.parametrize("S,N,window,causal,chunk", [
    (48, 12, None, True, 4 * 48 * 5),    # f = 4 divides S; chunks of 5 rows straddle block rows
    (50, 12, None, True, 4 * 50 * 3),    # f = 5, S = 50: 10 blocks (fewer than N)
    (47, 10, None, True, 10**9),         # f = 5, ragged last block (2 positions), one chunk
    (45, 9, 7, True, 4 * 45 * 4),        # sliding window: blocks outside it have no visible entry
    (30, 7, None, False, 4 * 30 * 4),    # bidirectional: every entry visible
])
def test_block_maps_equal_block_means_of_full_maps(S, N, window, causal, chunk):
    g = torch.Generator().manual_seed(S)
    B, H, Hk, D = 1, 4, 2, 8
    q = torch.randn(B, H, S, D, generator=g) * 2
    k = torch.randn(B, Hk, S, D, generator=g) * 2
    v = torch.randn(B, Hk, S, D, generator=g)
    x = torch.randn(B, S, 24, generator=g)
    res = {}
    for map_size in (0, N):
        spec = CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=[0],
                               heads=[(0, 2)], chunk_elems=chunk, map_size=map_size)
        cap = Capture(spec)
        cap.begin_batch(B)
        cap.observe_attention(0, q, k, None, 0.3, causal=causal, window=window, value=v)
        cap.observe_hidden(0, x)
        cap.end_batch()
        res[map_size] = cap.means()
    full, blk = res[0], res[N]
    f = -(-S // N)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    valid = (j <= i) if causal else torch.ones(S, S, dtype=torch.bool)
    if window is not None:
        valid = valid & ((i - j) < window)
    n = -(-S // f)
    assert blk["scores"].shape == (1, n, n) and blk["cosine"].shape == (2, n, n)
    for name in ("scores", "probs", "head_scores", "head_probs"):
        torch.testing.assert_close(blk[name], _block_means(full[name], f, valid), rtol=0, atol=1e-6, msg=name)
    all_valid = torch.ones(S, S, dtype=torch.bool)  # cosine maps: symmetric, every entry defined
    for name in ("cosine", "attn_cosine"):
        torch.testing.assert_close(blk[name], _block_means(full[name], f, all_valid), rtol=0, atol=1e-6, msg=name)
    for name in ("slash", "norms", "attn_norms", "dim_logit", "q_gram", "aps_seq", "score_groups"):
        torch.testing.assert_close(blk[name], full[name], rtol=0, atol=1e-9, msg=name)  # O(S) statistics: exact
    torch.testing.assert_close(blk["probs_key0"][0], full["probs"][0][:, 0], rtol=0, atol=1e-7)  # the sink column
    # blocks without a visible entry are the zero blocks, and exactly those
    empty = BlockMaps(S, N).counts(causal, window) == 0
    assert bool((blk["scores"][0][empty] == 0).all())
    if causal:
        upper = torch.ones(n, n, dtype=torch.bool).triu(1)
        assert bool(empty[upper].all()) and not bool(empty.diagonal().any())
        if window is None:
            assert torch.equal(empty, upper)


@pytest.mark.parametrize("S,N,causal", [(48, 12, True), (47, 10, True), (30, 7, False), (20, 40, True)])
def test_whole_layer_maps_reduce_to_the_block_means(S, N, causal, monkeypatch):
    """A whole layer's float32 maps handed as one piece (the Triton backend's), put into the layer's
    --map-size sums band by band (bands of a few block rows here), equal the brute-force block means."""
    from poslens.capture.backends import sums

    g = torch.Generator().manual_seed(S + N)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    valid = (j <= i) if causal else torch.ones(S, S, dtype=torch.bool)
    full = {"scores": torch.randn(S, S, generator=g).masked_fill(~valid, 0.0),
            "probs": torch.rand(S, S, generator=g).masked_fill(~valid, 0.0),
            "head_scores": torch.randn(2, S, S, generator=g).masked_fill(~valid, 0.0)}
    blocks = BlockMaps(S, N)
    f = blocks.f
    orig = BlockMaps.add_rows
    bands = []

    def spy(self, dst, part, start):
        bands.append((start, part.shape[0]))
        return orig(self, dst, part, start)
    monkeypatch.setattr(BlockMaps, "add_rows", spy)
    monkeypatch.setattr(sums, "BAND_ROWS", 2 * f)  # several bands, each of whole block rows
    maps = LayerMaps(Workspace(), blocks, S, "cpu")
    for name, t in full.items():
        maps.zeros(name, *t.shape[:-2], blocks.n, blocks.n)
        for m in range(t.shape[0] if t.ndim == 3 else 1):
            maps.put(name, t[m] if t.ndim == 3 else t, 0, m if t.ndim == 3 else None)
    maps.finish(causal, None)
    for name, t in full.items():
        torch.testing.assert_close(maps[name].double(), _block_means(t, f, valid), rtol=0, atol=1e-6, msg=name)
    assert all(start % f == 0 for start, _ in bands) and max(c for _, c in bands) <= 2 * f


@pytest.mark.parametrize("S,map_size", [(40, 7), (41, 10), (64, 16), (9, 9), (13, 1)])
def test_gram_block_means_equal_the_block_means_of_the_whole_gram(S, map_size):
    """``BlockMaps.gram_means`` from the blocks' mean rows equals the block means of the ``S x S`` Gram
    (brute force in float64), with a narrower last block where ``f`` does not divide ``S``, and the
    banded product of the same rows."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(S, 24, generator=g)
    bm = BlockMaps(S, map_size)
    ref = _block_means(a.double() @ a.double().T, bm.f, torch.ones(S, S, dtype=torch.bool))
    got = bm.gram_means(a)
    assert got.shape == (bm.n, bm.n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, bm.gram_means(lambda r0, r1: a[r0:r1] @ a[:r1].T, "cpu"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("map_size", [0, 7])
def test_cosine_rows_of_raw_products_equal_the_unit_vector_gram(map_size):
    """The GPU half-precision cosine path (``builtin.cosine.cosine_rows``: each sequence's product of its raw
    values, scaled by the inverse norms after it) equals the Gram of the unit vectors, as full maps and
    through ``BlockMaps.gram_means`` (here on the CPU, in float32)."""
    g = torch.Generator().manual_seed(1)
    B, S, d = 3, 40, 24
    x = torch.randn(B, S, d, generator=g).to(torch.bfloat16).float() * torch.rand(B, S, 1, generator=g).add(0.5)
    n = torch.linalg.vector_norm(x, dim=-1)
    u = (x / n[..., None]).transpose(0, 1).reshape(S, -1)  # [S, B d]: the CPU path's folded unit vectors
    rows = cosine_rows(x, n.reciprocal())
    # two different products (and kernels, chosen by the CPU's instruction set): equal to a few float32 ulps
    # of entries up to B (a sum of B cosines)
    if map_size:
        bm = BlockMaps(S, map_size)
        torch.testing.assert_close(bm.gram_means(rows, "cpu"), bm.gram_means(u), rtol=1e-6, atol=1e-6)
    else:
        torch.testing.assert_close(rows(0, S), u @ u.T, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(rows(10, 25), (u @ u.T)[10:25, :25], rtol=1e-6, atol=1e-6)


def test_direct_rising_pair_counts_equal_the_merge_count(monkeypatch):
    """The GPU's all-pairs count (``_direct_rising_counts``) against the CPU's O(T log^2 T) count, with
    ties, -inf suffixes and chunks smaller than the input."""
    from poslens.metrics import neighborhood as nb

    g = torch.Generator().manual_seed(2)
    for T in (3, 17, 64):
        x = torch.randn(50, T, generator=g)
        x[::3, T // 2:] = float("-inf")
        x[1::4] = x[1::4].mul(2).round()
        want = nb.rising_pair_counts(x)
        brute = torch.tensor([sum(int(r[k] > r[j]) for j in range(T) for k in range(j + 1, T)) for r in x])
        assert torch.equal(want, brute)
        assert torch.equal(nb._direct_rising_counts(x), want)
        monkeypatch.setattr(nb, "_DIRECT_ELEMS", 7 * T * T)  # 7 rows per chunk
        assert torch.equal(nb._direct_rising_counts(x), want)
        monkeypatch.undo()


def test_finite_check_in_one_pass():
    assert finite(torch.randn(7, 5))
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.randn(7, 5)
        x[3, 2] = bad
        assert not finite(x)
    x = torch.full((4,), 3e38)  # finite entries whose float32 sum overflows: the entry-wise test decides
    assert finite(x)
    x[0], x[1] = float("inf"), float("-inf")  # inf + -inf = NaN: still not finite
    assert not finite(x)


def test_reused_buffers_keep_layers_apart():
    """Two layers of one capture (S x S sums, fold and Gram workspaces reused on the CPU) equal two
    one-layer captures, and the output of each layer survives the next layer's chunks."""
    g = torch.Generator().manual_seed(11)
    B, H, Hk, S, D = 2, 4, 2, 70, 8
    qs = [torch.randn(B, H, S, D, generator=g) for _ in range(2)]
    ks = [torch.randn(B, Hk, S, D, generator=g) for _ in range(2)]
    vs = [torch.randn(B, Hk, S, D, generator=g) for _ in range(2)]
    xs = [torch.randn(B, S, 16, generator=g) for _ in range(3)]

    def spec(layers):
        return CaptureSpec(num_layers=2, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=layers,
                               heads=[(l, 1) for l in layers], chunk_elems=B * H * S * 9)

    both = Capture(spec([0, 1]))
    both.begin_batch(B)
    both.observe_hidden(0, xs[0])
    outs = []
    for l in (0, 1):
        outs.append(both.observe_attention(l, qs[l], ks[l], None, 0.3, value=vs[l]))
        both.observe_hidden(l + 1, xs[l + 1])
    both.end_batch()
    for l in (0, 1):
        one = Capture(spec([l]))
        one.begin_batch(B)
        one.observe_hidden(0, xs[0])
        out = one.observe_attention(l, qs[l], ks[l], None, 0.3, value=vs[l])
        one.observe_hidden(1, xs[l + 1])
        one.end_batch()
        assert torch.equal(outs[l], out)
        for name in ("scores", "probs", "slash", "attn_cosine", "attn_norms", "dim_logit", "q_gram"):
            assert torch.equal(both.accs[name].sum[l], one.accs[name].sum[0]), name
        for name in ("head_scores", "head_probs"):
            assert torch.equal(both.accs[name].sum[l], one.accs[name].sum[0]), name
        assert torch.equal(both.accs["cosine"].sum[l + 1], one.accs["cosine"].sum[1])


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_float64_accumulation_through_the_widening_buffer_is_add_bit_for_bit(kernel, monkeypatch):
    """``Workspace.add64`` (the fused C pass, or a float32 map widened into a reused float64 buffer, then
    added) equals torch's mixed-dtype ``add_`` bit for bit, with and without ``alpha``, for maps of
    different shapes in turn (the buffer is reused and grows), and leaves its input untouched."""
    from poslens import native

    monkeypatch.setenv(native.KERNEL_ENV, kernel)
    cap = Capture(CaptureSpec(num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4, seq_len=8, layers=[0]))
    g = torch.Generator().manual_seed(5)
    for shape, alpha in (((37, 37), 1.0 / 9), ((5, 37, 37), 1.0), ((64, 64), 1.0 / 3), ((3,), 0.5)):
        acc = torch.randn(shape, dtype=torch.float64, generator=g) * 1e3
        x = torch.randn(shape, generator=g)
        x0 = x.clone()
        want = acc.clone().add_(x, alpha=alpha)
        cap.work.add64(acc, x, alpha=alpha)
        assert torch.equal(acc, want) and torch.equal(x, x0)
    if not native.available():  # the torch path: one float64 buffer, grown to the largest map
        wide = cap.work.buffer("wide", (1,), "cpu", dtype=torch.float64)
        assert wide.untyped_storage().nbytes() == 8 * 5 * 37 * 37


@pytest.mark.parametrize("T", [12, 33, 64, 65, 129, 300])
def test_per_sequence_aps_count_equals_direct_pairs(T):
    """The merge count of the APS (rows on power-of-two column prefixes) against the direct pair
    comparison of ``rising_pair_fraction``, with exact ties (integer-valued maps) and without."""
    from poslens.metrics.neighborhood import adjacency_probability_score, rising_pair_fraction

    g = torch.Generator().manual_seed(T)
    m = torch.randn(3, T, T, generator=g)
    m[0] = torch.randint(0, 5, (T, T), generator=g).float()
    got = adjacency_probability_score(m)
    want = rising_pair_fraction(m.double(), include_diagonal=False, ties=0.0)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout,H,Hk", [("half", 4, 2), ("interleaved", 2, 2)])
def test_per_sequence_qk_moments_and_reservoir_equal_whole_batch(layout, H, Hk):
    """The q/k second moments and reservoir rows, computed one sequence at a time, against the
    whole-batch computation (RoPE inverse of all of q and k, float64 sum of the per-sequence float32
    products, reservoir rows gathered from the whole batch), with a different cos/sin per sequence."""
    from poslens.capture.statistics.reservoir import QKReservoir

    g = torch.Generator().manual_seed(5)
    B, S, D = 3, 40, 8
    q = torch.randn(B, H, S, D, generator=g)
    k = torch.randn(B, Hk, S, D, generator=g)
    pos = torch.arange(S, dtype=torch.float32)[None] + 7 * torch.arange(B, dtype=torch.float32)[:, None]
    ang = pos[..., None] * torch.tensor([1.0, 0.3, 0.05, 0.01])  # [B, S, 4]
    ang = torch.cat([ang, ang], -1) if layout == "half" else ang.repeat_interleave(2, -1)
    cos, sin = ang.cos(), ang.sin()
    spec = CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=[0],
                           rope_layers={0}, reservoir=16, stats=parse_stats("qk"), rope_layout=layout)
    cap = Capture(spec)
    cap.rope_cos_sin = (cos, sin)
    ref = QKReservoir(16, 1, H, Hk, D, S)
    q_ref, k_ref = torch.zeros(H, D, D, dtype=torch.float64), torch.zeros(Hk, D, D, dtype=torch.float64)
    for seq0 in (0, B):  # two batches: the second one replaces some of the first one's slots
        cap.begin_batch(B, seq0)
        QK.add(LayerBatch(cap, 0, 0, q, k, 1.0, True, None), None)
        cap.end_batch()
        q_pre, k_pre = unrotate_qk(q, k, cos, sin, layout=layout)
        if layout == "interleaved":
            perm = half_layout_perm(D, D)
            q_pre, k_pre = q_pre[..., perm], k_pre[..., perm]
        q_ref += torch.matmul(q_pre.transpose(-1, -2), q_pre).sum(0, dtype=torch.float64) / S
        k_ref += torch.matmul(k_pre.transpose(-1, -2), k_pre).sum(0, dtype=torch.float64) / S
        ref.begin_batch(seq0, B)
        ref.observe(0, q_pre, k_pre)
        ref.end_batch()
        q = q.flip(2)  # other vectors for the second batch
        k = k.flip(2)
    assert torch.equal(cap.accs["q_gram"].sum[0], q_ref)
    assert torch.equal(cap.accs["k_gram"].sum[0], k_ref)
    for name in ("keys", "tokens", "q", "k"):
        assert torch.equal(getattr(cap.reservoir, name), getattr(ref, name)), name


@pytest.mark.parametrize("causal,window,map_size", [
    (True, None, 0),     # causal, full maps
    (True, 9, 0),        # sliding window
    (False, None, 0),    # bidirectional control
    (True, None, 7),     # --map-size block sums (added slice by slice)
])
def test_chunk_slices_of_the_batch_equal_the_whole_batch(causal, window, map_size):
    """A chunk whose logits would outgrow the cache budget is computed in slices of its sequences
    (5 sequences as 2 + 2 + 1 here); every sum and the layer output equal the unsliced pass's."""
    B, H, Hk, S, D = 5, 4, 2, 40, 8
    g = torch.Generator().manual_seed(31)
    q = torch.randn(B, H, S, D, generator=g) * 2
    k = torch.randn(B, Hk, S, D, generator=g) * 2
    v = torch.randn(B, Hk, S, D, generator=g)
    res, outs, slices = {}, {}, {}
    for chunk in (10**9, 2 * H * S):  # one slice; one query row per chunk, 2 sequences per slice
        spec = CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=[0],
                               heads=[(0, 1), (0, 3)], chunk_elems=chunk, map_size=map_size)
        cap = Capture(spec)
        seen = []
        inner = AttentionPass._logits

        def spy(self, b0, b1, start, stop, seen=seen):
            seen.append(b1 - b0)
            return inner(self, b0, b1, start, stop)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(AttentionPass, "_logits", spy)
            cap.begin_batch(B)
            outs[chunk] = cap.observe_attention(0, q, k, None, 0.3, causal=causal, window=window, value=v).clone()
            cap.end_batch()
        res[chunk], slices[chunk] = cap.means(), sorted(set(seen))
    assert slices[10**9] == [B] and slices[2 * H * S] == [1, 2]
    torch.testing.assert_close(outs[2 * H * S], outs[10**9], rtol=0, atol=1e-5)
    whole, sliced = res[10**9], res[2 * H * S]
    for name in ("scores", "probs", "slash", "head_scores", "head_probs", "probs_key0", "attn_cosine", "dim_logit"):
        if name in whole:
            torch.testing.assert_close(sliced[name], whole[name], rtol=0, atol=1e-5, equal_nan=True, msg=name)


@pytest.mark.parametrize("l3,elems", [(None, 2**20), (8 * 2**20, 2**20), (32 * 2**20, 2**20), (64 * 2**20, 2**21),
                                      (100 * 2**20, 2**21), (480 * 2**20, 2**22), (2**34, 2**22)])
def test_cpu_chunks_are_an_eighth_of_the_l3_cache_within_bounds(monkeypatch, l3, elems):
    """float32 logits per CPU chunk: l3 / 8 bytes rounded down to a power of two, from 4 MiB to 16 MiB."""
    monkeypatch.setattr(backends, "_l3_bytes", lambda: l3)
    assert backends.cpu_chunk_elems() == elems
    # rows per (batch, key head) product: about CPU_TARGET_ROWS (g query heads count g rows each), fewer
    # where one sequence's chunk would outgrow the budget, never below CPU_MIN_ROWS
    for H, S, g in [(8, 1024, 1), (8, 4096, 1), (9, 1024, 3), (8, 32768, 1), (16, 8192, 4)]:
        rows = backends.rows_per_chunk(1, H, S, "cpu", g)
        assert backends.CPU_MIN_ROWS <= rows * g < backends.CPU_TARGET_ROWS + g
        assert rows * H * S <= elems or rows * g < backends.CPU_MIN_ROWS + g
        assert rows * g >= backends.CPU_TARGET_ROWS or (rows + 1) * H * S > elems
    assert backends.rows_per_chunk(1, 8, 40, "cpu") == 40  # never more rows than the sequence has


def test_l3_cache_size_is_read_from_sysfs(tmp_path):
    for i, (level, size) in enumerate([("1", "48K"), ("2", "2048K"), ("3", "491520K")]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "level").write_text(level + "\n")
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert backends._l3_bytes.__wrapped__(str(tmp_path)) == 491520 * 1024
    (tmp_path / "index2" / "size").write_text("32M\n")
    assert backends._l3_bytes.__wrapped__(str(tmp_path)) == 32 * 2**20
    assert backends._l3_bytes.__wrapped__(str(tmp_path / "none")) is None
