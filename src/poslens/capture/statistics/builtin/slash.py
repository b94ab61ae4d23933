"""``slash``: each head's mean attention weight by offset (the slash profile).

``slash[l, h, d]``: ``(1/(S-d)) sum_{i>=d} A_h[i, i-d]``, mean over sequences: SlashScore(d) of
arXiv 2601.08297. Brings ``sink_heads`` along (:mod:`poslens.capture.statistics.builtin.sink`).
"""

from __future__ import annotations

import torch

from poslens.capture.statistics.builtin.base import BuiltinStatistic, LayerBatch


class Slash(BuiltinStatistic):
    name = "slash"
    requires = ("sink_heads",)
    accumulators = ("slash",)
    needs = frozenset({"diagonal_sums"})

    def shapes(self, spec):
        return {"slash": (len(spec.layers), spec.num_heads, spec.seq_len)}

    def begin_layer(self, batch, maps):
        maps.zeros("slash", batch.query.shape[1], maps.S)

    def add(self, batch, piece):
        d = piece["diagonal_sums"]
        batch.maps["slash"][:, :d.shape[1]] += d

    def end_layer(self, batch: LayerBatch, maps):
        S = maps["slash"].shape[-1]
        batch.capture.accs["slash"].sum[batch.li] += maps["slash"].to(torch.float64) / (
            S - torch.arange(S, device=maps["slash"].device, dtype=torch.float64))


STATISTIC = Slash()
