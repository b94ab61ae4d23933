"""poslens's fused CPU kernels (poslens.native): each against float64 or the exact torch/numpy
count it replaces, the capture with them against the capture's torch path, and the fallbacks
(non-finite logits, no compiler)."""

from __future__ import annotations

import math

import pytest
import torch

from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import CaptureSpec, parse_stats
from poslens import native
from poslens.errors import PoslensError

needs_kernel = pytest.mark.skipif(not native.available(), reason=f"fused CPU kernel not built: {native.status()}")


def _chunk_reference(x, start, causal):
    """Float64: the visible logits summed over sequences and heads (0 where masked), the softmax, and
    each head's weights summed over sequences."""
    n, H, c, nc = x.shape
    x = x.double()
    seen = torch.ones(c, nc, dtype=torch.bool)
    if causal:
        seen = torch.arange(nc)[None, :] <= (start + torch.arange(c))[:, None]
    p = torch.softmax(x.masked_fill(~seen, float("-inf")), -1)
    return (x * seen).sum((0, 1)), p, p.sum(0)


@needs_kernel
@pytest.mark.parametrize("n,H,c,nc,start,causal", [
    (3, 4, 7, 40, 33, True),     # a causal chunk ending at key 40
    (1, 2, 64, 64, 0, True),     # the first chunk: its own diagonal block only
    (2, 3, 5, 29, 0, False),     # bidirectional: every key seen
    (4, 2, 16, 1000, 984, True),  # long rows (the vectorised loops and their tails)
])
@pytest.mark.parametrize("threads", [1, 3])
def test_fused_kernel_equals_float64(n, H, c, nc, start, causal, threads):
    g = torch.Generator().manual_seed(n * 100 + c)
    x = torch.randn(n, H, c, nc, generator=g) * 4
    ref_sum, ref_p, ref_heads = _chunk_reference(x, start, causal)
    logit_sum = torch.full((c, nc), 7.0)
    zbuf = torch.full((H, c + 3, nc + 5), 9.0)  # head sums in a strided view, as run.zbuf holds them
    heads = zbuf[:, 1:c + 1, 5:]
    pass_ = native.SoftmaxSums()
    assert pass_(x, start, causal, logit_sum, heads, accumulate=False, threads=threads) == 0
    torch.testing.assert_close(x.double(), ref_p, rtol=0, atol=1e-6)
    torch.testing.assert_close(logit_sum.double(), ref_sum, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(heads.double(), ref_heads, rtol=0, atol=1e-6)
    assert bool((zbuf[:, 0] == 9.0).all()) and bool((zbuf[:, :, :5] == 9.0).all())  # nothing outside the view
    # a later slice of the same chunk's sequences adds to the head sums
    y = torch.randn(n, H, c, nc, generator=g)
    _, p2, heads2 = _chunk_reference(y, start, causal)
    assert pass_(y, start, causal, None, heads, accumulate=True, threads=threads) == 0
    torch.testing.assert_close(heads.double(), ref_heads + heads2, rtol=0, atol=2e-6)
    torch.testing.assert_close(y.double(), p2, rtol=0, atol=1e-6)


@needs_kernel
def test_fused_kernel_counts_non_finite_visible_logits_only():
    x = torch.zeros(2, 2, 4, 8)
    x[1, 0, 2, 1] = float("nan")  # visible (row 2 sees keys <= 6)
    x[0, 1, 0, 7] = float("inf")  # masked: row 0 sees keys <= 4
    x[0, 0, 3, 0] = -float("inf")  # visible
    assert native.SoftmaxSums()(x.clone(), 4, True, None, None, accumulate=False) == 2
    x[1, 0, 2, 1] = x[0, 0, 3, 0] = 0.0
    assert native.SoftmaxSums()(x, 4, True, torch.empty(4, 8), None, accumulate=False) == 0


@pytest.mark.parametrize("start,c,nc,causal,parts", [(0, 64, 64, True, 2), (960, 64, 1024, True, 3),
                                                       (0, 5, 9, False, 2), (0, 2, 2, True, 4)])
def test_balanced_rows_split_the_visible_logits(start, c, nc, causal, parts):
    edges = native._balanced_rows(start, c, nc, causal, parts)
    assert len(edges) == parts + 1 and edges[0] == 0 and edges[-1] == c
    assert edges == sorted(edges)
    counts = [min(nc, start + r + 1) if causal else nc for r in range(c)]
    share = [sum(counts[a:b]) for a, b in zip(edges[:-1], edges[1:])]
    assert max(share) <= sum(counts) / parts + max(counts)


def _scan_layer(B, H, Hk, S, causal, chunk, stats, map_size=0, q_scale=2.0):
    g = torch.Generator().manual_seed(B * S + H)
    D = 16
    q = torch.randn(B, H, S, D, generator=g) * q_scale
    k = torch.randn(B, Hk, S, D, generator=g) * 2
    v = torch.randn(B, Hk, S, D, generator=g)
    spec = CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=[0],
                           chunk_elems=chunk, map_size=map_size, stats=parse_stats(stats))
    cap = Capture(spec)
    cap.begin_batch(B)
    out = cap.observe_attention(0, q, k, None, 1 / math.sqrt(D), causal=causal, value=v).clone()
    cap.end_batch()
    return cap.means(), out


