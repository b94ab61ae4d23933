"""The attention function poslens registers with transformers.

transformers dispatches every attention layer of the supported architectures through
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` with post-RoPE queries and keys
(``[B, H, S, D]``; keys may have fewer heads under GQA). poslens registers one function under
:data:`ATTN_NAME` (``AttentionInterface.register``) plus a mask function under the same name
(``AttentionMaskInterface.register``) that hands through only the 2-D padding mask; the
attention function then applies the causal (or, as a control, no), sliding-window and padding
mask itself and hands the real computation to ``torch.nn.functional.scaled_dot_product_attention``
so the model's outputs are those of the ``sdpa`` implementation. Nothing in transformers is
replaced.

While a capture is active (``with capture.active(): model(...)``), every call of the function from
the model it is bound to also goes to the capture (:class:`poslens.capture.engine.capture.Capture`), which
runs the layer's attention pass (:mod:`poslens.capture.backends.attnpass`) for its statistics. This module
also names the capture's public pieces for callers that import them from here.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F

from poslens.capture.backends.attnpass import structure_mask
from poslens.capture.backends.blocks import BlockMaps
from poslens.capture.engine.context import active_capture
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.intervene import active_edits
from poslens.capture.backends.rope import half_layout_perm, unrotate_qk
from poslens.capture.engine.spec import (ALL_STATS, STATS, CaptureSpec, accumulator_shapes, parse_stats, stats_option,
                                  stats_record, user_statistics)
from poslens.capture.statistics.accumulators import noise_grid
from poslens.errors import PoslensError

ATTN_NAME = "poslens"

__all__ = ["ALL_STATS", "ATTN_NAME", "STATS", "BlockMaps", "Capture", "CaptureSpec", "accumulator_shapes",
           "active_capture", "half_layout_perm", "noise_grid", "parse_stats", "poslens_attention", "register",
           "stats_option", "stats_record", "unrotate_qk", "user_statistics"]


#: the q/k capture-point hooks by attention module: ``[(point, fn, state), ...]``. Weak keys: the registry
#: keeps no model alive and puts nothing on its modules.
_QK_HOOKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class QKHookHandle:
    """Takes one q/k capture-point hook out of the registry (the module's entry with its last hook)."""

    def __init__(self, module, entry):
        self._module, self._entry = weakref.ref(module), entry

    def remove(self) -> None:
        module = self._module()
        hooks = _QK_HOOKS.get(module) if module is not None else None
        if hooks is not None and self._entry in hooks:
            hooks.remove(self._entry)
            if not hooks:
                del _QK_HOOKS[module]


def add_qk_hook(module, point: str, fn, state: dict) -> QKHookHandle:
    """Hand ``module``'s queries (``q_pre``/``q_post``) or keys (``k_pre``/``k_post``) to ``fn`` on every
    call of the attention function from it; ``state``: ``{"cos_sin", "layout", "rope"}`` to un-rotate with."""
    entry = (point, fn, state)
    _QK_HOOKS.setdefault(module, []).append(entry)
    return QKHookHandle(module, entry)


def _run_qk_hooks(hooks: list, query: torch.Tensor, key: torch.Tensor) -> None:
    """Hand a layer's q/k to the ``q_pre``/``k_pre``/``q_post``/``k_post`` capture-point hooks
    (:func:`poslens.capture.model.adapters.hook_point`) registered for its attention module."""
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
    qk_hooks = _QK_HOOKS.get(module)
    if qk_hooks:  # q/k capture points: the layer's queries and keys before and after RoPE
        _run_qk_hooks(qk_hooks, query, key)
    edits = active_edits(module)
    sink_off = False
    if edits is not None and edits.takes(layer):  # an intervention (poslens ablate, a control): edited q/k and mask
        query, key = edits.apply(layer, query, key)
        sliding_window, sink_off = edits.structure(layer, sliding_window)
        causal = causal and edits.causal
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
    if captured and not (dropout and module.training) and cap.computes_output(layer, query, key, window, softcap,
                                                                                sink_off=sink_off):
        # one pass: the capture's chunks compute the weights it accumulates and, from them, the output
        out = cap.observe_attention(layer, query, key, None, scaling, causal=causal, window=window,
                                    softcap=softcap, value=value, sink_off=sink_off)
        return out.transpose(1, 2).contiguous(), None
    out = _plain_attention(query, key, value, padding, causal=causal, window=window, scaling=scaling,
                           softcap=softcap, dropout=dropout if module.training else 0.0, sink_off=sink_off)
    if captured:
        cap.observe_attention(layer, query, key, out, scaling, causal=causal, window=window, softcap=softcap,
                              sink_off=sink_off)
    return out.transpose(1, 2).contiguous(), None


def _plain_attention(query, key, value, padding, *, causal, window, scaling, softcap, dropout, sink_off=False):
    """The layer's attention output ``[B, H, Sq, D]`` without capture: SDPA with the structure and
    padding masks (``is_causal`` where no explicit mask is needed), or eager soft-capped attention.
    ``sink_off``: key 0 masked for every query after it (an intervention of ``poslens ablate``)."""
    B, H, Sq = query.shape[:3]
    Sk = key.shape[2]
    if padding is None and window is None and not sink_off and (not causal or Sq == Sk):
        mask, sdpa_causal = None, causal and Sq > 1
    else:
        mask = _full_mask(structure_mask(Sq, Sk, causal=causal, window=window, device=query.device,
                                          q_offset=Sk - Sq, sink_off=sink_off),
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
    mask = structure_mask(Sq, Sk, causal=causal, window=window, device=query.device, q_offset=Sk - Sq)
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
        mask = structure_mask(Sq, Sk, causal=True, window=None, device=query.device, q_offset=Sk - Sq)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    p = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(p, value)
