"""Slash-pattern metrics (arXiv 2601.08297).

``SlashScore(d) = E_P[(1/(N-d)) sum_{i=d+1..N} S_{i,i-d}(P)]``: the mean post-softmax weight a
head puts on its d-th sub-diagonal. A head is (kappa, d)-slash-dominant if SlashScore(d) >= kappa.
Profiles are ``[..., S]`` tensors indexed by d = 0 .. S-1.
"""

from __future__ import annotations

import torch


def slash_profile(attn) -> torch.Tensor:
    """SlashScore(d) of attention matrices ``[..., S, S]`` (rows = queries), averaged over leading
    dims that the caller wants to average; returns ``[..., S]`` (no averaging here).

    Direct reference computation: the mean of each sub-diagonal.
    """
    a = torch.as_tensor(attn).to(torch.float64)
    S = a.shape[-1]
    return torch.stack([torch.diagonal(a, offset=-d, dim1=-2, dim2=-1).mean(-1) for d in range(S)], dim=-1)


def top_slash_heads(slash, k: int = 10, min_offset: int = 0, max_offset: int | None = None,
                    layer_ids: list[int] | None = None) -> list[dict]:
    """The ``k`` heads with the largest SlashScore over offsets ``min_offset..max_offset``.

    ``slash`` is ``[L, H, S]``; each head appears once, at its best offset. Returns dicts
    ``{layer, head, offset, score}`` sorted by score, descending. ``layer_ids`` maps row index
    to the model's layer number.
    """
    s = torch.as_tensor(slash).to(torch.float64)
    L, H, S = s.shape
    hi = S - 1 if max_offset is None else min(max_offset, S - 1)
    if min_offset > hi:
        return []
    window = torch.nan_to_num(s[..., min_offset: hi + 1], nan=-1.0)
    best, arg = window.max(dim=-1)  # [L, H]
    order = torch.argsort(best.reshape(-1), descending=True)[:k]
    out = []
    for flat in order.tolist():
        l, h = divmod(flat, H)
        out.append({"layer": layer_ids[l] if layer_ids else l, "head": h,
                    "offset": int(arg[l, h]) + min_offset, "score": float(best[l, h])})
    return out


def slash_dominant(slash, kappa: float, offset: int) -> torch.Tensor:
    """Bool ``[L, H]``: heads that are (kappa, offset)-slash-dominant."""
    return torch.as_tensor(slash)[..., offset] >= kappa