@needs_kernel
@pytest.mark.parametrize("B,H,Hk,S,causal,chunk,map_size", [
    (3, 4, 4, 130, True, 10**9, 0),              # one chunk
    (5, 4, 2, 100, True, 2 * 4 * 100 * 7, 0),    # 7-row chunks in slices of 2 sequences, GQA
    (2, 6, 2, 77, False, 2 * 6 * 77 * 9, 0),     # bidirectional
    (4, 2, 1, 90, True, 2 * 2 * 90 * 11, 8),     # --map-size block means, MQA
])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("stats", ["scores,probs", "probs", "scores", "slash,attn_cosine"])
def test_capture_with_the_fused_pass_equals_the_torch_pass(B, H, Hk, S, causal, chunk, map_size, threads, stats,
                                                           monkeypatch):
    calls = []
    inner = native.SoftmaxSums.__call__
    monkeypatch.setattr(native.SoftmaxSums, "__call__", lambda self, *a, **k: calls.append(1) or inner(self, *a, **k))
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fused, out_fused = _scan_layer(B, H, Hk, S, causal, chunk, stats, map_size)
        assert calls, "the fused pass was not taken"
        monkeypatch.setenv(native.KERNEL_ENV, "torch")
        ref, out_ref = _scan_layer(B, H, Hk, S, causal, chunk, stats, map_size)
    finally:
        torch.set_num_threads(prev)
    assert set(fused) == set(ref)
    for name in ref:
        torch.testing.assert_close(fused[name], ref[name], rtol=1e-5, atol=2e-6, msg=name)
    torch.testing.assert_close(out_fused, out_ref, rtol=1e-5, atol=2e-6)


@needs_kernel
def test_statistics_reading_the_chunks_keep_the_torch_pass(monkeypatch):
    """Per-head maps read every chunk's logits and weights, a sliding window masks inside rows: the
    torch pass takes those layers."""
    calls = []
    monkeypatch.setattr(native.SoftmaxSums, "__call__", lambda self, *a, **k: calls.append(1))
    spec = CaptureSpec(num_layers=1, num_heads=2, num_kv_heads=2, head_dim=8, seq_len=20, layers=[0],
                           heads=[(0, 1)], stats=parse_stats("scores,probs"))
    cap = Capture(spec)
    q = torch.randn(2, 2, 20, 8)
    cap.begin_batch(2)
    cap.observe_attention(0, q, q, None, 0.3, value=q)
    cap.end_batch()
    assert not calls
    spec = CaptureSpec(num_layers=1, num_heads=2, num_kv_heads=2, head_dim=8, seq_len=20, layers=[0],
                           stats=parse_stats("scores,probs"))
    cap = Capture(spec)
    cap.begin_batch(2)
    cap.observe_attention(0, q, q, None, 0.3, window=5, value=q)
    cap.end_batch()
    assert not calls


