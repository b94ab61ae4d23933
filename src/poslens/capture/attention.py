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
function also adds to streaming float64 accumulators (:class:`poslens.stats.AccumulatorSet`).
The batch and head reductions are folded into matrix products, and the softmax is taken in
query-row chunks, so memory is bounded by the result (``S x S`` per layer) and one chunk of
``B x H x c x S`` logits, never by ``B x H x S x S`` per layer.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from poslens.errors import PoslensError
from poslens.rope import unapply_rope
from poslens.stats import AccumulatorSet, MeanAccumulator

ATTN_NAME = "poslens"

#: The capture active in this process (one forward at a time); ``None`` = plain SDPA.
_ACTIVE: "Capture | None" = None


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
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0,
        is_causal=sdpa_causal, scale=scaling, enable_gqa=key.shape[1] != H,
    )
    if cap is not None and layer in cap.layer_pos:
        if padding is not None or Sq != Sk:
            raise PoslensError("capture needs full, unpadded sequences without a KV cache; scan feeds packed "
                               "sequences of exactly --seq-len tokens.")
        cap.observe_attention(layer, query, key, out, scaling, causal=causal, window=window)
    return out.transpose(1, 2).contiguous(), None


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
    chunk_elems: int = 2**23  # logits per query-row chunk (B * H * c * S), bounds the working set


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
    }
    if spec.heads:
        shapes["head_scores"] = (len(spec.heads), S, S)
        shapes["head_probs"] = (len(spec.heads), S, S)
    return shapes


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
      (post-RoPE): per-dimension contribution to the logit, summed into RoPE bands in the summary.
    """

    def __init__(self, spec: CaptureSpec, device="cpu"):
        self.spec = spec
        self.layer_pos = {l: n for n, l in enumerate(spec.layers)}
        self.head_pos = {}
        for n, (l, h) in enumerate(spec.heads):
            self.head_pos.setdefault(l, []).append((n, h))
        self.accs = AccumulatorSet({k: MeanAccumulator(s, device=device) for k, s in accumulator_shapes(spec).items()})
        self.rope_cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
        self._batch_size = 0

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

    def begin_batch(self, batch_size: int) -> None:
        self._batch_size = int(batch_size)

    def end_batch(self) -> None:
        """Count the batch's sequences once in every accumulator (sums were added per layer)."""
        for acc in self.accs.values():
            acc.count += self._batch_size
        self._batch_size = 0

    # -- RoPE -------------------------------------------------------------------------------
    def unrotate(self, query: torch.Tensor, key: torch.Tensor):
        """Pre-RoPE queries and keys from post-RoPE ones with the model's own cos/sin."""
        if self.rope_cos_sin is None:
            raise PoslensError("no RoPE cos/sin were observed for this forward; the adapter's rotary module hook "
                               "did not fire (unsupported architecture?).")
        cos, sin = self.rope_cos_sin
        cos = cos[:, None].to(torch.float32)
        sin = sin[:, None].to(torch.float32)
        s2 = cos[..., :1] ** 2 + sin[..., :1] ** 2  # attention_scaling^2 for scaled RoPE variants
        q = unapply_rope(query.to(torch.float32), cos, sin)
        k = unapply_rope(key.to(torch.float32), cos, sin)
        r = cos.shape[-1]
        q = torch.cat([q[..., :r] / s2, q[..., r:]], -1) if r < q.shape[-1] else q / s2
        k = torch.cat([k[..., :r] / s2, k[..., r:]], -1) if r < k.shape[-1] else k / s2
        return q.to(query.dtype), k.to(key.dtype)

    # -- hidden states ----------------------------------------------------------------------
    @torch.no_grad()
    def observe_hidden(self, index: int, hidden: torch.Tensor) -> None:
        """Add residual-stream vectors ``[B, S, d]`` at ``cosine``/``norms`` index ``index``."""
        self._add_cosine("cosine", "norms", index, hidden)

    def _add_cosine(self, cos_name, norm_name, index, x):
        x = x.to(torch.float32)
        n = x.norm(dim=-1)  # [B, S]
        xn = x / n.clamp_min(1e-30)[..., None]
        B, S, d = xn.shape
        folded = xn.permute(1, 0, 2).reshape(S, B * d)
        self.accs[cos_name].sum[index] += (folded @ folded.T).to(torch.float64)
        self.accs[norm_name].sum[index] += n.to(torch.float64).sum(0)

    # -- attention --------------------------------------------------------------------------
    @torch.no_grad()
    def observe_attention(self, layer, query, key, out, scaling, *, causal=True, window=None) -> None:
        spec = self.spec
        li = self.layer_pos[layer]
        acc = self.accs
        B, H, S, D = query.shape
        Hk = key.shape[1]
        g = H // Hk
        q = query.to(torch.float32)
        k = key.to(torch.float32)
        k_rep = k.repeat_interleave(g, dim=1) if g > 1 else k

        # pre-RoPE second moments (rank analysis)
        if layer in spec.rope_layers:
            q_pre, k_pre = self.unrotate(query, key)
            q_pre, k_pre = q_pre.to(torch.float32), k_pre.to(torch.float32)
        else:
            q_pre, k_pre = q, k
        acc["q_gram"].sum[li] += (torch.einsum("bhsd,bhse->hde", q_pre, q_pre) / S).to(torch.float64)
        acc["k_gram"].sum[li] += (torch.einsum("bhsd,bhse->hde", k_pre, k_pre) / S).to(torch.float64)

        # per-dimension logit contribution over causal pairs j <= i: sum_i q_i * cumsum(k)_i
        kcum = k_rep.cumsum(dim=2)
        dim_sum = (q * kcum).sum(dim=2).sum(0)  # [H, D]
        acc["dim_logit"].sum[li] += (scaling * dim_sum / (S * (S + 1) / 2)).to(torch.float64)

        # scores, probs, slash and per-head maps, in query-row chunks: only [B, H, c, S] logits live
        # at a time. A causal row block [start, stop) needs keys < stop only, so the key range is cut
        # there (half the work of a full S x S product); the batch/head sum of the scores is then a
        # reduction of the logits already computed for the softmax rather than a second matmul.
        rows_per_chunk = max(1, spec.chunk_elems // max(1, B * H * S))
        j = torch.arange(S, device=q.device)
        scores_sum = torch.zeros(S, S, dtype=torch.float64, device=q.device)
        probs_sum = torch.zeros(S, S, dtype=torch.float64, device=q.device)
        slash_sum = torch.zeros(H, S, dtype=torch.float64, device=q.device)
        heads_here = self.head_pos.get(layer, [])
        for start in range(0, S, rows_per_chunk):
            stop = min(S, start + rows_per_chunk)
            nc = stop if causal else S  # keys a causal row block can see
            i = torch.arange(start, stop, device=q.device)
            logits = torch.matmul(q[:, :, start:stop], k_rep[:, :, :nc].transpose(2, 3)) * scaling  # [B,H,c,nc]
            allowed = _structure_mask(stop - start, nc, causal=causal, window=window, device=q.device,
                                      q_offset=start) if (causal or window) else None
            block_sum = logits.sum(dim=(0, 1))  # [c, nc]: the scores' batch/head sum
            if not bool(torch.isfinite(block_sum).all()):  # one cheap test; locate the head only on failure
                bad = ~torch.isfinite(logits)
                if allowed is not None:
                    bad &= allowed
                if bool(bad.any()):
                    h_bad = int(bad.any(dim=(0, 2, 3)).nonzero()[0])
                    raise PoslensError(f"non-finite attention scores in layer {layer}, head {h_bad} "
                                       f"(model overflow?); try --dtype fp32 or check the checkpoint.")
                block_sum = logits.masked_fill(~torch.isfinite(logits), 0.0).sum(dim=(0, 1))
            scores_sum[start:stop, :nc] += block_sum.to(torch.float64)
            if allowed is not None:
                logits = logits.masked_fill(~allowed, float("-inf"))
            p = torch.softmax(logits, dim=-1)
            pb = p.sum(0)  # [H, c, nc]: batch summed before the offset gather
            probs_sum[start:stop, :nc] += pb.sum(0).to(torch.float64)
            # slot d of row i holds A[i, i - d] (valid for d <= i): the sub-diagonals by offset
            off = i[:, None] - j[None, :nc]  # [c, nc]
            gathered = torch.gather(pb, 2, off.clamp_min(0).expand(H, -1, -1)) * (off >= 0)
            slash_sum[:, :nc] += gathered.sum(dim=1).to(torch.float64)
            del gathered
            for n, h in heads_here:
                lh = logits[:, h]
                acc["head_scores"].sum[n, start:stop, :nc] += lh.masked_fill(~torch.isfinite(lh), 0.0).sum(0).to(torch.float64)
                acc["head_probs"].sum[n, start:stop, :nc] += p[:, h].sum(0).to(torch.float64)
        if causal:
            scores_sum.tril_()  # above the diagonal: not computed, stored as 0
        acc["scores"].sum[li] += scores_sum / H
        acc["probs"].sum[li] += probs_sum / H
        acc["slash"].sum[li] += slash_sum / (S - torch.arange(S, device=q.device, dtype=torch.float64))

        # attention output before the output projection: [B, H, S, D] -> [B, S, H*D]
        self._add_cosine("attn_cosine", "attn_norms", li, out.transpose(1, 2).reshape(B, S, H * D))

    # -- results ----------------------------------------------------------------------------
    def means(self) -> dict[str, torch.Tensor]:
        """Mean of every accumulator (float64); upper triangles of causal maps are left as computed."""
        return {name: acc.mean for name, acc in self.accs.items()}
