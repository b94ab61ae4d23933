"""``dim_logit``: each head dimension's contribution to the logits.

``dim_logit[l, h, d]``: the mean over the pairs ``j <= i`` a query sees (inside a sliding window,
where there is one) of ``scaling * q_{i,d} k_{j,d}`` (post-RoPE, in the rotate-half pair layout),
mean over sequences; the summary sums it into RoPE frequency bands.
"""

from __future__ import annotations

import torch

from poslens import native
from poslens.capture.statistics.builtin.base import BuiltinStatistic, LayerBatch
from poslens.capture.backends.kernels import sum_first


def causal_pair_dim_sum(qg: torch.Tensor, k: torch.Tensor, workers=None) -> torch.Tensor:
    """``sum_{j <= i} q[..., i, d] k[..., j, d]`` per dimension: ``[B, Hk, g, D]`` from grouped queries
    ``qg [B, Hk, g, S, D]`` and keys ``k [B, Hk, S, D]``.

    Equal to ``sum_i q_i * cumsum(k)_i``, one sequence at a time: a sequence's keys, their running
    sum and the product stay cache-sized (at batch 20 the whole layer's are tens of megabytes; a
    small lower-triangular product per 64 positions over the whole batch is several times slower).
    """
    B, Hk, g, S, D = qg.shape
    fused = native.causal_pair_dim_sum(qg, k, workers)
    if fused is not None:  # one pass over q and k (poslens.native), the running sums in float64
        return fused
    if qg.device.type != "cpu":  # one pass over the batch; torch's GPU scan is fast over the innermost dim
        ck = k.transpose(-1, -2).cumsum(-1).transpose(-1, -2)  # [B, Hk, S, D] (strided view)
        return (qg * ck[:, :, None]).sum(dim=3)
    out = torch.empty(B, Hk, g, D, dtype=qg.dtype, device=qg.device)
    ck = torch.empty(Hk, S, D, dtype=k.dtype, device=k.device)
    for b in range(B):
        torch.cumsum(k[b], dim=1, out=ck)  # keys j <= i
        torch.sum(qg[b] * ck[:, None], dim=2, out=out[b])
    return out


def far_pair_dim_sum(qg: torch.Tensor, k: torch.Tensor, window: int) -> torch.Tensor:
    """``sum_{j <= i - window} q[..., i, d] k[..., j, d]``: the causal pairs outside a sliding window."""
    S = k.shape[2]
    if window >= S:
        return torch.zeros(qg.shape[:3] + (qg.shape[-1],), dtype=qg.dtype, device=qg.device)
    ck = k.cumsum(dim=2)[:, :, : S - window]  # keys j <= i - window for queries i = window .. S-1
    return (qg[:, :, :, window:] * ck[:, :, None]).sum(dim=3)


class DimLogit(BuiltinStatistic):
    name = "dim_logit"
    accumulators = ("dim_logit",)
    needs = frozenset({"qk"})

    def shapes(self, spec):
        return {"dim_logit": (len(spec.layers), spec.num_heads, spec.head_dim)}

    def add(self, batch: LayerBatch, piece) -> None:
        """The per-dimension sums over the causal pairs a query sees, divided by their number."""
        q, k = batch.half_layout()
        B, H, S, D = q.shape
        Hk = k.shape[1]
        qg = q.view(B, Hk, H // Hk, S, D)
        dim_sum = sum_first(causal_pair_dim_sum(qg, k, batch.capture.work.workers)).reshape(H, D)
        n_pairs = S * (S + 1) / 2
        if batch.window is not None and batch.causal:  # only the pairs a query sees: drop i - j >= window
            dim_sum -= sum_first(far_pair_dim_sum(qg, k, batch.window)).reshape(H, D)
            n_pairs = sum(min(i + 1, batch.window) for i in range(S))
        batch.capture.accs["dim_logit"].sum[batch.li] += (batch.scaling * dim_sum.to(torch.float64) / n_pairs)


STATISTIC = DimLogit()
