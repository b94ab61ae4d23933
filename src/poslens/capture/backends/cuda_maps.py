"""Fused CUDA kernels (Triton) for a layer's attention maps: scores, weights, slash, per-head maps.

The chunked torch pass (:class:`poslens.capture.backends.attnpass.AttentionPass`) materialises
``B x H x c x S`` float32 logits and reads them five or more times (sum, mask, softmax, batch
sum, slash gather): on a GPU that is memory traffic of about 20 bytes per logit, more than the
flash-attention forward it observes. These kernels never write a logit:

1. ``_lse_kernel``: per (sequence, head, query block) the log-sum-exp of the causal row, online
   over key blocks (one ``Q K^T`` pass, as flash attention's first half);
2. ``_maps_kernel``: per (query block, key block) tile, a loop over heads and sequences recomputes
   the tile's logits (``tl.dot`` on the model's bf16/fp16 values with float32 accumulation, or
   IEEE float32 products for float32 models), sums them and ``exp(logit - lse)`` into float32
   tiles held in registers, and writes each output tile once. Per head, the batch-summed weight
   tile is also reduced along its diagonals (a ``tl.gather`` skew: row r, column c holds the
   entry at key r - c mod BLOCK) into per-tile partial slash sums, which a deterministic torch sum
   over tiles of one diagonal band turns into ``sum_i A_h[i, i - d]``.

Used for layers without a sliding window when Triton is importable and the head dim is a power of
two in [16, 256]; anything else takes the torch path. Under Triton's interpreter
(``TRITON_INTERPRET=1`` in the environment when the kernels are first built) the same kernels run on
CPU tensors, in numpy: slowly, but it is how a machine without a GPU runs this module's logic (the
tests do). Non-finite logits are not checked inside the kernels: the caller tests the (small)
outputs once and, if any entry is not finite, redoes the layer on the checked torch path, which
names the head or masks the entries as the CPU does.
"""

from __future__ import annotations

import functools
import os

import torch

#: Launch settings: tile size (query rows = key columns; the slash skew needs square tiles) and
#: warps / pipeline stages of each kernel. ``benchmarks/bench_gpu.py`` measures the alternatives.
CONFIG = {"block": 64, "lse_warps": 4, "maps_warps": 4, "stages": 2}


@functools.lru_cache(maxsize=1)
def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, tl


