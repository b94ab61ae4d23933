"""The attention function poslens registers with transformers, and what it accumulates.

transformers dispatches every attention layer of the supported architectures through
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` with post-RoPE queries and keys
(``[B, H, S, D]``; keys may have fewer heads under GQA). poslens registers one function under
:data:`ATTN_NAME` (``AttentionInterface.register``) plus a mask function under the same name
(``AttentionMaskInterface.register``) that hands through only the 2-D padding mask; the
attention function then applies the causal (or, as a control, no), sliding-window and padding
mask itself and hands the real computation to ``torch.nn.functional.scaled_dot_product_attention``
so the model's outputs are those of the ``sdpa`` implementation. Nothing in transformers is
replaced.

While a :class:`Capture` is active (``with capture.active(): model(...)``), every call of the
function also adds to streaming float64 accumulators (:class:`poslens.capture.stats.AccumulatorSet`).
The batch and head reductions are folded into matrix products, and the softmax is taken in
query-row chunks, so memory is bounded by the result (``S x S`` per layer) and one chunk of
``B x H x c x S`` logits, never by ``B x H x S x S`` per layer.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from poslens.capture import cuda_maps
from poslens.capture.reservoir import QKReservoir
from poslens.capture.stats import NOISE_GROUPS, AccumulatorSet, GroupAccumulator, MeanAccumulator
from poslens.errors import PoslensError
from poslens.metrics.neighborhood import per_sequence_aps

ATTN_NAME = "poslens"

#: The capture active in this process (one forward at a time); ``None`` = plain SDPA.
_ACTIVE: "Capture | None" = None


# --------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------
#: Logits per chunk on CPU (float32: 16 MiB): small enough to stay cache-resident across a chunk's
#: several passes, large enough that a layer is a few chunks (every op is a parallel region; on a
#: shared machine each one risks a stall while a worker thread is descheduled).
CPU_CHUNK_ELEMS = 2**22

#: Rows per block of the symmetric Gram product (lower block triangle only).
GRAM_BLOCK_ROWS = 256

#: Logits per chunk on CUDA (float32: 1 GiB) for the torch fallback path: a layer is a few chunks, so
#: a few dozen kernel launches instead of thousands (the CPU size gave ~64 chunks per layer at 4k tokens).
CUDA_CHUNK_ELEMS = 2**28

#: Statistics a scan can ask for (``--stats``) and the accumulators each one fills. Per-head maps
#: (``head_scores``/``head_probs``) follow ``--heads``; the q/k reservoir follows ``--reservoir``.
STATS: dict[str, tuple[str, ...]] = {
    "scores": ("scores", "score_groups"),  # and the per-sequence-group grid maps (the noise floor)
    "probs": ("probs",),
    "slash": ("slash",),
    "cosine": ("cosine", "norms", "aps_seq"),  # and each sequence's own APS
    "attn_cosine": ("attn_cosine", "attn_norms", "attn_aps_seq"),
    "qk": ("q_gram", "k_gram"),  # and the --reservoir sample of pre-RoPE q/k vectors
    "dim_logit": ("dim_logit",),
}
#: Every statistic. The default: the report and the analyses read all but ``probs``, and ``probs`` is
#: one extra reduction of the softmax that ``slash`` computes anyway.
ALL_STATS = frozenset(STATS)


def parse_stats(text) -> frozenset:
    """``"scores,probs"`` / ``"all"`` / an iterable of names -> a frozenset of :data:`STATS` names."""
    if text is None:
        return ALL_STATS
    parts = [p.strip() for p in (text.split(",") if isinstance(text, str) else text)]
    parts = [p for p in parts if p]
    if not parts:
        raise PoslensError(f"--stats is empty; pass one or more of {', '.join(STATS)} (comma-separated) or all.")
    if "all" in parts:
        return ALL_STATS
    bad = [p for p in parts if p not in STATS]
    if bad:
        raise PoslensError(f"--stats {','.join(bad)}: unknown statistic; choose from {', '.join(STATS)} or all.")
    return frozenset(parts)


@contextlib.contextmanager
def _half_input_matmuls(enabled: bool):
    """TF32 matrix products while enabled: capture's float32 products of bf16/fp16 inputs.

    A bf16 (8-bit mantissa) or fp16 (11-bit) value is exact in TF32's 10+1 bits except fp16's lowest
    bit, so TF32 multiplies the model's own numbers (almost) exactly and accumulates in float32, at
    the tensor cores' rate instead of the float32 units' (about 8x on an H100)."""
    if not enabled:
        yield
        return
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def _unrotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, H, S, D]`` back by the RoPE angle: the inverse of ``x*cos + rotate_half(x)*sin``.

    Written half by half into one output (no ``rotate_half`` copy, no concatenation); dimensions
    beyond the rotary width (partial rotary) pass through. ``cos``/``sin`` are ``[B, 1, S, r]``.
    """
    r = cos.shape[-1]
    h = r // 2
    xf = x.to(torch.float32)
    out = torch.empty_like(xf)
    x1, x2 = xf[..., :h], xf[..., h:r]
    # rotate_half(x) = [-x2, x1]; with -sin: out1 = x1 cos1 + x2 sin1, out2 = x2 cos2 - x1 sin2
    o1, o2 = out[..., :h], out[..., h:r]
    torch.mul(x1, cos[..., :h], out=o1)
    o1.addcmul_(x2, sin[..., :h])
    torch.mul(x2, cos[..., h:], out=o2)
    o2.addcmul_(x1, sin[..., h:], value=-1.0)
    if r < x.shape[-1]:
        out[..., r:] = xf[..., r:]
    return out.to(x.dtype)


