"""Slash-pattern metrics (arXiv 2601.08297).

``SlashScore(d) = E_P[(1/(N-d)) sum_{i=d+1..N} S_{i,i-d}(P)]``: the mean post-softmax weight a
head puts on its d-th sub-diagonal. A head is (kappa, d)-slash-dominant if SlashScore(d) >= kappa.
Profiles are ``[..., S]`` tensors indexed by d = 0 .. S-1.
"""

from __future__ import annotations

import torch

#: The offsets slash heads are sought over (as ``poslens slash``): the paper's slash-dominant heads
#: have small offsets, and SlashScore at large offsets is the attention sink (SlashScore(S-1) is the
#: single entry A[S-1, 0], the weight of the last query on key 0).
SLASH_MIN_DELTA = 1
SLASH_MAX_DELTA = 16


def scored_offsets(S: int, min_offset: int = SLASH_MIN_DELTA, max_offset: int | None = SLASH_MAX_DELTA) -> range:
    """Offsets ``d`` a head is scored at in a length-``S`` map: ``min_offset <= d <= max_offset`` and at
    least half of the queries have a key at that offset (``S - d >= ceil(S / 2)``), so no offset is
    judged on a handful of entries near the corner of the map."""
    hi = S - (S + 1) // 2
    if max_offset is not None:
        hi = min(hi, max_offset)
    return range(max(0, min_offset), hi + 1)


def slash_profile(attn) -> torch.Tensor:
    """SlashScore(d) of attention matrices ``[..., S, S]`` (rows = queries), averaged over leading
    dims that the caller wants to average; returns ``[..., S]`` (no averaging here).

    Direct reference computation: the mean of each sub-diagonal.
    """
    a = torch.as_tensor(attn, dtype=torch.float64)
    S = a.shape[-1]
    return torch.stack([torch.diagonal(a, offset=-d, dim1=-2, dim2=-1).mean(-1) for d in range(S)], dim=-1)


def top_slash_heads(slash, k: int = 10, min_offset: int = SLASH_MIN_DELTA, max_offset: int | None = SLASH_MAX_DELTA,
                    layer_ids: list[int] | None = None) -> list[dict]:
    """The ``k`` heads with the largest SlashScore over the :func:`scored_offsets` ``min_offset..max_offset``.

    ``slash`` is ``[L, H, S]``; each head appears once, at its best offset. Returns dicts
    ``{layer, head, offset, score, uniform}`` sorted by score, descending (``uniform``: the
    SlashScore at that offset of uniform causal attention, mean of 1/(i+1) over the queries).
    ``layer_ids`` maps row index to the model's layer number (decoder layers from 0).
    """
    s = torch.as_tensor(slash, dtype=torch.float64)
    L, H, S = s.shape
    offs = scored_offsets(S, min_offset, max_offset)
    if len(offs) == 0:
        return []
    min_offset, hi = offs.start, offs.stop - 1
    window = torch.nan_to_num(s[..., min_offset: hi + 1], nan=-1.0)
    best, arg = window.max(dim=-1)  # [L, H]
    order = torch.argsort(best.reshape(-1), descending=True)[:k]
    out = []
    for flat in order.tolist():
        l, h = divmod(flat, H)
        d = int(arg[l, h]) + min_offset
        uniform = float((1.0 / torch.arange(d + 1, S + 1, dtype=torch.float64)).mean())
        out.append({"layer": layer_ids[l] if layer_ids else l, "head": h,
                    "offset": d, "score": float(best[l, h]), "uniform": uniform})
    return out


def slash_dominant(slash, kappa: float, offset: int) -> torch.Tensor:
    """Bool ``[L, H]``: heads that are (kappa, offset)-slash-dominant."""
    return torch.as_tensor(slash)[..., offset] >= kappa


def sink_weight(probs) -> torch.Tensor:
    """Mean attention weight on key 0 over the queries i >= 1 (query 0 can only see key 0):
    ``probs`` ``[..., S, S]`` (rows = queries) -> ``[...]``. The attention sink's own number."""
    p = torch.as_tensor(probs, dtype=torch.float64)
    if p.shape[-1] < 2:
        return torch.full(p.shape[:-2], float("nan"), dtype=torch.float64)
    return p[..., 1:, 0].mean(-1)
