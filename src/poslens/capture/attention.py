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
function from the model it is attached to (:meth:`Capture.bind`) also adds to streaming float64 accumulators (:class:`poslens.capture.stats.AccumulatorSet`).
The batch and head reductions are folded into matrix products, and the softmax is taken in
query-row chunks, so memory is bounded by the result (``S x S`` per layer) and one chunk of
``B x H x c x S`` logits, never by ``B x H x S x S`` per layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from poslens import native
from poslens.capture import cuda_maps
from poslens.capture.builtin import active_statistics, stats_table
from poslens.capture.builtin.base import LayerBatch
from poslens.capture.builtin.cosine import _HALF, half_input_matmuls
from poslens.capture.kernels import finite as _finite
from poslens.capture.kernels import nonfinite_error as _nonfinite_error
from poslens.capture.reservoir import QKReservoir
from poslens.capture.statistic import (check_needs, flatten_state, qualified_name, resolve_statistic,
                                       unflatten_state)
from poslens.capture.stats import AccumulatorSet, GroupAccumulator, NOISE_GROUPS
from poslens.errors import PoslensError

ATTN_NAME = "poslens"

#: The captures active in this context, innermost last (``()``: plain SDPA). A context variable, not
#: a module global: a thread (or asyncio task) sees only the captures it activated itself, and a
#: capture bound to one model's attention modules never sees another model's calls.
_ACTIVE: contextvars.ContextVar[tuple] = contextvars.ContextVar("poslens_active_captures", default=())


def active_capture(module=None) -> "Capture | None":
    """The capture that takes ``module``'s attention calls here: the innermost active one bound to
    ``module`` (or bound to no model), else None."""
    for cap in reversed(_ACTIVE.get()):
        if cap.owns(module):
            return cap
    return None


# --------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------
#: Logits per chunk on CPU (float32) where the shared L3 cache is unknown or small (4 MiB): small enough
#: to stay cache-resident across a chunk's several passes (matmul, mask, softmax in place, p @ v,
#: batch and head sums), large enough that a layer is a few dozen chunks (every chunk costs a fixed
#: few dozen op calls, and every op is a parallel region; on a shared machine each one risks a stall
#: while a worker thread is descheduled). See :func:`cpu_chunk_elems`.
CPU_CHUNK_ELEMS = 2**20

#: The most logits per CPU chunk (float32: 16 MiB), on a CPU whose shared L3 cache holds eight of them.
CPU_CHUNK_ELEMS_MAX = 2**22


@functools.lru_cache(maxsize=1)
def _l3_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The shared L3 cache of CPU 0 in bytes (Linux sysfs), None where it cannot be read."""
    import glob

    for d in sorted(glob.glob(f"{root}/index*")):
        try:
            with open(f"{d}/level") as f:
                if f.read().strip() != "3":
                    continue
            with open(f"{d}/size") as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        try:
            return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        except ValueError:
            return None
    return None


def cpu_chunk_elems() -> int:
    """Logits per CPU chunk: an eighth of the shared L3 cache (a chunk and the buffers of its size that
    its passes write stay well inside it, beside the model's own working set), between
    :data:`CPU_CHUNK_ELEMS` (4 MiB) and :data:`CPU_CHUNK_ELEMS_MAX` (16 MiB). Chunks of the size of the
    L3 cache fall out of it between passes and make the capture markedly dearer; chunks much smaller
    than it pay the fixed cost per chunk more often. On the benchmark model (``bench_scan.py``) a
    32 MiB L3 runs best at 4 MiB, a 480 MiB one at 16 MiB."""
    l3 = _l3_bytes()
    if not l3:
        return CPU_CHUNK_ELEMS
    return max(CPU_CHUNK_ELEMS, min(CPU_CHUNK_ELEMS_MAX, 1 << ((l3 // 8 // 4).bit_length() - 1)))

#: Rows per CPU chunk of each (batch, key head) logit product (``g`` query heads of a key head times
#: ``c`` query rows: ``c = CPU_TARGET_ROWS / g``, rounded up) by default; fewer, down to
#: ``CPU_MIN_ROWS / g``, where a single sequence's chunk would outgrow the cache budget (long
#: sequences). Thinner products run below GEMM speed; taller row blocks compute more logits above
#: the diagonal. Per layer on the Xeon, 1,024 tokens, scores and probs: 128 rows took 0.94x the time
#: of 64 on the benchmark model (192 and 256 rows: 1.01x), and SmolLM2's 3 x 44 rows 0.91x its 3 x 113.
CPU_TARGET_ROWS = 128
CPU_MIN_ROWS = 64

#: Rows per band when the fused CUDA kernels' full maps are reduced to --map-size block sums.
_FUSED_BAND_ROWS = 4096

#: Rows of the row bands of the --map-size block Gram.
GRAM_BLOCK_ROWS = 128

#: Logits per chunk on CUDA (float32: 1 GiB) for the torch fallback path: a layer is a few chunks, so
#: a few dozen kernel launches instead of thousands (the CPU size gave ~64 chunks per layer at 4k tokens).
CUDA_CHUNK_ELEMS = 2**28

#: Statistics a scan can ask for (``--stats``) and the accumulators each one fills, from the registry
#: of built-in statistics (:mod:`poslens.capture.builtin`, one module each). Per-head maps
#: (``head_scores``/``head_probs``) follow ``--heads``; the q/k reservoir follows ``--reservoir``.
STATS: dict[str, tuple[str, ...]] = stats_table()
#: Every statistic. The default: the report and the analyses read all but ``probs``, and ``probs`` is
#: one extra reduction of the softmax that ``slash`` computes anyway.
ALL_STATS = frozenset(STATS)


def _stat_parts(text) -> list | None:
    """The items of a ``--stats`` value: names (stripped, empty ones dropped) and statistic objects."""
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    return [p.strip() if isinstance(p, str) else p for p in items if not (isinstance(p, str) and not p.strip())]


def _is_user(part) -> bool:
    """A user's statistic: an object, or a qualified class name (``package.module.Class``)."""
    return not isinstance(part, str) or (part not in STATS and "." in part)


def parse_stats(text) -> frozenset:
    """``"scores,probs"`` / ``"all"`` / an iterable of names -> a frozenset of :data:`STATS` names.

    Users' statistics in the iterable (:class:`poslens.Statistic` objects or qualified class names)
    are left to :func:`user_statistics`; a value of nothing but those asks for no built-in one."""
    parts = _stat_parts(text)
    if parts is None:
        return ALL_STATS
    if not parts:
        raise PoslensError(f"--stats is empty; pass one or more of {', '.join(STATS)} (comma-separated) or all.")
    names = [p for p in parts if not _is_user(p)]
    if "all" in names:
        return ALL_STATS
    bad = [p for p in names if p not in STATS]
    if bad:
        raise PoslensError(f"--stats {','.join(bad)}: unknown statistic; choose from {', '.join(STATS)} or all, or "
                           "give a poslens.Statistic (an object, or its qualified class name package.module.Class).")
    return frozenset(names)


def user_statistics(text) -> tuple:
    """The users' statistics of a ``--stats`` value, in order: objects as given, qualified class names
    imported and built (:func:`poslens.capture.statistic.resolve_statistic`)."""
    return tuple(resolve_statistic(p) if isinstance(p, str) else p for p in (_stat_parts(text) or []) if _is_user(p))


def stats_option(text):
    """A ``--stats`` value as JSON (config.json's options): a user statistic object by its qualified
    class name, everything else as given."""
    if text is None or isinstance(text, str):
        return text
    return [p if isinstance(p, str) else qualified_name(p) for p in text]


def stats_record(text) -> list[str]:
    """A ``--stats`` value as config.json and the checkpoint fingerprint record it: the sorted built-in
    names, then each user statistic's qualified class name."""
    parts = _stat_parts(text) or []
    users = [p if isinstance(p, str) else qualified_name(p) for p in parts if _is_user(p)]
    return sorted(parse_stats(text)) + users


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


def unrotate_qk(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half",
                workers=None):
    """Pre-RoPE ``query``/``key`` ``[B, H, S, D]`` from post-RoPE ones and the model's ``cos``/``sin``
    ``[B, S, r]``, in the model's pair layout (``half`` or ``interleaved``); ``workers``: the C
    kernel's threads (:class:`poslens.native.Workers`), else one."""
    cos = cos[:, None].to(torch.float32)
    sin = sin[:, None].to(torch.float32)
    # Inverse rotation divided by attention_scaling^2 (cos^2 + sin^2, for scaled RoPE variants);
    # the division is folded into the small cos/sin tables rather than into a pass over q and k.
    s2 = cos[..., :1] ** 2 + sin[..., :1] ** 2
    cos, sin = cos / s2, sin / s2
    if layout == "interleaved":
        return _unrotate_interleaved(query, cos, sin), _unrotate_interleaved(key, cos, sin)
    if query.device.type == "cpu":  # one pass over each (poslens.native), where it is built
        q, k = native.unrotate_half(query, cos, sin, workers), native.unrotate_half(key, cos, sin, workers)
        if q is not None and k is not None:
            return q, k
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


#: the built-in statistics the fused CUDA kernels compute (:func:`poslens.capture.cuda_maps.attention_maps`)
FUSED_STATISTICS = frozenset({"scores", "probs", "slash", "sink_heads", "heads"})


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
    cap = active_capture(module)
    layer = getattr(module, "layer_idx", None)
    if scaling is None:
        scaling = 1.0 / math.sqrt(query.shape[-1])
    causal = (True if is_causal is None else bool(is_causal)) and getattr(module, "is_causal", True)
    if cap is not None and cap.spec.bidirectional:
        causal = False
    if sliding_window is None:  # Qwen2-MoE keeps its window on the module and passes it only in the mask
        sliding_window = getattr(module, "sliding_window", None)
    qk_hooks = getattr(module, "_poslens_qk_hooks", None)
    if qk_hooks:  # q/k capture points: the layer's queries and keys before and after RoPE
        _run_qk_hooks(qk_hooks, query, key)
    if cap is not None:
        query, key = cap.enter_layer(layer, query, key, sliding_window, scaling)
    Sq, Sk = query.shape[2], key.shape[2]
    window = int(sliding_window) if sliding_window and int(sliding_window) < Sk else None
    padding = attention_mask
    if padding is not None and padding.ndim == 2 and bool(padding.all()):
        padding = None
    softcap = float(kwargs["softcap"]) if kwargs.get("softcap") else None
    captured = cap is not None and layer in cap.layer_pos
    if captured and (padding is not None or Sq != Sk):
        raise PoslensError("capture needs full, unpadded sequences without a KV cache; scan feeds packed "
                           "sequences of exactly --seq-len tokens.")
    if captured and not (dropout and module.training) and cap.computes_output(layer, query, key, window, softcap):
        # one pass: the capture's chunks compute the weights it accumulates and, from them, the output
        out = cap.observe_attention(layer, query, key, None, scaling, causal=causal, window=window,
                                    softcap=softcap, value=value)
        return out.transpose(1, 2).contiguous(), None
    out = _plain_attention(query, key, value, padding, causal=causal, window=window, scaling=scaling,
                           softcap=softcap, dropout=dropout if module.training else 0.0)
    if captured:
        cap.observe_attention(layer, query, key, out, scaling, causal=causal, window=window, softcap=softcap)
    return out.transpose(1, 2).contiguous(), None


def _plain_attention(query, key, value, padding, *, causal, window, scaling, softcap, dropout):
    """The layer's attention output ``[B, H, Sq, D]`` without capture: SDPA with the structure and
    padding masks (``is_causal`` where no explicit mask is needed), or eager soft-capped attention."""
    B, H, Sq = query.shape[:3]
    Sk = key.shape[2]
    if padding is None and window is None and (not causal or Sq == Sk):
        mask, sdpa_causal = None, causal and Sq > 1
    else:
        mask = _full_mask(_structure_mask(Sq, Sk, causal=causal, window=window, device=query.device,
                                          q_offset=Sk - Sq),
                          padding, B, Sq, Sk, query.device)
        sdpa_causal = False
    if softcap:  # SDPA cannot soft-cap the logits: compute as eager attention does
        return _eager_softcap_attention(query, key, value, mask, sdpa_causal, scaling, softcap)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                          is_causal=sdpa_causal, scale=scaling, enable_gqa=key.shape[1] != H)