def _unrotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Inverse of the interleaved rotation (pairs ``2l, 2l+1``; ``cos``/``sin`` repeat each angle twice):
    ``y = x cos + rot(x) sin`` with ``rot(x)_(2l, 2l+1) = (-x_(2l+1), x_(2l))``. Suffix passes through."""
    r = cos.shape[-1]
    xf = x.to(torch.float32)
    out = xf.clone()
    ye, yo = xf[..., 0:r:2], xf[..., 1:r:2]
    c, s = cos[..., 0:r:2], sin[..., 0:r:2]
    out[..., 0:r:2] = ye * c + yo * s
    out[..., 1:r:2] = yo * c - ye * s
    return out.to(x.dtype)


def unrotate_qk(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half"):
    """Pre-RoPE ``query``/``key`` ``[B, H, S, D]`` from post-RoPE ones and the model's ``cos``/``sin``
    ``[B, S, r]``, in the model's pair layout (``half`` or ``interleaved``)."""
    cos = cos[:, None].to(torch.float32)
    sin = sin[:, None].to(torch.float32)
    # Inverse rotation divided by attention_scaling^2 (cos^2 + sin^2, for scaled RoPE variants);
    # the division is folded into the small cos/sin tables rather than into a pass over q and k.
    s2 = cos[..., :1] ** 2 + sin[..., :1] ** 2
    cos, sin = cos / s2, sin / s2
    if layout == "interleaved":
        return _unrotate_interleaved(query, cos, sin), _unrotate_interleaved(key, cos, sin)
    return _unrotate(query, cos, sin), _unrotate(key, cos, sin)


def _run_qk_hooks(hooks: list, query: torch.Tensor, key: torch.Tensor) -> None:
    """Hand a layer's q/k to the ``q_pre``/``k_pre``/``q_post``/``k_post`` capture-point hooks
    (:func:`poslens.capture.adapters.hook_point`) registered on its attention module."""
    pre = None
    for point, fn, state in list(hooks):
        if point in ("q_post", "k_post"):
            fn(query if point == "q_post" else key)
            continue
        if pre is None:
            cs = state.get("cos_sin")
            pre = unrotate_qk(query, key, *cs, layout=state["layout"]) if (state["rope"] and cs is not None) \
                else (query, key)
        fn(pre[0] if point == "q_pre" else pre[1])


def half_layout_perm(head_dim: int, rotary_dim: int, device=None) -> torch.Tensor:
    """Dimension order that takes interleaved pairs ``(2l, 2l+1)`` to the rotate_half layout
    ``(l, l + r/2)``: ``[0, 2, 4, .., 1, 3, 5, .., r, r+1, ..]`` (the unrotated suffix stays)."""
    return torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2),
                      torch.arange(rotary_dim, head_dim)]).to(device)


def _sum_first(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)`` as in-place adds of the slices: the same float32 sum, but on the shared 2-thread
    benchmark machine a reduction over the outermost dim intermittently stalled for tens of ms."""
    if x.shape[0] == 1:
        return x[0]
    out = x[0] + x[1]
    for b in range(2, x.shape[0]):
        out += x[b]
    return out


def _causal_pair_dim_sum(qg: torch.Tensor, k: torch.Tensor, block: int = 64) -> torch.Tensor:
    """``sum_{j <= i} q[..., i, d] k[..., j, d]`` per dimension: ``[B, Hk, g, D]`` from grouped queries
    ``qg [B, Hk, g, S, D]`` and keys ``k [B, Hk, S, D]``.

    Equal to ``sum_i q_i * cumsum(k)_i``, computed blockwise (CPU cumsum is a slow sequential scan):
    pairs inside a block of ``block`` positions come from a small lower-triangular matmul, pairs
    across blocks from block totals and an exclusive cumsum over the few blocks.
    """
    B, Hk, g, S, D = qg.shape
    if S % block:
        return (qg * k.cumsum(dim=2)[:, :, None]).sum(dim=3)
    nb = S // block
    qb = qg.reshape(B, Hk, g, nb, block, D)
    kb = k.reshape(B, Hk, nb, block, D)
    tri = torch.ones(block, block, dtype=k.dtype, device=k.device).tril_()
    within = (qb * torch.matmul(tri, kb)[:, :, None]).sum(dim=(3, 4))  # pairs j <= i in one block
    ktot = kb.sum(dim=3)  # [B, Hk, nb, D]
    carry = ktot.cumsum(dim=2) - ktot  # keys of all earlier blocks
    return within + (qb.sum(dim=4) * carry[:, :, None]).sum(dim=3)


def _far_pair_dim_sum(qg: torch.Tensor, k: torch.Tensor, window: int) -> torch.Tensor:
    """``sum_{j <= i - window} q[..., i, d] k[..., j, d]``: the causal pairs outside a sliding window."""
    S = k.shape[2]
    if window >= S:
        return torch.zeros(qg.shape[:3] + (qg.shape[-1],), dtype=qg.dtype, device=qg.device)
    ck = k.cumsum(dim=2)[:, :, : S - window]  # keys j <= i - window for queries i = window .. S-1
    return (qg[:, :, :, window:] * ck[:, :, None]).sum(dim=3)


def _slash_view(zbuf: torch.Tensor, c: int, stop: int, pad: int) -> torch.Tensor:
    """View ``[H, c, stop]`` of the slash buffer with ``V[h, r, t] = A_h[start + r, start + r - d]``.

    ``zbuf [H, pad, W]`` holds a chunk's weights ``A_h[start + r, j]`` at column ``pad + j`` and zeros
    in its first ``pad >= c`` columns; ``d = stop - 1 - t`` with ``start = stop - c``. Row stride
    ``W + 1`` shifts each row one column further, so the columns line up by offset; entries with
    ``d > start + r`` (no such sub-diagonal element) land in the zero columns.
    """
    H, _, W = zbuf.shape
    return zbuf.as_strided((H, c, stop), (zbuf.stride(0), W + 1, 1), zbuf.storage_offset() + pad - c + 1)


def _head_gram(x: torch.Tensor) -> torch.Tensor:
    """``sum_{b,s} x[b,h,s] x[b,h,s]^T`` per head, float64 ``[H, D, D]`` (float32 products)."""
    B, H, S, D = x.shape
    xh = x.transpose(0, 1).reshape(H, B * S, D)
    return torch.bmm(xh.transpose(1, 2), xh).to(torch.float64)


def _symmetric_gram(a: torch.Tensor) -> torch.Tensor:
    """``a @ a.T`` (float32 ``[S, S]``) from the lower block triangle only, mirrored (exactly symmetric)."""
    S = a.shape[0]
    R = GRAM_BLOCK_ROWS
    if S <= R or a.is_cuda:  # on a GPU one large product beats many small ones plus the mirror copies
        return a @ a.T
    out = torch.empty(S, S, dtype=a.dtype, device=a.device)
    for r0 in range(0, S, R):
        r1 = min(S, r0 + R)
        out[r0:r1, :r1] = a[r0:r1] @ a[:r1].T
    for r0 in range(0, S - R, R):  # upper blocks right of each diagonal block: mirror the lower ones
        r1 = min(S, r0 + R)
        out[r0:r1, r1:] = out[r1:, r0:r1].T
    return out


_HALF = (torch.bfloat16, torch.float16)


def _nonfinite_error(layer, head) -> PoslensError:
    return PoslensError(f"non-finite attention scores in layer {layer}, head {head} (model overflow?); "
                        "try --dtype fp32 or check the checkpoint.")


def _fused_ok(query: torch.Tensor, key: torch.Tensor, window) -> bool:
    """Whether the fused CUDA kernels (:mod:`poslens.capture.cuda_maps`) take this layer's maps.

    ``POSLENS_CAPTURE_KERNEL=torch`` forces the chunked torch path (benchmarks, comparisons)."""
    if not query.is_cuda or window is not None or os.environ.get("POSLENS_CAPTURE_KERNEL", "auto") == "torch":
        return False

    return cuda_maps.supported(query, key)


# --------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------
def _padding_only_mask(batch_size=None, q_length=None, kv_length=None, q_offset=0, kv_offset=0,
                       mask_function=None, attention_mask=None, **kwargs):
    """Mask interface: pass the 2-D padding mask (``[B, S_kv]`` bool, or None) through untouched.

    The causal / sliding-window structure is applied by :func:`poslens_attention` itself, so
    the bidirectional control is a switch there rather than a different mask.
    """
    if attention_mask is None:
        return None
    if attention_mask.ndim == 2:
        am = attention_mask.to(torch.bool)
        return None if bool(am.all()) else am
    return attention_mask


def register() -> str:
    """Register the poslens attention and mask functions with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, poslens_attention)
    AttentionMaskInterface.register(ATTN_NAME, _padding_only_mask)
    return ATTN_NAME


