"""``probs``: the mean attention-weight map.

``probs[l, i, j]``: the mean over heads of the post-softmax attention weight of query ``i`` on key
``j``, mean over sequences. Under ``--map-size`` the map holds block means, and ``probs_key0[l, i]``
keeps the weight on key 0 exactly (the sink is one column, not a block). Brings ``sink_heads``
along (:mod:`poslens.capture.statistics.builtin.sink`), a column of the same softmax.
"""

from __future__ import annotations

from poslens.capture.statistics.builtin.base import BuiltinStatistic, LayerBatch


class Probs(BuiltinStatistic):
    name = "probs"
    requires = ("sink_heads",)
    accumulators = ("probs",)
    needs = frozenset({"weight_sum"})

    def shapes(self, spec):
        L, M = len(spec.layers), spec.map_side()
        shapes = {"probs": (L, M, M)}
        if spec.map_size:  # key 0's weight exactly: the sink is one column, not a block
            shapes["probs_key0"] = (L, spec.seq_len)
        return shapes

    def begin_layer(self, batch, maps):
        maps.zeros("probs", maps.M, maps.M)
        if maps.blocks is not None:
            maps.zeros("probs_key0", maps.S)

    def add(self, batch, piece):
        ws, start = piece["weight_sum"], piece.rows.start
        batch.maps.put("probs", ws, start)
        if "probs_key0" in batch.maps:
            batch.maps["probs_key0"][start:start + ws.shape[0]] = ws[:, 0]

    def end_layer(self, batch: LayerBatch, maps):
        cap, H = batch.capture, batch.query.shape[1]
        cap.work.add64(cap.accs["probs"].sum[batch.li], maps["probs"], alpha=1.0 / H, lower=batch.causal)  # 0 above
        if "probs_key0" in maps:
            cap.accs["probs_key0"].sum[batch.li].add_(maps["probs_key0"], alpha=1.0 / H)


STATISTIC = Probs()