def supported(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether the fused kernels handle these ``[B, H, S, D]`` queries and keys: CUDA tensors, or CPU
    tensors when the kernels run under Triton's interpreter (:func:`interpreted`)."""
    D = query.shape[-1]
    if query.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if D < 16 or D > 256 or D & (D - 1) or query.shape[1] % key.shape[1]:
        return False
    if query.is_cuda:
        return _kernels() is not None
    return query.device.type == "cpu" and interpreted()


def interpreted() -> bool:
    """Whether the kernels are Triton's interpreter's (``TRITON_INTERPRET=1`` when they were built):
    they then take CPU tensors. False where Triton is not installed."""
    if _kernels.cache_info().currsize == 0 and os.environ.get("TRITON_INTERPRET", "0").strip().lower() in (
            "", "0", "false", "no", "off", "n"):
        return False  # nothing built and no interpreter asked for: no need to import Triton to say so
    kernels = _kernels()
    if kernels is None:
        return False
    from triton.runtime.jit import JITFunction

    return not isinstance(kernels[0], JITFunction)


@functools.lru_cache(maxsize=1)
def _kernels():
    tt = _triton()
    if tt is None:
        return None
    triton, tl = tt

    @triton.jit
    def _lse_kernel(Q, K, LSE, sqb, sqh, sqs, sqd, skb, skh, sks, skd, H, G, S, scale2,
                    D: tl.constexpr, BM: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                    DOT_F32: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        kh = h // G
        rm = pid_m * BM + tl.arange(0, BM)
        rd = tl.arange(0, D)
        q = tl.load(Q + b * sqb + h * sqh + rm[:, None] * sqs + rd[None, :] * sqd, mask=rm[:, None] < S, other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        if CAUSAL:
            hi = (pid_m + 1) * BM  # keys past S are masked
        else:
            hi = S
        for n0 in range(0, hi, BM):
            rn = n0 + tl.arange(0, BM)
            k = tl.load(K + b * skb + kh * skh + rn[:, None] * sks + rd[None, :] * skd, mask=rn[:, None] < S, other=0.0)
            if DOT_F32:
                k = k.to(tl.float32)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale2
            else:
                s = tl.dot(q, tl.trans(k)) * scale2
            valid = (rn[None, :] < S) & (rm[:, None] >= 0)
            if CAUSAL:
                valid = valid & (rn[None, :] <= rm[:, None])
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
            m_i = m_new
        tl.store(LSE + bh * S + rm, m_i + tl.log2(l_i), mask=rm < S)

    @triton.jit
    def _maps_kernel(Q, K, LSE, SC, PR, HS, HP, SLOT, SL, sqb, sqh, sqs, sqd, skb, skh, sks, skd,
                     B, H, G, S, NB, scale, LOG2E: tl.constexpr,
                     D: tl.constexpr, BM: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                     W_SC: tl.constexpr, W_PR: tl.constexpr, W_HEADS: tl.constexpr, W_SLASH: tl.constexpr,
                     NEED_S: tl.constexpr, PER_HEAD: tl.constexpr, STAGES: tl.constexpr, DOT_F32: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if CAUSAL:
            if pid_n > pid_m:
                return
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BM + tl.arange(0, BM)
        rd = tl.arange(0, D)
        valid = (rm[:, None] < S) & (rn[None, :] < S)
        if CAUSAL:
            valid = valid & (rn[None, :] <= rm[:, None])
        acc_s = tl.zeros([BM, BM], tl.float32)
        acc_p = tl.zeros([BM, BM], tl.float32)
        r_loc = tl.arange(0, BM)[:, None]
        c_loc = tl.arange(0, BM)[None, :]
        for h in range(0, H):
            kh = h // G
            if PER_HEAD:
                acc_sh = tl.zeros([BM, BM], tl.float32)
                acc_ph = tl.zeros([BM, BM], tl.float32)
            for b in tl.range(0, B, num_stages=STAGES):
                q = tl.load(Q + b * sqb + h * sqh + rm[:, None] * sqs + rd[None, :] * sqd,
                            mask=rm[:, None] < S, other=0.0)
                k = tl.load(K + b * skb + kh * skh + rn[:, None] * sks + rd[None, :] * skd,
                            mask=rn[:, None] < S, other=0.0)
                if DOT_F32:
                    q = q.to(tl.float32)
                    k = k.to(tl.float32)
                if IEEE:
                    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
                else:
                    s = tl.dot(q, tl.trans(k)) * scale
                if PER_HEAD:  # per-head tiles (head maps, slash), added into the totals per head
                    if NEED_S:
                        acc_sh += tl.where(valid, s, 0.0)
                    lse = tl.load(LSE + (b * H + h) * S + rm, mask=rm < S, other=0.0)
                    acc_ph += tl.where(valid, tl.exp2(s * LOG2E - lse[:, None]), 0.0)
                else:  # only the totals: two accumulators, fewer registers
                    if W_SC:
                        acc_s += tl.where(valid, s, 0.0)
                    if W_PR:
                        lse = tl.load(LSE + (b * H + h) * S + rm, mask=rm < S, other=0.0)
                        acc_p += tl.where(valid, tl.exp2(s * LOG2E - lse[:, None]), 0.0)
            if PER_HEAD:
                if W_SC:
                    acc_s += acc_sh
                if W_PR:
                    acc_p += acc_ph
            if W_HEADS:
                slot = tl.load(SLOT + h)
                if slot >= 0:  # int64 offsets: slot * S * S passes 2**31 at 32k tokens
                    off = (slot.to(tl.int64) * S + rm[:, None]) * S + rn[None, :]
                    tl.store(HS + off, acc_sh, mask=valid)
                    tl.store(HP + off, acc_ph, mask=valid)
            if W_SLASH:
                # skew: g[r, c] = tile[r, (r - c) mod BM]; rows with r >= c hold offset (m - n) BM + c,
                # rows with r < c the offset (m - n) BM + c - BM (the tile's upper diagonals)
                idx = (r_loc - c_loc + BM) % BM
                gth = tl.gather(acc_ph, idx, 1)
                lo = tl.sum(tl.where(r_loc >= c_loc, gth, 0.0), 0)
                up = tl.sum(tl.where(r_loc < c_loc, gth, 0.0), 0)
                band = pid_m - pid_n
                if band >= 0:
                    base = ((h * NB + band).to(tl.int64) * NB + pid_m) * 2 * BM
                    tl.store(SL + base + tl.arange(0, BM), lo)
                    tl.store(SL + base + BM + tl.arange(0, BM), up)
        out = rm.to(tl.int64)[:, None] * S + rn[None, :]  # S * S passes 2**31 from 46,341 tokens
        if W_SC:
            tl.store(SC + out, acc_s, mask=valid)
        if W_PR:
            tl.store(PR + out, acc_p, mask=valid)

    return _lse_kernel, _maps_kernel


def key0_weights(query: torch.Tensor, key: torch.Tensor, lse2: torch.Tensor, scale2: float) -> torch.Tensor:
    """``sum_b A_bh[i, 0]`` ``[H, S]`` (float32): every head's weight on key 0, batch-summed.

    ``lse2 [B, H, S]`` is each row's log-sum-exp in base 2 of the logits times ``scale2`` (the
    logit scale times log2(e)), as :func:`_kernels`' ``_lse_kernel`` writes it, so the weight is
    ``2 ** (q_i . k_0 * scale2 - lse2_i)``: key 0 is one column, its logits one product per head
    (a head at a time, so no float32 copy of all of ``q`` exists)."""
    B, H, S, _ = query.shape
    G = H // key.shape[1]
    out = torch.empty(H, S, dtype=torch.float32, device=query.device)
    for h in range(H):
        k0 = key[:, h // G, 0].to(torch.float32)  # [B, D]
        dot = torch.matmul(query[:, h].to(torch.float32), k0[:, :, None])[..., 0]  # [B, S]
        torch.sum(torch.exp2(dot.mul_(scale2).sub_(lse2[:, h])), dim=0, out=out[h])
    return out


def attention_maps(query: torch.Tensor, key: torch.Tensor, scaling: float, *, causal: bool, scores: bool,
                   probs: bool, slash: bool, heads: list[int]) -> dict[str, torch.Tensor]:
    """Float32 batch/head sums of one layer's maps (the batch sums the chunked pass,
    :class:`poslens.capture.backends.attnpass.AttentionPass`, hands over; :func:`poslens.capture.backends.choice.triton_pass`
    names them as intermediates).

    ``query [B, H, S, D]``, ``key [B, Hk, S, D]`` (any strides, model dtype); ``scaling`` the logit
    scale. Keys: ``scores``/``probs`` ``[S, S]`` (causal: 0 above the diagonal), ``slash`` ``[H, S]``
    (``sum_b sum_i A_bh[i, i - d]``), ``head_scores``/``head_probs`` ``[len(heads), S, S]``; with
    ``probs`` or ``slash`` also ``sink_heads`` ``[H, S]`` (``sum_b A_bh[i, 0]``, :func:`key0_weights`).
    """
    import math

    triton, _tl = _triton()
    lse_kernel, maps_kernel = _kernels()
    # 128 x 128 tiles of 128-wide heads exceed the H100's 227 KiB of shared memory per block
    BLOCK = min(CONFIG["block"], 64 if query.shape[-1] >= 128 else 128)
    B, H, S, D = query.shape
    Hk = key.shape[1]
    G = H // Hk
    dev = query.device
    ieee = query.dtype == torch.float32  # float32 models: IEEE products; bf16/fp16 products are exact anyway
    # The interpreter multiplies bf16 tiles as their uint16 storage bits (triton-lang/triton#11584):
    # there the tiles go to float32 first, where bf16 products are exact as on the tensor cores.
    dot_f32 = query.dtype == torch.bfloat16 and interpreted()
    f32 = dict(dtype=torch.float32, device=dev)
    NB = triton.cdiv(S, BLOCK)
    log2e = 1.0 / math.log(2.0)
    need_p = probs or slash or bool(heads)
    lse = torch.empty(B * H, S, **f32) if need_p else torch.empty(1, **f32)
    qs, ks = query.stride(), key.stride()
    if need_p:
        lse_kernel[(NB, B * H)](query, key, lse, *qs, *ks, H, G, S, float(scaling) * log2e,
                                D=D, BM=BLOCK, CAUSAL=causal, IEEE=ieee, DOT_F32=dot_f32,
                                num_warps=CONFIG["lse_warps"])
    out = {}
    dummy = torch.empty(1, **f32)
    sc = torch.zeros(S, S, **f32) if scores else dummy
    pr = torch.zeros(S, S, **f32) if probs else dummy
    hs = torch.zeros(len(heads), S, S, **f32) if heads else dummy
    hp = torch.zeros(len(heads), S, S, **f32) if heads else dummy
    slot = torch.full((H,), -1, dtype=torch.int32, device="cpu")  # filled on the host, copied once
    for m, h in enumerate(heads):
        slot[h] = m
    slot = slot.to(dev)
    sl = torch.zeros(H, NB, NB, 2, BLOCK, **f32) if slash else dummy
    maps_kernel[(NB, NB)](query, key, lse, sc, pr, hs, hp, slot, sl, *qs, *ks, B, H, G, S, NB, float(scaling),
                          LOG2E=log2e, D=D, BM=BLOCK, CAUSAL=causal, IEEE=ieee, W_SC=scores, W_PR=probs,
                          W_HEADS=bool(heads), W_SLASH=slash, NEED_S=scores or bool(heads),
                          PER_HEAD=slash or bool(heads), STAGES=CONFIG["stages"], DOT_F32=dot_f32,
                          num_warps=CONFIG["maps_warps"])
    if scores:
        out["scores"] = sc
    if probs:
        out["probs"] = pr
    if heads:
        out["head_scores"], out["head_probs"] = hs, hp
    if probs or slash:
        out["sink_heads"] = key0_weights(query, key, lse.view(B, H, S), float(scaling) * log2e)
    if slash:
        band = sl.sum(dim=2)  # [H, NB bands, 2, BLOCK]: the tiles of one diagonal band, summed
        lo, up = band[:, :, 0], band[:, :, 1]  # offsets band*BLOCK + c and band*BLOCK + c - BLOCK
        prof = lo.clone()
        prof[:, :-1] += up[:, 1:]
        out["slash"] = prof.reshape(H, NB * BLOCK)[:, :S].contiguous()
    return out