# --------------------------------------------------------------------------------------------
# masks
# --------------------------------------------------------------------------------------------
def _structure_mask(Sq: int, Sk: int, *, causal: bool, window: int | None, device, q_offset: int = 0):
    """Bool ``[Sq, Sk]`` (True = attend) for the causal and sliding-window structure, or None."""
    if not causal and window is None:
        return None
    i = torch.arange(q_offset, q_offset + Sq, device=device)[:, None]  # absolute query positions
    j = torch.arange(Sk, device=device)[None, :]
    m = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if causal:
        m &= j <= i
    if window is not None:
        m &= (i - j) < window
    return m


def _full_mask(structure, padding, B, Sq, Sk, device):
    """Combine the structure ``[Sq, Sk]`` and padding ``[B, Sk]`` masks into ``[B, 1, Sq, Sk]`` (or None)."""
    m = None
    if structure is not None:
        m = structure[None, None]
    if padding is not None:
        if padding.ndim == 4:  # an already prepared 4-D mask: additive float or bool
            pm = padding if padding.dtype == torch.bool else padding > torch.finfo(padding.dtype).min / 2
            pm = pm[..., -Sk:]
        else:
            pm = padding[:, None, None, -Sk:].to(torch.bool)
        m = pm if m is None else (m & pm)
    return m


# --------------------------------------------------------------------------------------------
# the attention function
# --------------------------------------------------------------------------------------------
def poslens_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      sliding_window=None, is_causal=None, **kwargs):
    """Attention through SDPA with the causal/padding mask applied here; captures when active.

    Signature as transformers' ``AttentionInterface`` functions: returns ``(out [B, S, H, D], None)``.
    """
    cap = _ACTIVE
    layer = getattr(module, "layer_idx", None)
    B, H, Sq, D = query.shape
    Sk = key.shape[2]
    if scaling is None:
        scaling = 1.0 / math.sqrt(D)
    causal = True if is_causal is None else bool(is_causal)
    causal = causal and getattr(module, "is_causal", True)
    if cap is not None and cap.spec.bidirectional:
        causal = False

    if sliding_window is None:  # Qwen2-MoE keeps its window on the module and passes it only in the mask
        sliding_window = getattr(module, "sliding_window", None)
    qk_hooks = getattr(module, "_poslens_qk_hooks", None)
    if qk_hooks:  # q/k capture points: the layer's queries and keys before and after RoPE
        _run_qk_hooks(qk_hooks, query, key)
    if cap is not None:  # what the dry run checks (every layer dispatches here) and each layer's window
        cap.seen_layers.add(layer)
        cap.windows[layer] = int(sliding_window) if sliding_window else None
        cap.scalings[layer] = float(scaling)
        cap.use_layer_rope(layer)

    # Inference-time control: attend with the un-rotated queries and keys in chosen layers.
    if cap is not None and layer in cap.spec.no_rope_layers and layer in cap.spec.rope_layers:
        query, key = cap.unrotate(query, key)

    window = int(sliding_window) if sliding_window else None
    if window is not None and window >= Sk:
        window = None
    padding = attention_mask
    if padding is not None and padding.ndim == 2 and bool(padding.all()):
        padding = None
    q_offset = Sk - Sq
    if padding is None and window is None and (not causal or Sq == Sk):
        mask, sdpa_causal = None, causal and Sq > 1
    else:
        mask = _full_mask(_structure_mask(Sq, Sk, causal=causal, window=window, device=query.device,
                                           q_offset=q_offset),
                          padding, B, Sq, Sk, query.device)
        sdpa_causal = False
    softcap = kwargs.get("softcap")
    if softcap:  # SDPA cannot soft-cap the logits: compute as eager attention does
        out = _eager_softcap_attention(query, key, value, mask, sdpa_causal, scaling, float(softcap))
    else:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0,
            is_causal=sdpa_causal, scale=scaling, enable_gqa=key.shape[1] != H,
        )
    if cap is not None and layer in cap.layer_pos:
        if padding is not None or Sq != Sk:
            raise PoslensError("capture needs full, unpadded sequences without a KV cache; scan feeds packed "
                               "sequences of exactly --seq-len tokens.")
        cap.observe_attention(layer, query, key, out, scaling, causal=causal, window=window,
                              softcap=float(softcap) if softcap else None)
    return out.transpose(1, 2).contiguous(), None


