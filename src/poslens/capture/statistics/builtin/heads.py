"""``head_scores`` / ``head_probs``: full per-head maps of the heads ``--heads`` names.

``head_scores[n]`` / ``head_probs[n]``: the score and weight maps of the ``n``-th ``(layer, head)``
pair of ``--heads``, mean over sequences; masked entries stored as 0. They follow ``--heads``, not
``--stats``.
"""

from __future__ import annotations

from poslens.capture.statistics.builtin.base import BuiltinStatistic, LayerBatch


class HeadMaps(BuiltinStatistic):
    name = "heads"
    selectable = False  # follows --heads
    accumulators = ("head_scores", "head_probs")
    needs = frozenset({"selected_logit_sums", "selected_weight_sums"})

    def active(self, spec):
        return bool(spec.heads)

    def shapes(self, spec):
        M = spec.map_side()
        return {"head_scores": (len(spec.heads), M, M), "head_probs": (len(spec.heads), M, M)}

    def reads_at(self, capture, layer):
        return bool(capture.head_pos.get(layer))

    def begin_layer(self, batch, maps):
        maps.zeros("head_scores", len(batch.heads), maps.M, maps.M)
        maps.zeros("head_probs", len(batch.heads), maps.M, maps.M)

    def add(self, batch, piece):
        for m in range(len(batch.heads)):
            batch.maps.put("head_scores", piece["selected_logit_sums"][m], piece.rows.start, m)
            batch.maps.put("head_probs", piece["selected_weight_sums"][m], piece.rows.start, m)

    def end_layer(self, batch: LayerBatch, maps):
        cap = batch.capture
        for m, (n, _h) in enumerate(batch.heads):
            cap.work.add64(cap.accs["head_scores"].sum[n], maps["head_scores"][m])
            cap.work.add64(cap.accs["head_probs"].sum[n], maps["head_probs"][m])


STATISTIC = HeadMaps()
