"""``sink_heads``: each head's attention weight on key 0, per query position.

``sink_heads[l, h, i]``: ``A_h[i, 0]``, mean over sequences (1 at ``i = 0`` in causal runs). One
column of the softmax that ``probs`` and ``slash`` take, so it comes with either of them; exact
whatever ``--map-size``.
"""

from __future__ import annotations

from poslens.capture.builtin.base import BuiltinStatistic, LayerBatch


class SinkHeads(BuiltinStatistic):
    name = "sink_heads"
    selectable = False  # brought along by probs and slash (their `requires`)
    accumulators = ("sink_heads",)
    reads_maps = frozenset({"head_weights"})

    def shapes(self, spec):
        return {"sink_heads": (len(spec.layers), spec.num_heads, spec.seq_len)}

    def begin_maps(self, capture, run, zeros):
        run.out["sink_heads"] = zeros("sink_heads", run.H, run.S)

    def chunk_head_weights(self, capture, run, pb, start):
        run.out["sink_heads"][:, start:start + pb.shape[1]] = pb[:, :, 0]

    def add_maps(self, capture, batch: LayerBatch, maps):
        capture._add64(capture.accs["sink_heads"].sum[batch.li], maps["sink_heads"])


STATISTIC = SinkHeads()