@needs_kernel
def test_non_finite_logits_name_their_head_through_the_checked_pass():
    B, H, S, D = 2, 4, 24, 8
    q = torch.randn(B, H, S, D)
    q[1, 2, 5, 0] = float("inf")
    spec = CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=H, head_dim=D, seq_len=S, layers=[3],
                           stats=parse_stats("scores,probs"))
    cap = Capture(spec)
    cap.begin_batch(B)
    with pytest.raises(PoslensError, match="layer 3, head 2"):
        cap.observe_attention(3, q, torch.randn(B, H, S, D), None, 0.3, value=torch.randn(B, H, S, D))


def test_without_a_compiler_the_capture_takes_the_torch_path(monkeypatch, tmp_path):
    monkeypatch.delenv(native.KERNEL_ENV, raising=False)
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert not native.available()
    assert "no C compiler" in native.status()
    means, out = _scan_layer(3, 4, 2, 50, True, 10**9, "scores,probs")
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv(native.KERNEL_ENV, "torch")
    assert native.status().startswith("torch path")
    ref, out_ref = _scan_layer(3, 4, 2, 50, True, 10**9, "scores,probs")
    for name in ref:
        torch.testing.assert_close(means[name], ref[name], rtol=0, atol=0, msg=name)


@needs_kernel
def test_the_library_is_built_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("POSLENS_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_state", {})
    assert native.available()
    built = list((tmp_path / "native").glob("kernels-*.so"))
    assert len(built) == 1 and built[0] == native.library_path(native._compiler())
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native, "_state", {})
    assert native.available() and built[0].stat().st_mtime_ns == stamp
    # no temporary left: the library and its record (size and sha256, checked before each load)
    assert sorted(p.name for p in (tmp_path / "native").iterdir()) == sorted([built[0].name,
                                                                             native.record_path(built[0]).name])


@needs_kernel
@pytest.mark.parametrize("B,Hk,g,S,D", [(2, 3, 1, 50, 8), (1, 2, 3, 129, 16), (3, 1, 4, 7, 6)])
def test_causal_pair_dim_sum_equals_float64(B, Hk, g, S, D):
    from poslens.capture.statistics.builtin.dim_logit import causal_pair_dim_sum

    gen = torch.Generator().manual_seed(S)
    qg = torch.randn(B, Hk, g, S, D, generator=gen)
    k = torch.randn(B, Hk, S, D, generator=gen)
    tri = torch.ones(S, S, dtype=torch.bool).tril()
    ref = torch.einsum("bhgid,bhjd,ij->bhgd", qg.double(), k.double(), tri.double())
    got = native.causal_pair_dim_sum(qg, k)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-5)
    assert causal_pair_dim_sum(qg, k) is not None  # the statistic takes it
    torch.testing.assert_close(causal_pair_dim_sum(qg, k), got, rtol=0, atol=0)


@needs_kernel
@pytest.mark.parametrize("T", [3, 4, 16, 17, 33, 64, 100, 257])
def test_rising_pairs_equal_the_merge_count(T, monkeypatch):
    """Every triple j < k < i with m[i, k] > m[i, j]: the kernel against the merge count of
    poslens.metrics.neighborhood, on maps with many exact ties and negative zeros."""
    from poslens.metrics import neighborhood as nb

    gen = torch.Generator().manual_seed(T)
    m = torch.randn(5, T, T, generator=gen)
    m[1] = torch.randint(-2, 3, (T, T), generator=gen).float()  # ties everywhere
    m[2] = -0.0
    m[2, :, ::3] = 0.0  # -0.0 and +0.0 are equal: no rise between them
    m[3] = torch.arange(T, dtype=torch.float32)[None, :]  # every row rises: all pairs count
    got = native.rising_pairs(m)
    i = torch.arange(T)
    x = m.masked_fill(i[None, :] >= i[:, None], float("-inf"))
    ref = nb.rising_pair_counts(x.reshape(-1, T)).reshape(5, T).sum(1)
    assert torch.equal(got, ref)
    assert int(got[3]) == T * (T - 1) * (T - 2) // 6 and int(got[2]) == 0
    # the APS takes it, and the merge count (no kernel) gives the same fraction
    fused = nb._rising_pairs_by_merge(m)
    monkeypatch.setenv(native.KERNEL_ENV, "torch")
    assert torch.equal(fused, nb._rising_pairs_by_merge(m))