def _eager_logits(query, key, scaling, *, causal, window, softcap):
    """A layer's logits ``[B, H, S, S]`` in float32 as eager attention forms them: ``scaling * q . k``
    (GQA keys repeated), soft-capped where the model caps, ``-inf`` where a query does not see a key."""
    H, Hk = query.shape[1], key.shape[1]
    k = key.to(torch.float32)
    if Hk != H:
        k = k.repeat_interleave(H // Hk, dim=1)
    logits = torch.matmul(query.to(torch.float32), k.transpose(2, 3)).mul_(scaling)
    if softcap is not None:
        logits = torch.tanh_(logits.div_(softcap)).mul_(softcap)
    Sq, Sk = logits.shape[-2:]
    mask = _structure_mask(Sq, Sk, causal=causal, window=window, device=query.device, q_offset=Sk - Sq)
    if mask is not None:
        logits.masked_fill_(~mask, float("-inf"))
    return logits


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
    #: keep S x S maps (scores, probs, cosine, attn_cosine, per-head maps) as exact block means on an
    #: N x N grid of blocks (:class:`BlockMaps`); 0 = full maps
    map_size: int = 0
    #: compute a captured layer's attention output from the capture's own weights (CPU) instead of a
    #: second SDPA pass; False: SDPA output, statistics computed beside it (comparisons, benchmarks)
    own_output: bool = True
    #: users' statistics (:class:`poslens.Statistic` objects), fed the capture points they need
    user_stats: tuple = ()

    def map_side(self) -> int:
        """Side of a stored ``S x S`` map: ``S``, or the number of blocks per axis under ``map_size``."""
        return BlockMaps(self.seq_len, self.map_size).n if self.map_size else self.seq_len

    def __post_init__(self):
        self.user_stats = tuple(self.user_stats)
        rope = bool(set(self.rope_layers) & set(self.layers))
        for stat in self.user_stats:  # before anything is loaded or written
            check_needs(stat, rope)


def noise_grid(S: int, max_positions: int) -> torch.Tensor:
    """Positions ``0, s, 2s, ...`` (stride ``s = ceil(S / max_positions)``) of the group score maps:
    a constant stride keeps a Toeplitz map Toeplitz, so relativity is judged on the grid as on the map."""
    return torch.arange(0, S, -(-S // max(1, max_positions)))


class BlockMaps:
    """Block means of ``S x S`` maps on the fly (``--map-size N``).

    Blocks are ``f x f`` with ``f = ceil(S / N)`` (the last row/column of blocks is narrower when ``f``
    does not divide ``S``), ``n = ceil(S / f)`` blocks per axis. A stored map entry ``[I, J]`` is the
    mean of the entries ``(i, j)`` of block ``(I, J)`` that a query sees: ``j <= i`` for causal maps,
    and inside the sliding window where there is one. Blocks without a visible entry (every block
    right of the diagonal, in a causal map) are stored as 0, as the full maps store their upper
    triangle, and read as NaN. Cosine maps (symmetric, every entry defined) average every entry.
    The means are exact: chunk rows are summed into their blocks as they are computed and divided by
    the count of visible entries once per layer and batch; no ``S x S`` map is ever materialised.
    """

    def __init__(self, seq_len: int, map_size: int):
        if map_size < 1:
            raise ValueError("map_size must be positive")
        self.S = int(seq_len)
        self.f = -(-self.S // int(map_size))
        self.n = -(-self.S // self.f)
        self._inv: dict = {}

    def sizes(self) -> torch.Tensor:
        """Positions per block ``[n]`` (float64)."""
        return torch.full((self.n,), float(self.f), dtype=torch.float64).index_fill_(
            0, torch.tensor([self.n - 1]), float(self.S - (self.n - 1) * self.f))

    def counts(self, causal: bool, window: int | None) -> torch.Tensor:
        """Visible entries per block ``[n, n]`` (float64) of a map with this mask."""
        S, f = self.S, self.f
        i = torch.arange(S, dtype=torch.int64)[:, None]
        lo = (i - window + 1).clamp_min(0) if window else torch.zeros_like(i)  # keys i - j < window
        hi = i if causal else torch.full_like(i, S - 1)
        j0 = torch.arange(self.n, dtype=torch.int64)[None, :] * f  # block J covers keys [J f, J f + f - 1]
        j1 = (j0 + f - 1).clamp_max(S - 1)
        per_row = (torch.minimum(hi, j1) - torch.maximum(lo, j0) + 1).clamp_min(0).to(torch.float64)  # [S, n]
        out = torch.zeros(self.n, self.n, dtype=torch.float64)
        return out.index_add_(0, torch.arange(S) // f, per_row)

    def inverse_counts(self, causal: bool, window: int | None, device) -> torch.Tensor:
        """``1 / counts`` (0 where a block has no visible entry), float32, cached per mask and device."""
        key = (bool(causal), window, str(device))
        if key not in self._inv:
            c = self.counts(causal, window)
            self._inv[key] = torch.where(c > 0, 1.0 / c.clamp_min(1), 0.0).to(torch.float32).to(device)
        return self._inv[key]

    def add_rows(self, dst: torch.Tensor, part: torch.Tensor, start: int) -> None:
        """Add a map's rows ``start .. start + c - 1`` (``part [c, nc]``, keys ``0 .. nc - 1``) to the
        block sums ``dst [n, n]``."""
        c, nc = part.shape
        f = self.f
        nb = -(-nc // f)
        if nc != nb * f:
            part = torch.nn.functional.pad(part, (0, nb * f - nc))
        cols = part.reshape(c, nb, f).sum(-1)  # [c, nb]: column blocks
        r0, r1 = start // f, (start + c - 1) // f
        if r0 == r1:  # every row in one block row (the common case: chunks shorter than a block)
            dst[r0, :nb] += cols.sum(0)
        else:
            idx = torch.arange(start, start + c, device=part.device) // f
            dst[:, :nb].index_add_(0, idx, cols)

    def gram_means(self, a, device=None) -> torch.Tensor:
        """Block means ``[n, n]`` (float32) of ``a @ a.T`` for ``a [S, K]`` without the ``S x S`` product:
        row blocks of the lower block triangle, reduced to block sums as they are computed, mirrored.

        ``a`` may instead be a function ``rows(r0, r1)`` returning rows ``r0 .. r1 - 1`` of a symmetric
        ``S x S`` matrix on its first ``r1`` columns (then pass ``device``)."""
        S, f, n = self.S, self.f, self.n
        rows = a if callable(a) else (lambda r0, r1: a[r0:r1] @ a[:r1].T)
        device = a.device if device is None else device
        on_gpu = torch.device(device).type != "cpu"  # few large products there, cache-sized ones on the CPU
        R = f * max(1, (4096 if on_gpu else GRAM_BLOCK_ROWS) // f)
        out = torch.zeros(n, n, dtype=torch.float32, device=device)
        for r0 in range(0, S, R):
            r1 = min(S, r0 + R)
            self.add_rows(out, rows(r0, r1), r0)
        out = out.tril() + out.tril(-1).T  # blocks right of each computed row band: the mirrored ones
        sz = self.sizes().to(torch.float32).to(device)
        return out.div_(sz[:, None] * sz[None, :])


def accumulator_shapes(spec: CaptureSpec) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the mean accumulators of a scan (also the ``maps.safetensors`` names; the
    noise groups of ``scores`` are group accumulators beside them)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for st in active_statistics(spec):
        shapes.update(st.shapes(spec))
    return shapes


@dataclass
class _MapsRun:
    """One layer's pass of :meth:`Capture._attention_maps`: inputs in the chunks' layout, what to
    compute, the float32 sums it fills (``out``), the layer output and the workspaces."""

    layer: int
    qs: torch.Tensor  # queries grouped by key head, [B, Hk, g, S, D] (unscaled)
    scaling: float  # the logit scale, applied to each chunk's query rows
    kT: torch.Tensor  # keys, [B, Hk, D, S]
    v: torch.Tensor | None  # float32 values [B, Hk, S, D] when the output is computed here
    H: int
    causal: bool
    window: int | None
    softcap: float | None
    heads: list  # (accumulator index, head) of the per-head maps
    checked: bool
    cpu: bool
    rows: int  # query rows per chunk
    S: int  # sequence length
    M: int  # side of a stored map (S, or the --map-size blocks)
    #: the built-in statistics reading each intermediate of the pass (logits before and after the mask,
    #: weights, per-head batch sums of the weights), in registry order
    readers: dict = field(default_factory=dict)
    need_p: bool = False  # whether the softmax is taken at all
    probe: torch.Tensor | None = None  # a reader's cheaper finiteness probe of a chunk's head weights
    user_scores: torch.Tensor | None = None  # [B, H, S, S] masked logits, for the users' statistics
    user_probs: torch.Tensor | None = None  # [B, H, S, S] weights, for the users' statistics
    block_maps: set = field(default_factory=set)  # the S x S maps of run.out (block sums under --map-size)
    bs: int = 1  # sequences per slice of a chunk (CPU: the slice's logits stay cache-sized)
    b0: int = 0  # the slice being computed: sequences b0 .. b1 - 1
    b1: int = 0
    out: dict = field(default_factory=dict)
    output: torch.Tensor | None = None  # [B, S, H, D]
    bad: torch.Tensor | None = None  # unchecked runs: a non-finite value was seen
    above: torch.Tensor | None = None  # [rows, rows] bool, j > i inside a diagonal block
    zbuf: torch.Tensor | None = None  # per-head batch sums of a chunk's weights (slash.slash_view)
    native: Any = None  # the fused CPU pass (poslens.native.SoftmaxSums) when it takes the chunks


class Capture:
    """The capture loop of one scan: it takes each captured layer's attention call, computes the
    intermediates its statistics share once (float32 q/k, the chunked logits and softmax, the layer
    output) and routes them to the statistics that read them: the built-in ones
    (:mod:`poslens.capture.builtin`, whose modules define what each map is) and the users'
    (:class:`poslens.Statistic`, fed the capture points they name). Every built-in sum is float64 and
    every count is sequences (:class:`poslens.capture.stats.AccumulatorSet`).
    """

    def __init__(self, spec: CaptureSpec, device="cpu"):
        self.spec = spec
        self.layer_pos = {l: n for n, l in enumerate(spec.layers)}
        self.head_pos = {}
        for n, (l, h) in enumerate(spec.heads):
            self.head_pos.setdefault(l, []).append((n, h))
        #: the built-in statistics this scan computes, and those reading each shared intermediate
        self.builtins = active_statistics(spec)
        self._qk_readers = [st for st in self.builtins if st.reads_qk]
        self._map_readers = [st for st in self.builtins if st.reads_maps]
        self._hidden_readers = [st for st in self.builtins if st.reads_hidden]
        self._output_readers = [st for st in self.builtins if st.reads_output]
        self.accs = AccumulatorSet()
        for st in self.builtins:
            self.accs.update(st.make_accumulators(spec, device))
        self.grid = noise_grid(spec.seq_len, spec.noise_max_positions).to(device)
        self._seq0 = 0  # global index of the batch's first sequence (sequence n is in noise group n % G)
        self.blocks = BlockMaps(spec.seq_len, spec.map_size) if spec.map_size else None
        self._buffers: dict = {}  # reused chunk workspaces (CPU), see _buffer
        self._native = None  # the fused CPU pass, made at first use (_native_pass)
        #: threads of the C kernels (poslens.native), one part per torch thread; made at first need
        self.workers = native.Workers()
        self.rope_cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
        #: per layer, the (cos, sin) its attention module received (Gemma 3: one table per layer type)
        self.rope_by_layer: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seen_layers: set = set()  # layers whose attention reached the registered function
        self.windows: dict = {}  # sliding window each layer asked for (None = full)
        self.scalings: dict = {}  # logit scale each layer used
        self._batch_size = 0
        self._next_seq = 0
        self._modules: weakref.WeakSet | None = None  # the attention modules it captures (None: any), see bind
        self.sequences = 0  # sequences counted in (every accumulator's count)
        self.user = list(spec.user_stats)  # users' statistics (poslens.Statistic), fed by _feed_user
        self._user_points = {p for st in self.user for p in st.needs}
        self._pending: dict[int, dict] = {}  # a layer's capture points gathered for the users' statistics
        self._fed: dict[int, set] = {}  # per layer, the users' statistics (indices) fed in this batch
        self.reservoir = None
        if spec.reservoir and "qk" in spec.stats:  # the sample of pre-RoPE q/k vectors belongs to the qk statistic
            self.reservoir = QKReservoir(spec.reservoir, len(spec.layers), spec.num_heads, spec.num_kv_heads,
                                         spec.head_dim, spec.seq_len, seed=spec.seed, device=device)

    # -- context ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        """Route the registered attention function's calls into this object, in this context only
        (this thread or task; from the modules it is bound to, :meth:`bind`)."""
        token = _ACTIVE.set(_ACTIVE.get() + (self,))
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def is_active(self) -> bool:
        """Whether this capture is active in the current context (the capture points' hooks ask)."""
        return any(c is self for c in _ACTIVE.get())

    def bind(self, modules) -> None:
        """Take attention calls from these modules only (a model's attention modules; weak references:
        the capture keeps no model alive). Unbound, a capture takes every call made while it is active."""
        self._modules = weakref.WeakSet(modules)

    def owns(self, module) -> bool:
        """Whether an attention call from ``module`` belongs to this capture."""
        return self._modules is None or module is None or module in self._modules

    def begin_batch(self, batch_size: int, seq_start: int | None = None) -> None:
        """Start a batch of ``batch_size`` sequences; ``seq_start`` is the global index of its first
        sequence (default: right after the previous batch), which fixes the reservoir's slot keys and
        the noise groups (sequence n in group ``n % noise_groups``)."""
        self._batch_size = int(batch_size)
        self._pending, self._fed = {}, {}
        seq_start = self._next_seq if seq_start is None else int(seq_start)
        self._seq0 = seq_start
        self._next_seq = seq_start + self._batch_size
        if self.reservoir is not None:
            self.reservoir.begin_batch(seq_start, self._batch_size)

    def end_batch(self) -> None:
        """Count the batch's sequences once in every accumulator (sums were added per layer)."""
        self._check_users_fed()
        self.sequences += self._batch_size
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
        """Every accumulated tensor (sums, counts, reservoir, the users' statistics' tensors under
        ``user.<i>.<n>``): what a checkpoint holds, with :meth:`state_metadata` beside it."""
        out = self.accs.state_dict()
        out["capture.sequences"] = torch.tensor([self.sequences], dtype=torch.int64)
        if self.reservoir is not None:
            out.update(self.reservoir.state_dict())
        for i, stat in enumerate(self.user):
            out.update(flatten_state(stat.state_dict(), prefix=f"user.{i}.")[0])
        return out

    def state_metadata(self) -> dict:
        """What a checkpoint stores beside the tensors: each user statistic's class and the JSON tree of
        its state (:func:`poslens.capture.statistic.flatten_state`), as one JSON string."""
        if not self.user:
            return {}
        return {"user_statistics": json.dumps([{"class": qualified_name(st), "state": flatten_state(
            st.state_dict(), prefix=f"user.{i}.")[1]} for i, st in enumerate(self.user)])}

    def load_state_dict(self, state, *, copy: bool = True, metadata: dict | None = None) -> None:
        """Load a :meth:`state_dict` (and its :meth:`state_metadata`, when there are users' statistics);
        ``copy=False`` adopts the tensors (a state just read from a file)."""
        self.accs.load_state_dict(state, copy=copy)
        first = next(iter(self.accs.values()), None)
        self.sequences = int(state["capture.sequences"][0]) if "capture.sequences" in state else \
            (first.count if first is not None else 0)
        if self.reservoir is not None:
            if "reservoir.keys" not in state:
                raise PoslensError("the checkpoint has no q/k reservoir; resume with the original --reservoir.")
            self.reservoir.load_state_dict(state)
        if not self.user:
            return
        saved = json.loads((metadata or {}).get("user_statistics", "[]"))
        names = [qualified_name(st) for st in self.user]
        if [e["class"] for e in saved] != names:
            raise PoslensError(f"the checkpoint holds the statistics {[e['class'] for e in saved]}, this scan asks for "
                               f"{names}; resume with the original --stats.")
        for i, (stat, entry) in enumerate(zip(self.user, saved)):
            mine = {k: (v.clone() if copy else v) for k, v in state.items() if k.startswith(f"user.{i}.")}
            stat.load_state_dict(unflatten_state(entry["state"], mine))

    def all_reduce(self, group=None) -> None:
        """Sum the accumulators and merge the reservoirs and the users' statistics of all processes
        (torch.distributed)."""
        import torch.distributed as dist

        self.accs.all_reduce(group)
        n = torch.tensor([float(self.sequences)], dtype=torch.float64,
                         device="cuda" if dist.get_backend(group) == "nccl" else "cpu")
        dist.all_reduce(n, group=group)
        self.sequences = int(n.item())
        if self.reservoir is not None:
            self.reservoir.all_gather_merge(group)
        for stat in self.user:
            stat.all_reduce(group)

    # -- users' statistics ------------------------------------------------------------------
    def residual_points(self) -> list[str]:
        """The residual-stream points (``resid_pre``/``resid_post``) the users' statistics read: the
        capture loop hooks them on every captured layer (:func:`poslens.capture.loop.attach`)."""
        return [p for p in ("resid_pre", "resid_post") if p in self._user_points]

    def observe_point(self, layer: int, point: str, x: torch.Tensor) -> None:
        """A residual-stream point of a captured layer, for the users' statistics."""
        if layer in self.layer_pos:
            self._feed_user(layer, {point: x})

    def _user_attention_points(self, batch: LayerBatch, out: torch.Tensor, run) -> dict:
        """The attention points the users' statistics need, computed once per layer for all of them:
        q/k before RoPE (:meth:`LayerBatch.pre_rope`, shared with the built-in ones) and after it, the
        logits and weights of the chunked pass (the same softmax the built-in maps and the layer output
        come from), and the head outputs."""
        need = self._user_points
        pts = {}
        if "q_post" in need:
            pts["q_post"] = batch.query
        if "k_post" in need:
            pts["k_post"] = batch.key
        if need & {"q_pre", "k_pre"}:  # in the model's dtype, as it would have computed them
            pts["q_pre"], pts["k_pre"] = (t.to(batch.query.dtype) for t in batch.pre_rope())
        if "scores" in need:
            pts["scores"] = run.user_scores
        if "probs" in need:
            pts["probs"] = run.user_probs
        if "head_out" in need:
            pts["head_out"] = out.transpose(1, 2)
        return pts

    def _feed_user(self, layer: int, points: dict) -> None:
        """Gather a layer's points; each statistic gets ``add(layer, **its points)`` once they are all in."""
        pend = self._pending.setdefault(layer, {})
        pend.update(points)
        fed = self._fed.setdefault(layer, set())
        for i, stat in enumerate(self.user):
            if i not in fed and all(p in pend for p in stat.needs):
                stat.add(layer, **{p: pend[p] for p in stat.needs})
                fed.add(i)
        if len(fed) == len(self.user):
            pend.clear()  # the layer's points are not kept past the last statistic that reads them

    def _check_users_fed(self) -> None:
        """Every user statistic got every captured layer of the batch (else a point never came)."""
        if not self.user or not self.seen_layers & set(self.layer_pos):
            return
        for i, stat in enumerate(self.user):
            for layer in self.spec.layers:
                if i not in self._fed.get(layer, ()):
                    got = sorted(self._pending.get(layer, {}))
                    raise PoslensError(
                        f"stats: {qualified_name(stat)} needs {', '.join(stat.needs)} of layer {layer}, but the model "
                        f"gave only {', '.join(got) or 'none of them'}; this architecture cannot provide "
                        f"{', '.join(p for p in stat.needs if p not in got)} (drop the statistic or those points).")

    def user_results(self, taken=()) -> dict[str, torch.Tensor]:
        """The users' statistics' named result tensors (on the CPU); a name that a built-in tensor or
        another statistic already uses is refused."""
        out: dict[str, torch.Tensor] = {}
        for stat in self.user:
            res = stat.result()
            if not isinstance(res, dict) or not all(isinstance(v, torch.Tensor) for v in res.values()):
                raise PoslensError(f"stats: {qualified_name(stat)}.result() must return a dict of named tensors.")
            for name, t in res.items():
                if name in out or name in taken:
                    raise PoslensError(f"stats: {qualified_name(stat)}.result() names a tensor {name!r}, which "
                                       "another statistic also writes; rename it.")
                out[name] = t.detach().cpu().contiguous()
        return out

    # -- RoPE -------------------------------------------------------------------------------
    def enter_layer(self, layer, query, key, sliding_window, scaling):
        """Note what a layer's attention call brings (what the dry run checks: every layer dispatches
        here; its window and logit scale), make its cos/sin current, and apply the no-RoPE control:
        returns the queries and keys the layer attends with."""
        self.seen_layers.add(layer)
        self.windows[layer] = int(sliding_window) if sliding_window else None
        self.scalings[layer] = float(scaling)
        self.use_layer_rope(layer)
        if layer in self.spec.no_rope_layers and layer in self.spec.rope_layers:  # inference-time control
            return self.unrotate(query, key)
        return query, key

    def use_layer_rope(self, layer) -> None:
        """Make the cos/sin that ``layer``'s attention received the current ones (for :meth:`unrotate`)."""
        cs = self.rope_by_layer.get(layer)
        if cs is not None:
            self.rope_cos_sin = cs

    def unrotate(self, query: torch.Tensor, key: torch.Tensor, batch: int | None = None):
        """Pre-RoPE queries and keys from post-RoPE ones with the model's own cos/sin (in the model's
        pair layout: rotate_half, or interleaved pairs for Cohere). ``batch``: ``query``/``key`` hold
        that one sequence of the batch (``[1, H, S, D]``)."""
        if self.rope_cos_sin is None:
            raise PoslensError("no RoPE cos/sin were observed for this forward; the adapter's rotary module hook "
                               "did not fire (unsupported architecture?).")
        cos, sin = self.rope_cos_sin
        if batch is not None and cos.shape[0] > 1:
            cos, sin = cos[batch:batch + 1], sin[batch:batch + 1]
        return unrotate_qk(query, key, cos, sin, layout=self.spec.rope_layout, workers=self.workers)

    def _seq_groups(self, device) -> torch.Tensor:
        """Noise group of each sequence of the current batch: ``(seq_start + b) % noise_groups``."""
        return (torch.arange(self._batch_size, device=device) + self._seq0) % self.spec.noise_groups

    # -- hidden states ----------------------------------------------------------------------
    def reads_hidden(self) -> bool:
        """Whether a built-in statistic reads the residual stream (the capture loop hooks it then)."""
        return bool(self._hidden_readers)

    @torch.no_grad()
    def observe_hidden(self, index: int, hidden: torch.Tensor) -> None:
        """Residual-stream vectors ``[B, S, d]`` at index ``index`` (0: the embeddings, ``m + 1``: the
        output of captured layer ``m``) for the built-in statistics that read them."""
        for st in self._hidden_readers:
            st.add_hidden(self, index, hidden)

    # -- attention --------------------------------------------------------------------------
    def _buffer(self, name: str, shape: tuple, device, reuse: bool = True, dtype=torch.float32) -> torch.Tensor:
        """A workspace of ``shape`` (float32 unless ``dtype``), reused across chunks and layers (grown
        when too small); ``reuse=False`` gives a fresh one instead (on a GPU, where a kept buffer
        would hold memory)."""
        if not reuse:
            return torch.empty(shape, dtype=dtype, device=device)
        n = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n or buf.device != torch.device(device) or buf.dtype != dtype:
            buf = torch.empty(n, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:n].view(shape)

    def _add64(self, dst: torch.Tensor, x: torch.Tensor, alpha: float = 1.0, lower: bool = False) -> None:
        """``dst += alpha * x`` for a float64 ``dst`` and a float32 ``x`` (bit-identical to ``add_``).

        On the CPU one fused pass (:func:`poslens.native.add_widened`), which with ``lower`` adds the
        lower triangle alone (pass it where the upper triangle of ``x`` is zero or the accumulator
        reads its lower triangle only). Without the kernels ``x`` is first widened into a reused
        float64 buffer: torch's mixed-dtype ``add_`` there casts element by element, unvectorised,
        and costs several times the copy and a float64 ``add_``."""
        if x.device.type == "cpu" and x.dtype != torch.float64:
            if native.add_widened(dst, x, alpha, lower, self.workers):
                return
            x = self._buffer("wide", tuple(x.shape), x.device, dtype=torch.float64).copy_(x)
        dst.add_(x, alpha=alpha)

    def _f32(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` as a contiguous float32 tensor; on the CPU a copy into a reused buffer (a layer's q, k
        and v are tens of megabytes at batch 20, and a fresh one is a fresh mmap whose pages fault in)."""
        if x.device.type != "cpu":
            return x.to(torch.float32).contiguous()
        return self._buffer(name, tuple(x.shape), x.device).copy_(x)

    def _half_perm(self, D: int, device) -> torch.Tensor:
        rot = self.rope_cos_sin[0].shape[-1] if self.rope_cos_sin is not None else D
        return half_layout_perm(D, rot, device)

    def _rows_per_chunk(self, B: int, H: int, S: int, device, g: int = 1) -> int:
        """Query rows per chunk: ``spec.chunk_elems`` logits at most when set; else on the CPU
        :data:`CPU_TARGET_ROWS` rows per (batch, key head) product, fewer (down to
        :data:`CPU_MIN_ROWS`) where one sequence's chunk would outgrow the cache budget, and the chunk
        takes as many sequences as the budget holds (``run.bs``); on CUDA large chunks.

        On the CPU every chunk is read several times (sum, softmax, batch sum, ``p @ v``); a block of a
        few megabytes stays cache-resident across those passes. Its products run at GEMM speed from
        about 128 rows on, while a causal row block of ``c`` rows computes ``c^2 / 2`` logits above the
        diagonal (``c / S`` of the layer's). On CUDA launches, not caches, are the cost: large chunks.
        """
        elems = self.spec.chunk_elems
        cpu = torch.device(device).type == "cpu"
        if cpu and not elems:
            budget = cpu_chunk_elems() // max(1, H * S)  # rows of one sequence's chunk within the budget
            lo, hi = -(-CPU_MIN_ROWS // max(1, g)), -(-CPU_TARGET_ROWS // max(1, g))
            return min(S, max(lo, min(hi, budget)))
        if cpu:
            elems = min(elems, cpu_chunk_elems())
        elif not elems:
            elems = CUDA_CHUNK_ELEMS
        return min(S, max(1, elems // max(1, B * H * S)))

    def _native_pass(self):
        """This capture's fused CPU pass (:class:`poslens.native.SoftmaxSums`), or None where
        it cannot be built or ``POSLENS_CAPTURE_KERNEL=torch`` asks for the torch path."""
        if not native.available():
            return None
        if self._native is None:
            self._native = native.SoftmaxSums(self.workers)
        return self._native

    def _maps_readers(self, layer) -> list:
        """The built-in statistics that read the chunked attention pass at ``layer``."""
        return [st for st in self._map_readers if st.maps_at(self, layer)]

    def _users_read_maps(self) -> bool:
        """Whether the users' statistics read the logits or weights (then the chunked pass gives them)."""
        return bool(self._user_points & {"scores", "probs"})

    def computes_output(self, layer, query, key, window, softcap) -> bool:
        """Whether :meth:`observe_attention` computes ``layer``'s attention output itself (from the
        weights its statistics need anyway) when handed the values, so the model skips its own SDPA
        pass: on the CPU, when the layer's attention pass is captured (``spec.own_output``)."""
        if not self.spec.own_output or query.is_cuda or layer not in self.layer_pos:
            return False
        return bool(self._maps_readers(layer)) or self._users_read_maps()

    @torch.no_grad()
    def observe_attention(self, layer, query, key, out, scaling, *, causal=True, window=None,
                          softcap=None, value=None):
        """Add one layer's attention statistics for a batch: the built-in ones of the scan and the
        users' (their attention points).

        ``out`` is the layer's attention output ``[B, H, S, D]``; pass ``out=None`` and the ``value``
        states instead (when :meth:`computes_output`) to have it computed from the chunks' own
        weights. Returns the output ``[B, H, S, D]`` (a view of a ``[B, S, H, D]`` contiguous tensor
        when computed here)."""
        li = self.layer_pos[layer]
        readers = self._maps_readers(layer)
        users_maps = self._users_read_maps()
        want_maps = bool(readers) or users_maps
        if out is None and not (value is not None and want_maps and not query.is_cuda):
            raise ValueError("observe_attention: pass the layer output, or the values where computes_output()")
        fused = (want_maps and not users_maps and softcap is None and all(st.name in FUSED_STATISTICS for st in readers)
                 and _fused_ok(query, key, window))
        batch = LayerBatch(self, layer, li, None, None, float(scaling), causal, window, softcap=softcap,
                           query=query, key=key, heads=self.head_pos.get(layer, []))
        if self._qk_readers or (want_maps and not fused):
            # contiguous once: transformers hands [B, S, H, D] projections transposed to [B, H, S, D],
            # whose (batch, head) strides do not merge, so every chunk's batched matmul would copy them
            batch.q, batch.k = self._f32("q", query), self._f32("k", key)
        if self.user and self._user_points & {"q_pre", "k_pre"}:
            batch.pre_rope()  # once, for the users' statistics and the built-in ones alike
        for st in self._qk_readers:
            st.add(batch)
        run = None
        if want_maps:  # the logits are products of the model's own half values: exact in TF32
            with half_input_matmuls(query.is_cuda and query.dtype in _HALF):
                maps, out, run = self._layer_maps(batch, readers, value, out, fused)
                for st in readers:
                    st.add_maps(self, batch, maps)
        for st in self._output_readers:
            st.add_output(self, li, out)
        if self.user:
            self._feed_user(layer, self._user_attention_points(batch, out, run))
        return out

    def _layer_maps(self, batch: LayerBatch, readers: list, value, out, fused):
        """One layer's float32 map sums (fused CUDA kernels, else the chunked pass) and its attention
        output (computed from the chunks' own weights when ``out`` is None). Returns ``(maps, out,
        run)``, ``run`` the chunked pass (None from the fused kernels)."""
        query, key = batch.query, batch.key
        names = {st.name for st in readers}
        maps = run = None
        if fused:
            maps = cuda_maps.attention_maps(query, key, batch.scaling, causal=batch.causal, scores="scores" in names,
                                            probs="probs" in names, slash="slash" in names,
                                            heads=[h for _, h in batch.heads])
            if not bool(torch.stack([torch.isfinite(t).all() for t in maps.values()]).all()):  # one sync
                maps = None  # non-finite logits somewhere: the checked path names the head (or masks them)
                batch.q = query.to(torch.float32).contiguous()
                batch.k = key.to(torch.float32).contiguous()
            elif self.blocks is not None:
                maps = self._fused_block_means(maps, batch.causal)
        if maps is None:
            # the output from the chunks' own weights (values in the maps' float32)
            v = self._f32("v", value) if out is None else None
            run = self._attention_maps(batch, readers, checked=not query.is_cuda, v=v, out_dtype=query.dtype)
            if run is None:  # non-finite values (unchecked CUDA pass, fused CPU pass): redo it with
                # per-chunk checks, which name the head or mask what is masked
                run = self._attention_maps(batch, readers, checked=True, v=v, out_dtype=query.dtype, native=False)
            maps = run.out
            if v is not None:
                out = run.output.transpose(1, 2)  # [B, H, S, D] view of [B, S, H, D]
        return maps, out, run

    def _fused_block_means(self, maps: dict, causal: bool) -> dict:
        """The fused kernels' full ``S x S`` float32 sums reduced to ``--map-size`` block means (as the
        chunked path's), row band by row band, with key 0's weight kept exactly (``probs_key0``).

        The kernels write each map whole, so on the GPU one layer's ``S x S`` float32 sums exist
        until this returns (4 GiB per map at 32k tokens); the float64 accumulators stay ``n x n``."""
        bm = self.blocks
        out = {}
        if "probs" in maps:
            out["probs_key0"] = maps["probs"][:, 0].clone()
        R = bm.f * max(1, _FUSED_BAND_ROWS // bm.f)  # whole block rows per band: bounds add_rows' copies
        for name, full in maps.items():
            if name in ("slash", "sink_heads"):  # per head by offset / query: no S x S map to reduce
                out[name] = full
                continue
            stacked = full if full.ndim == 3 else full[None]
            sums = torch.zeros(stacked.shape[0], bm.n, bm.n, dtype=torch.float32, device=full.device)
            for m in range(stacked.shape[0]):
                for r0 in range(0, bm.S, R):
                    bm.add_rows(sums[m], stacked[m, r0:r0 + R], r0)
            sums.mul_(bm.inverse_counts(causal, None, full.device))
            out[name] = sums if full.ndim == 3 else sums[0]
            maps[name] = None  # free the full map before the next one is reduced
        return out

    def _attention_maps(self, batch: LayerBatch, readers: list, *, checked: bool, v: torch.Tensor | None = None,
                        out_dtype=None, native: bool = True):
        """The chunked attention pass of one layer: logits and softmax taken once, chunk by chunk, and
        handed to the statistics that read them (``readers``), which fill their float32 batch sums in
        ``run.out``. Returns the pass (``_MapsRun``).

        Query-row chunks: only ``[B, H, c, S]`` logits live at a time. A causal row block
        ``[start, stop)`` needs keys ``< stop`` only, so the key range is cut there; the causal mask
        is applied in place to the diagonal block only (the keys before the block are all visible).
        Each entry of a sum is written once (row blocks are disjoint). ``checked``: test every chunk
        for non-finite logits at once (a host sync per chunk, free on the CPU); unchecked (CUDA) the
        test is one flag read after the loop, and ``None`` is returned when it fires.

        ``v`` (float32 values ``[B, Hk, S, D]``): also compute the layer's attention output from each
        chunk's own weights, ``softmax(logits) @ v`` as eager attention does, so the model needs no
        second attention pass: ``run.output`` ``[B, S, H, D]`` in ``out_dtype``. Users' statistics that
        read the scores or weights get them whole from the same chunks (``run.user_scores`` /
        ``run.user_probs``, ``[B, H, S, S]``).

        On the CPU the chunk's logits, weights and products, and the sums, live in buffers reused from
        chunk to chunk and layer to layer (:meth:`_buffer`; the sums are valid until the next call): a
        fresh multi-megabyte temporary is a fresh ``mmap`` whose pages fault in again, which showed up
        as sys time. With ``spec.map_size`` the S x S maps are block sums reduced chunk by chunk
        (:class:`BlockMaps`), divided by each block's count of valid entries at the end: exact block
        means, never a full map.
        """
        run = self._maps_run(batch, readers, checked, v, out_dtype, native)
        q, causal, window = batch.q, batch.causal, batch.window
        B, S = q.shape[0], q.shape[2]
        before, after, weights = (run.readers[n] for n in ("logits", "masked_logits", "weights"))
        for start in range(0, S, run.rows):
            stop = min(S, start + run.rows)
            allowed = None
            if window is not None:
                allowed = _structure_mask(stop - start, stop if causal else S, causal=causal, window=window,
                                          device=q.device, q_offset=start)
            # the chunk's sequences in slices of run.bs (all of them unless the chunk would outgrow the
            # cache); the batch sums of the slices are added, the first slice writing them
            for b0 in range(0, B, run.bs):
                run.b0, run.b1 = b0, min(B, b0 + run.bs)
                logits = self._chunk_logits(run, start, stop)
                if run.native is not None:
                    if not self._fused_chunk(run, logits, start):
                        return None  # a non-finite visible logit: the caller's torch pass names its head
                    continue
                for st in before:
                    st.chunk_logits(self, run, logits, start, allowed)
                if run.readers["logit_sum"]:
                    self._chunk_logit_sum(run, logits, start, allowed)
                if allowed is not None:
                    logits.masked_fill_(~allowed, float("-inf"))
                elif causal:
                    logits[..., start:stop].masked_fill_(run.above[:stop - start, :stop - start], float("-inf"))
                for st in after:
                    st.chunk_masked_logits(self, run, logits, start)
                if run.user_scores is not None:
                    run.user_scores[run.b0:run.b1, :, start:stop, :logits.shape[-1]] = logits
                if run.need_p:
                    p = torch.softmax(logits, dim=-1, out=logits) if run.cpu else torch.softmax(logits, dim=-1)
                    self._chunk_output(run, p, start)
                    for st in weights:
                        st.chunk_weights(self, run, p, start)
                    if run.readers["head_weights"]:
                        self._chunk_head_weights(run, p, start)
                del logits
        if run.bad is not None and bool(run.bad):
            return None
        if self.blocks is not None:  # block sums -> block means over each block's valid (seen) entries
            inv = self.blocks.inverse_counts(causal, window, q.device)
            for name in run.block_maps:
                run.out[name].mul_(inv)
        return run

    def _fused_chunk(self, run, logits, start) -> bool:
        """The chunk's logit sum, softmax (in place), per-head weight sums and output rows from the
        fused CPU pass (:mod:`poslens.native`), handed to the statistics that read them.
        False when a visible logit is not finite (nothing is handed on then)."""
        B, H, c, nc = logits.shape
        block_sum = self._buffer("block_sum", (c, nc), logits.device) if run.readers["logit_sum"] else None
        pb = run.zbuf[:, :c, run.rows:run.rows + nc] if run.readers["head_weights"] else None
        if run.native(logits, start, run.causal, block_sum, pb, accumulate=run.b0 > 0,
                      threads=torch.get_num_threads()):
            return False
        if block_sum is not None:
            for st in run.readers["logit_sum"]:
                st.chunk_logit_sum(self, run, block_sum, start)
        self._chunk_output(run, logits, start)
        if pb is not None and run.b1 == run.qs.shape[0]:  # the chunk's last slice of sequences is in
            for st in run.readers["head_weights"]:
                st.chunk_head_weights(self, run, pb, start)
        return True

    def _chunk_logit_sum(self, run, logits, start, allowed) -> None:
        """The chunk's batch/head sum of the visible logits (before the mask) for the statistics that
        read it; masked entries stored as 0. A non-finite sum is traced to its head (checked) or
        flagged (unchecked)."""
        B, H, c, nc = logits.shape
        if run.cpu:  # the batch/head sum as one outer reduction into a reused buffer
            block_sum = self._buffer("block_sum", (c, nc), logits.device)
            torch.sum(logits.view(B * H, c * nc), dim=0, out=block_sum.view(c * nc))
        else:
            block_sum = logits.sum(dim=(0, 1))  # [c, nc]
        if run.checked and not _finite(block_sum):  # locate the head only on failure
            bad_l = ~torch.isfinite(logits)
            if allowed is not None:
                bad_l &= allowed
            elif run.causal:
                bad_l[..., start:start + c] &= ~run.above[:c, :c]
            if bool(bad_l.any()):
                raise _nonfinite_error(run.layer, int(bad_l.any(dim=(0, 2, 3)).nonzero()[0]))
            block_sum = logits.masked_fill(~torch.isfinite(logits), 0.0).sum(dim=(0, 1))
        if run.causal:  # above the diagonal: not seen, stored as 0
            block_sum[:, start:start + c].masked_fill_(run.above[:c, :c], 0.0)
        if allowed is not None:  # outside the sliding window: unseen, stored as 0 like above the diagonal
            block_sum.masked_fill_(~allowed, 0.0)
        if run.bad is not None:
            run.bad |= ~torch.isfinite(block_sum).all()
        for st in run.readers["logit_sum"]:
            st.chunk_logit_sum(self, run, block_sum, start)

    def _maps_run(self, batch: LayerBatch, readers: list, checked, v, out_dtype, native=False):
        """The state of one :meth:`_attention_maps` pass: inputs in the chunks' layout, the readers of
        each intermediate, the zeroed sums they fill, the output tensors and the workspaces."""
        q, k = batch.half_layout()  # the logits are the same in either pair layout
        B, H, S, D = q.shape
        Hk = k.shape[1]
        g = H // Hk
        dev = q.device
        cpu = dev.type == "cpu"
        rows = self._rows_per_chunk(B, H, S, dev, g)
        bs = B
        if cpu:  # a chunk of more than the cache budget (the rows' floor at a large batch): slices of it
            budget = min(self.spec.chunk_elems or cpu_chunk_elems(), cpu_chunk_elems())
            bs = max(1, min(B, budget // max(1, H * rows * S)))
        # GQA without repeating keys: query head h = kv * g + r uses key head kv, so the g query
        # heads of one key head are a grouped view [B, Hk, g, S, D] of the queries.
        # the keys transposed once per layer on the CPU: MKL runs the chunks' [c, D] x [D, nc] products
        # about 1.5x faster from a [D, S] matrix than from a transposed view of [S, D]
        kT = self._buffer("kT", (B, Hk, D, S), dev).copy_(k.transpose(2, 3)) if cpu else k.transpose(2, 3)
        run = _MapsRun(layer=batch.layer, qs=q.view(B, Hk, g, S, D), scaling=batch.scaling, kT=kT,
                       v=v, H=H, causal=batch.causal, window=batch.window, softcap=batch.softcap, heads=batch.heads,
                       checked=checked, cpu=cpu, rows=rows, bs=bs, S=S, M=self.spec.map_side())
        run.readers = {n: [st for st in readers if n in st.reads_maps]
                       for n in ("logits", "masked_logits", "logit_sum", "weights", "head_weights")}
        users = self._user_points if self.user else set()
        # the fused CPU pass, when no statistic of the layer reads the logits or weights chunk by chunk
        if (native and cpu and batch.window is None and q.dtype == torch.float32 and "scores" not in users
                and not (run.readers["logits"] or run.readers["masked_logits"] or run.readers["weights"])):
            run.native = self._native_pass()
        run.need_p = bool(run.readers["weights"] or run.readers["head_weights"]) or v is not None or "probs" in users

        def zeros(name, *shape):  # on the CPU a reused buffer: a fresh S x S map faults its pages in again
            return self._buffer("map_" + name, shape, dev, reuse=cpu).zero_()
        for st in readers:
            st.begin_maps(self, run, zeros)
        if v is not None:
            run.output = torch.empty(B, S, H, D, dtype=out_dtype or v.dtype, device=dev)
        if "scores" in users:
            run.user_scores = torch.full((B, H, S, S), float("-inf"), dtype=torch.float32, device=dev)
        if "probs" in users:
            run.user_probs = torch.zeros(B, H, S, S, dtype=torch.float32, device=dev)
        run.bad = None if checked else torch.zeros((), dtype=torch.bool, device=dev)
        run.above = torch.ones(rows, rows, dtype=torch.bool, device=dev).triu_(1)  # j > i in a diagonal block
        if run.readers["head_weights"]:  # `rows` zero columns, then the chunk's per-head batch sums
            W = rows + S  # of the weights (see poslens.capture.builtin.slash.slash_view)
            run.zbuf = self._buffer("slash", (H, rows, W), dev, reuse=cpu)
            run.zbuf[:, :, :rows] = 0.0
        return run

    def _put(self, run, name, part, start, index=None) -> None:
        """Write a chunk's ``[c, nc]`` rows of the ``S x S`` map ``name`` (block sums with --map-size); a
        later slice of the chunk's sequences (``run.b0 > 0``) adds to what the first wrote."""
        run.block_maps.add(name)
        dst = run.out[name] if index is None else run.out[name][index]
        if self.blocks is None:
            rows = dst[start:start + part.shape[0], :part.shape[1]]
            rows.copy_(part) if run.b0 == 0 else rows.add_(part)
        else:
            self.blocks.add_rows(dst, part, start)

    def _chunk_logits(self, run, start, stop) -> torch.Tensor:
        """The chunk's scaled logits ``[B, H, c, nc]`` (soft-capped where the model caps), in a reused
        buffer on the CPU; a causal row block sees keys ``< stop`` only."""
        _, Hk, g, S, D = run.qs.shape
        B = run.b1 - run.b0  # this slice's sequences
        c = stop - start
        nc = stop if run.causal else S
        rows = run.qs[run.b0:run.b1, :, :, start:stop]  # [B, Hk, g, c, D]
        if run.cpu:  # the scale folded into a cache-sized copy of the chunk's rows (not a copy of all of q)
            qc = self._buffer("q_rows", (B, Hk, g, c, D), rows.device)
            torch.mul(rows, run.scaling, out=qc) if run.scaling != 1.0 else qc.copy_(rows)
        else:
            qc = rows * run.scaling if run.scaling != 1.0 else rows.contiguous()
        qc = qc.view(B, Hk, g * c, D)
        if run.cpu:
            logits = self._buffer("logits", (B, Hk, g * c, nc), qc.device)
            torch.matmul(qc, run.kT[run.b0:run.b1, :, :, :nc], out=logits)
        else:
            logits = torch.matmul(qc, run.kT[run.b0:run.b1, :, :, :nc])
        logits = logits.view(B, run.H, c, nc)
        if run.softcap is not None:  # Gemma 2: the logits the softmax sees are capped, so are the captured ones
            logits = torch.tanh_(logits.div_(run.softcap)).mul_(run.softcap)
        return logits

    def _chunk_output(self, run, p, start) -> None:
        """The chunk's rows of the layer output ``p @ v`` (per key head group) from its weights, and the
        users' copy of the weights."""
        B, H, c, nc = p.shape
        if run.output is not None:
            Hk, D = run.v.shape[1], run.v.shape[-1]
            pv = self._buffer("pv", (B, Hk, H // Hk * c, D), p.device)
            torch.matmul(p.view(B, Hk, H // Hk * c, nc), run.v[run.b0:run.b1, :, :nc], out=pv)
            run.output.view(*run.output.shape[:2], Hk, H // Hk, D)[run.b0:run.b1, start:start + c].copy_(
                pv.view(B, Hk, H // Hk, c, D).permute(0, 3, 1, 2, 4))
        if run.user_probs is not None:
            run.user_probs[run.b0:run.b1, :, start:start + c, :nc] = p

    def _chunk_head_weights(self, run, p, start) -> None:
        """Per-head batch sums of the chunk's weights, written into ``run.zbuf``; once the last slice of
        the chunk's sequences is in, they go to the statistics that read them. A non-finite weight
        (softmax of an allowed +inf/NaN logit) is traced to its head (checked) or flagged."""
        B, H, c, nc = p.shape
        rows = run.rows
        pb = run.zbuf[:, :c, rows:rows + nc]  # [H, c, nc]
        if run.cpu:  # slice adds: see kernels.sum_first
            first = 0
            if run.b0 == 0:
                torch.add(p[0], p[1], out=pb) if B > 1 else pb.copy_(p[0])
                first = 2
            for b in range(first, B):
                pb.add_(p[b])
        else:  # off the CPU a chunk is never sliced (run.bs == B)
            torch.sum(p, dim=0, out=pb)
        if run.b1 < run.qs.shape[0]:  # more of the chunk's sequences to come
            return
        run.probe = None
        for st in run.readers["head_weights"]:
            st.chunk_head_weights(self, run, pb, start)
        if run.checked and not _finite(pb if run.probe is None else run.probe):
            raise _nonfinite_error(run.layer, int((~torch.isfinite(pb)).any(dim=(1, 2)).nonzero()[0]))
        if run.bad is not None:
            run.bad |= ~torch.isfinite(pb).all()

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
            out[name] = acc.release_mean(dtype)
        return out