def _eager_softcap_attention(query, key, value, mask, causal, scaling, softcap):
    """Attention with logit soft-capping (Gemma 2): ``softcap * tanh(q.k * scaling / softcap)``, then
    the mask, softmax in float32 and ``p . v``, as transformers' eager implementation. ``[B, H, S, D]``."""
    H, Hk = query.shape[1], key.shape[1]
    if Hk != H:
        key = key.repeat_interleave(H // Hk, dim=1)
        value = value.repeat_interleave(H // Hk, dim=1)
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    logits = torch.tanh(logits / softcap) * softcap
    if mask is None and causal:
        Sq, Sk = logits.shape[-2:]
        mask = _structure_mask(Sq, Sk, causal=True, window=None, device=query.device, q_offset=Sk - Sq)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    p = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(p, value)


# --------------------------------------------------------------------------------------------
# capture state
# --------------------------------------------------------------------------------------------
@dataclass
class CaptureSpec:
    """What to capture: model geometry, which layers/heads, and the controls."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    seq_len: int
    layers: list[int]
    rope_layers: set[int] = field(default_factory=set)
    heads: list[tuple[int, int]] = field(default_factory=list)  # (layer, head) pairs with S x S maps
    no_rope_layers: set[int] = field(default_factory=set)
    bidirectional: bool = False
    chunk_elems: int = 0  # logits per query-row chunk (B * H * c * S), bounds the working set; 0 = per device
    stats: frozenset = ALL_STATS  # which statistics to accumulate (names of STATS)
    rope_layout: str = "half"  # the model's RoPE pair layout: "half" (rotate_half) or "interleaved" (Cohere)
    reservoir: int = 0  # token slots with pre-RoPE q/k vectors kept (0 = none); see capture.reservoir
    seed: int = 0  # seeds the reservoir's slot keys
    aps_max_positions: int = 256  # positions per sequence for the per-sequence APS (evenly spaced subsample)
    noise_groups: int = NOISE_GROUPS  # independent sequence groups whose score-map sums give the noise floor
    noise_max_positions: int = 128  # group maps are kept on a strided grid of at most this many positions


def noise_grid(S: int, max_positions: int) -> torch.Tensor:
    """Positions ``0, s, 2s, ...`` (stride ``s = ceil(S / max_positions)``) of the group score maps:
    a constant stride keeps a Toeplitz map Toeplitz, so relativity is judged on the grid as on the map."""
    return torch.arange(0, S, -(-S // max(1, max_positions)))


def accumulator_shapes(spec: CaptureSpec) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every accumulated tensor (these are also the ``maps.safetensors`` names)."""
    L, H, Hk, D, S = len(spec.layers), spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.seq_len
    shapes = {
        "scores": (L, S, S),
        "probs": (L, S, S),
        "slash": (L, H, S),
        "cosine": (L + 1, S, S),
        "norms": (L + 1, S),
        "attn_cosine": (L, S, S),
        "attn_norms": (L, S),
        "q_gram": (L, H, D, D),
        "k_gram": (L, Hk, D, D),
        "dim_logit": (L, H, D),
        "aps_seq": (L + 1,),
        "attn_aps_seq": (L,),
    }
    wanted = {a for st in spec.stats for a in STATS[st]} - {"score_groups"}  # a GroupAccumulator, see Capture
    shapes = {k: v for k, v in shapes.items() if k in wanted}
    if spec.heads:
        shapes["head_scores"] = (len(spec.heads), S, S)
        shapes["head_probs"] = (len(spec.heads), S, S)
    return shapes


#: accumulators that also keep a sum of squares (per-sequence statistics: mean and std over sequences)
_WITH_VAR = ("aps_seq", "attn_aps_seq")


class Capture:
    """Streaming accumulators for one scan; every sum is float64 and every count is sequences.

    Definitions (all means over sequences; ``scaling`` is the model's logit scale):

    - ``scores[l, i, j]``: mean over heads of ``scaling * q_i . k_j`` (post-RoPE, GQA keys repeated),
      before any mask; 0 above the diagonal in causal runs (never computed);
    - ``probs[l, i, j]``: mean over heads of the post-softmax attention weight;
    - ``slash[l, h, d]``: ``(1/(S-d)) sum_{i>=d} A_h[i, i-d]`` (SlashScore(d), arXiv 2601.08297);
    - ``cosine[k, i, j]`` / ``norms[k, i]``: self-cosine and norm of residual-stream vectors,
      k = 0 the input of the first layer (embeddings), k = m + 1 the output of captured layer m;
    - ``attn_cosine`` / ``attn_norms``: the same for the concatenated head outputs before the
      output projection (arXiv 2501.00073);
    - ``q_gram[l, h]`` / ``k_gram[l, g]``: per-token second moment ``(1/S) sum_i x_i x_i^T`` of
      pre-RoPE queries / keys (per KV head); its eigenvalues are the squared singular values of
      the tokens x head_dim matrix, so rank measures are exact over every token seen;
    - ``dim_logit[l, h, d]``: mean over causal pairs j <= i of ``scaling * q_{i,d} k_{j,d}``
      (post-RoPE): per-dimension contribution to the logit, summed into RoPE bands in the summary;
    - ``aps_seq[k]`` / ``attn_aps_seq[l]``: the paper's per-sequence APS (arXiv 2501.00073) of each
      sequence's own self-cosine map (same vectors as ``cosine`` / ``attn_cosine``, on at most
      ``aps_max_positions`` evenly spaced positions), with sum of squares: mean and std over sequences;
    - ``score_groups[g, l]``: ``scores`` summed separately over sequence groups ``g = sequence % G`` on
      the :func:`noise_grid` positions; the spread of the groups is the noise floor of the score-map
      statistics.
    """

    def __init__(self, spec: CaptureSpec, device="cpu"):
        self.spec = spec
        self.layer_pos = {l: n for n, l in enumerate(spec.layers)}
        self.head_pos = {}
        for n, (l, h) in enumerate(spec.heads):
            self.head_pos.setdefault(l, []).append((n, h))
        self.accs = AccumulatorSet({k: MeanAccumulator(s, device=device, with_var=k in _WITH_VAR)
                                    for k, s in accumulator_shapes(spec).items()})
        self.grid = noise_grid(spec.seq_len, spec.noise_max_positions).to(device)
        if "scores" in spec.stats:
            n = self.grid.numel()
            self.accs["score_groups"] = GroupAccumulator(spec.noise_groups, (len(spec.layers), n, n), device=device)
        self._seq0 = 0  # global index of the batch's first sequence (sequence n is in noise group n % G)
        self.rope_cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
        #: per layer, the (cos, sin) its attention module received (Gemma 3: one table per layer type)
        self.rope_by_layer: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seen_layers: set = set()  # layers whose attention reached the registered function
        self.windows: dict = {}  # sliding window each layer asked for (None = full)
        self.scalings: dict = {}  # logit scale each layer used
        self._batch_size = 0
        self._next_seq = 0
        self.reservoir = None
        if spec.reservoir and "qk" in spec.stats:  # the sample of pre-RoPE q/k vectors belongs to the qk statistic

            self.reservoir = QKReservoir(spec.reservoir, len(spec.layers), spec.num_heads, spec.num_kv_heads,
                                         spec.head_dim, spec.seq_len, seed=spec.seed, device=device)

    # -- context ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        """Route the registered attention function's captures into this object."""
        global _ACTIVE
        prev, _ACTIVE = _ACTIVE, self
        try:
            yield self
        finally:
            _ACTIVE = prev

    def begin_batch(self, batch_size: int, seq_start: int | None = None) -> None:
        """Start a batch of ``batch_size`` sequences; ``seq_start`` is the global index of its first
        sequence (default: right after the previous batch), which fixes the reservoir's slot keys and
        the noise groups (sequence n in group ``n % noise_groups``)."""
        self._batch_size = int(batch_size)
        seq_start = self._next_seq if seq_start is None else int(seq_start)
        self._seq0 = seq_start
        self._next_seq = seq_start + self._batch_size
        if self.reservoir is not None:
            self.reservoir.begin_batch(seq_start, self._batch_size)

    def end_batch(self) -> None:
        """Count the batch's sequences once in every accumulator (sums were added per layer)."""
        for acc in self.accs.values():
            if isinstance(acc, GroupAccumulator):
                acc.counts += torch.bincount(self._seq_groups("cpu"), minlength=acc.groups)
            else:
                acc.count += self._batch_size
        self._batch_size = 0
        if self.reservoir is not None:
            self.reservoir.end_batch()

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every accumulated tensor (sums, counts, reservoir): what a checkpoint holds."""
        out = self.accs.state_dict()
        if self.reservoir is not None:
            out.update(self.reservoir.state_dict())
        return out

    def load_state_dict(self, state, *, copy: bool = True) -> None:
        """Load a :meth:`state_dict`; ``copy=False`` adopts the tensors (a state just read from a file)."""
        self.accs.load_state_dict(state, copy=copy)
        if self.reservoir is not None:
            if "reservoir.keys" not in state:
                raise PoslensError("the checkpoint has no q/k reservoir; resume with the original --reservoir.")
            self.reservoir.load_state_dict(state)

    def all_reduce(self, group=None) -> None:
        """Sum the accumulators and merge the reservoirs of all processes (torch.distributed)."""
        self.accs.all_reduce(group)
        if self.reservoir is not None:
            self.reservoir.all_gather_merge(group)

    # -- RoPE -------------------------------------------------------------------------------
    def use_layer_rope(self, layer) -> None:
        """Make the cos/sin that ``layer``'s attention received the current ones (for :meth:`unrotate`)."""
        cs = self.rope_by_layer.get(layer)
        if cs is not None:
            self.rope_cos_sin = cs

    def unrotate(self, query: torch.Tensor, key: torch.Tensor):
        """Pre-RoPE queries and keys from post-RoPE ones with the model's own cos/sin (in the model's
        pair layout: rotate_half, or interleaved pairs for Cohere)."""
        if self.rope_cos_sin is None:
            raise PoslensError("no RoPE cos/sin were observed for this forward; the adapter's rotary module hook "
                               "did not fire (unsupported architecture?).")
        return unrotate_qk(query, key, *self.rope_cos_sin, layout=self.spec.rope_layout)

    def _seq_groups(self, device) -> torch.Tensor:
        """Noise group of each sequence of the current batch: ``(seq_start + b) % noise_groups``."""
        return (torch.arange(self._batch_size, device=device) + self._seq0) % self.spec.noise_groups

    # -- hidden states ----------------------------------------------------------------------
    @torch.no_grad()
    def observe_hidden(self, index: int, hidden: torch.Tensor) -> None:
        """Add residual-stream vectors ``[B, S, d]`` at ``cosine``/``norms`` index ``index``."""
        if "cosine" not in self.spec.stats:
            return
        with _half_input_matmuls(hidden.is_cuda and hidden.dtype in _HALF):
            self._add_cosine("cosine", "norms", index, hidden)

    def _add_cosine(self, cos_name, norm_name, index, x):
        """Add ``sum_b cos(x_bi, x_bj)`` and ``sum_b |x_bi|`` for ``x`` ``[B, S, ...]`` (trailing dims flattened),
        and each sequence's own APS (part of the same statistic).

        The unit vectors are written once, sequence-major (``[S, B * d]``), so the batch sum is one
        float32 matrix product with inner dimension ``B * d``; only its lower block triangle is
        computed (the matrix is symmetric) and mirrored, then added to the float64 sum.
        """
        aps = per_sequence_aps(x, self.spec.aps_max_positions).to(torch.float64)
        acc = self.accs["aps_seq" if cos_name == "cosine" else "attn_aps_seq"]
        acc.sum[index] += aps.sum()
        acc.sumsq[index] += (aps * aps).sum()
        B, S = x.shape[:2]
        x = x.to(torch.float32)
        n = torch.linalg.vector_norm(x, dim=tuple(range(2, x.ndim)))  # [B, S]
        folded = torch.empty((S, B) + tuple(x.shape[2:]), dtype=torch.float32, device=x.device)
        inv = n.clamp_min(1e-30).reciprocal_().T.reshape((S, B) + (1,) * (x.ndim - 2))
        torch.mul(x.transpose(0, 1), inv, out=folded)
        folded = folded.reshape(S, -1)
        self.accs[cos_name].sum[index] += _symmetric_gram(folded)
        self.accs[norm_name].sum[index] += n.sum(0, dtype=torch.float64)

    # -- attention --------------------------------------------------------------------------
    def _half_perm(self, D: int, device) -> torch.Tensor:
        rot = self.rope_cos_sin[0].shape[-1] if self.rope_cos_sin is not None else D
        return half_layout_perm(D, rot, device)

    def _rows_per_chunk(self, B: int, H: int, S: int, device) -> int:
        """Query rows per chunk: ``spec.chunk_elems`` logits at most (0: per device); on CPU also a
        cache-sized block.

        On the CPU every chunk is read several times (sum, mask, softmax, batch sum, gather); a block
        of a few megabytes stays cache-resident across those passes (measured: softmax 0.7-2 ns per
        logit instead of ~8 at 32 MiB chunks), and short row blocks also cut the causal key range
        closer to the diagonal. On CUDA launches, not caches, are the cost: large chunks.
        """
        elems = self.spec.chunk_elems
        if torch.device(device).type == "cpu":
            elems = min(elems or CPU_CHUNK_ELEMS, CPU_CHUNK_ELEMS)
        elif not elems:
            elems = CUDA_CHUNK_ELEMS
        return min(S, max(1, elems // max(1, B * H * S)))

    @torch.no_grad()
    def observe_attention(self, layer, query, key, out, scaling, *, causal=True, window=None,
                          softcap=None) -> None:
        """Add one layer's attention statistics (only those in ``spec.stats``) for a batch."""
        with _half_input_matmuls(query.is_cuda and query.dtype in _HALF):
            self._observe_attention(layer, query, key, out, scaling, causal, window, softcap)

    def _observe_attention(self, layer, query, key, out, scaling, causal, window, softcap) -> None:
        spec, stats = self.spec, self.spec.stats
        li = self.layer_pos[layer]
        acc = self.accs
        B, H, S, D = query.shape
        heads_here = self.head_pos.get(layer, [])
        want_qk = "qk" in stats
        want_maps = bool(stats & {"scores", "probs", "slash"}) or bool(heads_here)
        fused = want_maps and softcap is None and _fused_ok(query, key, window)
        q = k = None
        if want_qk or "dim_logit" in stats or (want_maps and not fused):
            # contiguous once: transformers hands [B, S, H, D] projections transposed to [B, H, S, D],
            # whose (batch, head) strides do not merge, so every chunk's batched matmul would copy them
            q = query.to(torch.float32).contiguous()
            k = key.to(torch.float32).contiguous()

        # pre-RoPE second moments (rank analysis), one [B*S, D] x [B*S, D] product per head
        if want_qk:
            if layer in spec.rope_layers:
                q_pre, k_pre = self.unrotate(q, k)
            else:
                q_pre, k_pre = q, k
            if spec.rope_layout == "interleaved":  # statistics in the rotate_half layout (pair l = dims l, l + r/2)
                q_pre, k_pre = (t.index_select(-1, self._half_perm(D, q.device)) for t in (q_pre, k_pre))
            acc["q_gram"].sum[li] += _head_gram(q_pre).div_(S)
            acc["k_gram"].sum[li] += _head_gram(k_pre).div_(S)
            if self.reservoir is not None:
                self.reservoir.observe(li, q_pre, k_pre)
            del q_pre, k_pre
        if q is not None and spec.rope_layout == "interleaved":  # dim_logit by pair; logits are unchanged
            q, k = (t.index_select(-1, self._half_perm(D, q.device)) for t in (q, k))

        # per-dimension logit contribution over causal pairs j <= i
        if "dim_logit" in stats:
            Hk = key.shape[1]
            qg = q.view(B, Hk, H // Hk, S, D)
            dim_sum = _sum_first(_causal_pair_dim_sum(qg, k)).reshape(H, D)
            n_pairs = S * (S + 1) / 2
            if window is not None and causal:  # only the pairs a query sees: drop those with i - j >= window
                dim_sum -= _sum_first(_far_pair_dim_sum(qg, k, window)).reshape(H, D)
                n_pairs = sum(min(i + 1, window) for i in range(S))
            acc["dim_logit"].sum[li] += (scaling * dim_sum.to(torch.float64) / n_pairs)
            del qg

        if want_maps:
            maps = None
            if fused:
                maps = cuda_maps.attention_maps(query, key, scaling, causal=causal, scores="scores" in stats,
                                                probs="probs" in stats, slash="slash" in stats,
                                                heads=[h for _, h in heads_here])
                if not bool(torch.stack([torch.isfinite(t).all() for t in maps.values()]).all()):  # one sync
                    maps = None  # non-finite logits somewhere: the checked path names the head (or masks them)
                    q = query.to(torch.float32).contiguous()
                    k = key.to(torch.float32).contiguous()
            if maps is None:
                maps = self._attention_maps(layer, q, k, scaling, causal, window, softcap, heads_here,
                                            checked=not query.is_cuda)
            if maps is None:  # the unchecked CUDA pass saw non-finite values: redo it with per-chunk checks
                maps = self._attention_maps(layer, q, k, scaling, causal, window, softcap, heads_here, checked=True)
            if "scores" in stats:  # float32 per-call sums into the float64 sums, without a float64 temporary
                acc["scores"].sum[li].add_(maps["scores"], alpha=1.0 / H)
                self._add_score_groups(li, query, key, scaling, causal, softcap)
            if "probs" in stats:
                acc["probs"].sum[li].add_(maps["probs"], alpha=1.0 / H)
            if "slash" in stats:
                acc["slash"].sum[li] += maps["slash"].to(torch.float64) / (
                    S - torch.arange(S, device=maps["slash"].device, dtype=torch.float64))
            for m, (n, _h) in enumerate(heads_here):
                acc["head_scores"].sum[n] += maps["head_scores"][m].to(torch.float64)
                acc["head_probs"].sum[n] += maps["head_probs"][m].to(torch.float64)
        del q, k

        # attention output before the output projection: [B, H, S, D] -> [B, S, H*D] (a view; the
        # sequence-major copy is made once, inside _add_cosine)
        if "attn_cosine" in stats:
            self._add_cosine("attn_cosine", "attn_norms", li, out.transpose(1, 2))

    def _add_score_groups(self, li, query, key, scaling, causal, softcap) -> None:
        """Head-summed scores of each sequence on the noise grid, added to its sequence group.

        Only grid rows and keys are computed (``[B, H, n, n]``, n <= ``noise_max_positions``): a
        small product beside the full maps, whichever path computed those. Above the diagonal stays 0
        (as in ``scores``); entries outside a sliding window are masked when the summary reads them.
        """
        B, H = query.shape[:2]
        Hk = key.shape[1]
        grid = self.grid.to(query.device)
        qg = query[:, :, grid].to(torch.float32)
        kg = key[:, :, grid].to(torch.float32)
        if Hk != H:
            kg = kg.repeat_interleave(H // Hk, dim=1)
        logits = torch.matmul(qg, kg.transpose(-1, -2)).mul_(scaling)  # [B, H, n, n]
        if softcap is not None:
            logits = torch.tanh_(logits.div_(softcap)).mul_(softcap)
        part = logits.sum(dim=1)
        if causal:
            part.masked_fill_(grid[None, :] > grid[:, None], 0.0)
        part = torch.nan_to_num(part, nan=0.0, posinf=0.0, neginf=0.0).to(torch.float64).div_(H)
        acc = self.accs["score_groups"]
        acc.sum[:, li].index_add_(0, self._seq_groups(acc.sum.device), part.to(acc.sum.device))

    def _attention_maps(self, layer, q, k, scaling, causal, window, softcap, heads_here, *, checked: bool):
        """Batch/head sums of one layer's scores, weights, slash profile and per-head maps (float32).

        Query-row chunks: only ``[B, H, c, S]`` logits live at a time. A causal row block
        ``[start, stop)`` needs keys ``< stop`` only, so the key range is cut there; the causal mask
        is applied in place to the diagonal block only (the keys before the block are all visible).
        Each entry of a sum is written once (row blocks are disjoint). ``checked``: test every chunk
        for non-finite logits at once (a host sync per chunk, free on the CPU); unchecked (CUDA) the
        test is one flag read after the loop, and ``None`` is returned when it fires.
        """
        stats = self.spec.stats
        B, H, S, D = q.shape
        Hk = k.shape[1]
        g = H // Hk
        dev = q.device
        want_s, want_p, want_sl = "scores" in stats, "probs" in stats, "slash" in stats
        rows = self._rows_per_chunk(B, H, S, dev)
        # GQA without repeating keys: query head h = kv * g + r uses key head kv, so the g query
        # heads of one key head are a grouped view [B, Hk, g, S, D] of the queries.
        qg = q.view(B, Hk, g, S, D)
        qs = (qg * scaling) if scaling != 1.0 else qg  # the scale folded into the (small) queries
        kT = k.transpose(2, 3)  # [B, Hk, D, S]
        f32 = dict(dtype=torch.float32, device=dev)
        out = {}
        if want_s:
            out["scores"] = torch.zeros(S, S, **f32)
        if want_p:
            out["probs"] = torch.zeros(S, S, **f32)
        if want_sl:
            out["slash"] = torch.zeros(H, S, **f32)
        if heads_here:
            out["head_scores"] = torch.zeros(len(heads_here), S, S, **f32)
            out["head_probs"] = torch.zeros(len(heads_here), S, S, **f32)
        need_p = want_p or want_sl or bool(heads_here)
        bad = None if checked else torch.zeros((), dtype=torch.bool, device=dev)
        above = torch.ones(rows, rows, dtype=torch.bool, device=dev).triu_(1)  # j > i inside a diagonal block
        # Slash by offset without an index gather: each chunk's batch-summed weights are written into
        # a buffer whose rows start after `rows` zero columns; a view with row stride W + 1 then
        # lines up, in row r and column t, the entry A[i, i - d] with d = stop - 1 - t (i = start + r),
        # and reads a zero where i - d < 0 (see _slash_view). Its row sum is the chunk's slash sum.
        W = rows + S
        zbuf = torch.empty(H, rows, W, **f32)
        zbuf[:, :, :rows] = 0.0
        for start in range(0, S, rows):
            stop = min(S, start + rows)
            c = stop - start
            nc = stop if causal else S  # keys a causal row block can see
            if g == 1:
                logits = torch.matmul(qs[:, :, 0, start:stop], kT[:, :, :, :nc])  # [B, H, c, nc]
            else:
                qc = qs[:, :, :, start:stop].reshape(B, Hk, g * c, D)
                logits = torch.matmul(qc, kT[:, :, :, :nc]).view(B, H, c, nc)
            if softcap is not None:  # Gemma 2: the logits the softmax sees are capped, so are the captured ones
                logits = torch.tanh_(logits.div_(softcap)).mul_(softcap)
            if want_s:
                block_sum = logits.sum(dim=(0, 1))  # [c, nc]: the scores' batch/head sum
                if checked and not bool(torch.isfinite(block_sum).all()):  # locate the head only on failure
                    allowed = _structure_mask(c, nc, causal=causal, window=window, device=dev, q_offset=start)
                    bad_l = ~torch.isfinite(logits)
                    if allowed is not None:
                        bad_l &= allowed
                    if bool(bad_l.any()):
                        raise _nonfinite_error(layer, int(bad_l.any(dim=(0, 2, 3)).nonzero()[0]))
                    block_sum = logits.masked_fill(~torch.isfinite(logits), 0.0).sum(dim=(0, 1))
                if causal:  # above the diagonal: not part of the causal scores, stored as 0
                    block_sum[:, start:stop].masked_fill_(above[:c, :c], 0.0)
                if window is not None:  # outside the sliding window: unseen, stored as 0 like above the diagonal
                    allowed = _structure_mask(c, nc, causal=causal, window=window, device=dev, q_offset=start)
                    block_sum.masked_fill_(~allowed, 0.0)
                if bad is not None:
                    bad |= ~torch.isfinite(block_sum).all()
                out["scores"][start:stop, :nc] = block_sum
            if window is not None:
                logits.masked_fill_(~allowed, float("-inf"))
            elif causal:
                logits[..., start:stop].masked_fill_(above[:c, :c], float("-inf"))
            for m, (_n, h) in enumerate(heads_here):
                lh = logits[:, h]
                out["head_scores"][m, start:stop, :nc] = _sum_first(lh.masked_fill(~torch.isfinite(lh), 0.0))
            if not need_p:
                del logits
                continue
            p = torch.softmax(logits, dim=-1)
            del logits
            for m, (_n, h) in enumerate(heads_here):
                out["head_probs"][m, start:stop, :nc] = _sum_first(p[:, h])
            pb = zbuf[:, :c, rows:rows + nc]  # [H, c, nc]: the batch sum, written into the slash buffer
            if dev.type == "cpu":
                pb.copy_(p[0])
                for b in range(1, B):
                    pb.add_(p[b])
            else:
                torch.sum(p, dim=0, out=pb)
            del p
            if checked and not bool(torch.isfinite(pb).all()):  # softmax of an allowed +inf/NaN logit
                raise _nonfinite_error(layer, int((~torch.isfinite(pb)).any(dim=(1, 2)).nonzero()[0]))
            if bad is not None:
                bad |= ~torch.isfinite(pb).all()
            if want_p:
                out["probs"][start:stop, :nc] = pb.sum(0)
            if want_sl:
                out["slash"][:, :stop] += _slash_view(zbuf, c, stop, rows).sum(dim=1).flip(-1)
            del pb
        if bad is not None and bool(bad):
            return None
        return out

    # -- results ----------------------------------------------------------------------------
    def means(self) -> dict[str, torch.Tensor]:
        """Mean of every accumulator (float64); upper triangles of causal maps are left as computed."""
        return {name: acc.mean for name, acc in self.accs.items()}

    def release_means(self, dtype=torch.float32) -> dict[str, torch.Tensor]:
        """Means in ``dtype``, converting and freeing the float64 sums one by one.

        Peak memory stays at the sums' size instead of sums plus means (at 4,096 tokens and 16
        layers the sums alone are 8.7 GB). The accumulators are empty afterwards: call this last.
        """
        out = {}
        for name, acc in self.accs.items():
            if isinstance(acc, GroupAccumulator):  # group means of the non-empty groups, and their counts
                out[name], counts = acc.group_means()
                out[name] = out[name].to(dtype)
                out[name.replace("groups", "group_counts")] = counts.to(torch.int64)
                continue
            if acc.count == 0:
                out[name] = acc.mean.to(dtype)
            else:
                out[name] = acc.sum.div_(acc.count).to(dtype)
            acc.sum, acc.count = torch.zeros(0, dtype=torch.float64), 0
        return out