@needs_kernel
@pytest.mark.parametrize("T", [2, 3, 15, 16, 17, 33, 130])
def test_pair_counts_equal_every_pair_compared(T, monkeypatch):
    """Rising and tied pairs of each row: the kernel against a double loop and against the sort count
    of poslens.metrics.neighborhood (kernels off), on rows with ties, -0.0 beside +0.0, -inf suffixes,
    -inf between finite entries (no tie among them) and float32 rows (widened exactly)."""
    from poslens.metrics import neighborhood as nb

    gen = torch.Generator().manual_seed(T)
    x = torch.randint(-2, 3, (8, T), generator=gen).to(torch.float64)
    x[0] = torch.randn(T, generator=gen, dtype=torch.float64)
    x[1, T // 2:] = float("-inf")
    x[2] = float("-inf")
    x[3, ::2] = float("-inf")
    x[4] = -0.0
    x[4, ::3] = 0.0
    x[5] = torch.arange(T, dtype=torch.float64)  # every pair rises
    gt, eq = native.pair_counts(x)
    for r, row in enumerate(x.tolist()):
        ps = [(row[j], row[k]) for j in range(T) for k in range(j + 1, T)]
        assert int(gt[r]) == sum(b > a for a, b in ps), (T, r)
        assert int(eq[r]) == sum(b == a and a != float("-inf") for a, b in ps), (T, r)
    assert int(gt[5]) == T * (T - 1) // 2 and int(gt[4]) == 0 and int(gt[2]) == int(eq[2]) == 0
    f32 = x.to(torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(native.pair_counts(f32), native.pair_counts(f32.double())))
    assert native.pair_counts(torch.zeros(2, native.PAIR_COUNTS_MAX_T + 1)) is None  # long rows: the sort count
    monkeypatch.setenv(native.KERNEL_ENV, "torch")
    assert native.pair_counts(x) is None
    ref_gt, ref_eq = nb._sorted_pair_counts(x)
    assert torch.equal(gt, ref_gt) and torch.equal(eq, ref_eq)


@needs_kernel
@pytest.mark.parametrize("D,r,Bc", [(16, 16, 1), (16, 8, 1), (12, 12, 3)])
def test_unrotate_half_equals_the_torch_path(D, r, Bc, monkeypatch):
    from poslens.capture.backends.rope import unrotate_qk
    from poslens.rope import apply_rope

    B, H, S = 3, 2, 20
    gen = torch.Generator().manual_seed(D + r)
    q, k = torch.randn(B, H, S, D, generator=gen), torch.randn(B, 1, S, D, generator=gen)
    ang = torch.rand(Bc, S, r // 2, generator=gen) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1) * 1.2, torch.cat([ang.sin()] * 2, -1) * 1.2  # scaled RoPE
    calls = []
    inner = native.unrotate_half
    monkeypatch.setattr(native, "unrotate_half", lambda *a: calls.append(1) or inner(*a))
    gq, gk = unrotate_qk(q, k, cos, sin)
    assert len(calls) == 2
    monkeypatch.setenv(native.KERNEL_ENV, "torch")
    rq, rk = unrotate_qk(q, k, cos, sin)
    torch.testing.assert_close(gq, rq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gk, rk, rtol=1e-6, atol=1e-6)
    monkeypatch.delenv(native.KERNEL_ENV)
    if r == D:  # the rotation undone: RoPE applied, then un-rotated, gives the queries back
        c, s = cos / 1.2, sin / 1.2
        back, _ = unrotate_qk(apply_rope(q, c[:, None], s[:, None]), k, c, s)
        torch.testing.assert_close(back, q, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("alpha,lower", [(1.0, False), (1 / 9, False), (0.3, True), (1 / 7, True)])
def test_add_widened_is_torchs_add_bit_for_bit(alpha, lower):
    gen = torch.Generator().manual_seed(int(alpha * 1000))
    dst = torch.randn(37, 37, generator=gen, dtype=torch.float64) * 100
    src = torch.randn(37, 37, generator=gen)
    ref = dst.clone().add_(src.double(), alpha=alpha)
    got = dst.clone()
    assert native.add_widened(got, src, alpha, lower)
    tri = torch.ones(37, 37, dtype=torch.bool).tril()
    if lower:  # the lower triangle added, the rest as it was
        assert torch.equal(got[tri], ref[tri]) and torch.equal(got[~tri], dst[~tri])
    else:
        assert torch.equal(got, ref)
    assert not native.add_widened(got.T, src, alpha)  # a strided sum: the caller's torch path


@needs_kernel
@pytest.mark.parametrize("B,S,d,strided", [(3, 50, 24, False), (2, 7, 129, True), (1, 4, 1, False)])
def test_unit_rows_equal_the_torch_fold(B, S, d, strided):
    gen = torch.Generator().manual_seed(S)
    x = torch.randn(B, S, d, generator=gen) * 3
    x[0, 1] = 0.0  # a zero vector: norm 0, unit row 0
    if strided:  # rows of a [B, S, H, D]-like tensor viewed as [B, S, d]
        x = torch.randn(S, B, d, generator=gen).transpose(0, 1)
    out = torch.full((S, B, d), float("nan"))
    n = native.unit_rows(x, out)
    ref_n = torch.linalg.vector_norm(x, dim=-1)
    torch.testing.assert_close(n, ref_n, rtol=1e-6, atol=0)
    ref = x.transpose(0, 1) / ref_n.clamp_min(1e-30).T[..., None]
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-7)


@needs_kernel
def test_kernels_split_over_threads_give_the_same_bits():
    """Each kernel with its index range cut over three threads (native.Workers) equals the one-thread
    call bit for bit: the parts are disjoint and every entry is computed the same way."""
    gen = torch.Generator().manual_seed(3)
    workers = native.Workers()
    prev = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        qg, k = torch.randn(2, 3, 2, 40, 8, generator=gen), torch.randn(2, 3, 40, 8, generator=gen)
        assert torch.equal(native.causal_pair_dim_sum(qg, k, workers), native.causal_pair_dim_sum(qg, k))
        x = torch.randn(2, 5, 30, 16, generator=gen)
        cos, sin = torch.rand(1, 1, 30, 16, generator=gen), torch.rand(1, 1, 30, 16, generator=gen)
        assert torch.equal(native.unrotate_half(x, cos, sin, workers), native.unrotate_half(x, cos, sin))
        dst, src = torch.randn(300, 300, dtype=torch.float64, generator=gen), torch.randn(300, 300, generator=gen)
        for lower in (False, True):
            a, b = dst.clone(), dst.clone()
            assert native.add_widened(a, src, 0.3, lower, workers) and native.add_widened(b, src, 0.3, lower)
            assert torch.equal(a, b)
        y = torch.randn(3, 50, 20, generator=gen)
        o1, o2 = torch.empty(50, 3, 20), torch.empty(50, 3, 20)
        assert torch.equal(native.unit_rows(y, o1, workers), native.unit_rows(y, o2)) and torch.equal(o1, o2)
    finally:
        torch.set_num_threads(prev)
        workers.close()
