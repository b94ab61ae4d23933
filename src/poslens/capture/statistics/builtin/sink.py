"""``sink_heads``: each head's attention weight on key 0, per query position.

``sink_heads[l, h, i]``: ``A_h[i, 0]``, mean over sequences (1 at ``i = 0`` in causal runs). One
column of the softmax that ``probs`` and ``slash`` take, so it comes with either of them; exact
whatever ``--map-size``.
"""

from __future__ import annotations

from poslens.capture.statistics.builtin.base import BuiltinStatistic, LayerBatch


class SinkHeads(BuiltinStatistic):
    name = "sink_heads"
    selectable = False  # brought along by probs and slash (their `requires`)
    accumulators = ("sink_heads",)
    needs = frozenset({"key0_weights"})

    def shapes(self, spec):
        return {"sink_heads": (len(spec.layers), spec.num_heads, spec.seq_len)}

    def begin_layer(self, batch, maps):
        maps.zeros("sink_heads", batch.query.shape[1], maps.S)

    def add(self, batch, piece):
        k0 = piece["key0_weights"]
        batch.maps["sink_heads"][:, piece.rows.start:piece.rows.start + k0.shape[1]] = k0

    def end_layer(self, batch: LayerBatch, maps):
        batch.capture.work.add64(batch.capture.accs["sink_heads"].sum[batch.li], maps["sink_heads"])


STATISTIC = SinkHeads()
