"""``probs``: the mean attention-weight map.

``probs[l, i, j]``: the mean over heads of the post-softmax attention weight of query ``i`` on key
``j``, mean over sequences. Under ``--map-size`` the map holds block means, and ``probs_key0[l, i]``
keeps the weight on key 0 exactly (the sink is one column, not a block). Brings ``sink_heads``
along (:mod:`poslens.capture.builtin.sink`), a column of the same softmax.
"""

from __future__ import annotations

import torch

from poslens.capture.builtin.base import BuiltinStatistic, LayerBatch


class Probs(BuiltinStatistic):
    name = "probs"
    requires = ("sink_heads",)
    accumulators = ("probs",)
    reads_maps = frozenset({"head_weights"})

    def shapes(self, spec):
        L, M = len(spec.layers), spec.map_side()
        shapes = {"probs": (L, M, M)}
        if spec.map_size:  # key 0's weight exactly: the sink is one column, not a block
            shapes["probs_key0"] = (L, spec.seq_len)
        return shapes

    def begin_maps(self, capture, run, zeros):
        run.out["probs"] = zeros("probs", run.M, run.M)
        if capture.blocks is not None:
            run.out["probs_key0"] = zeros("probs_key0", run.S)

    def chunk_head_weights(self, capture, run, pb, start):
        """The chunk's weights summed over heads too; this sum is also the chunk's finiteness probe
        (``run.probe``: one pass over ``c x nc`` values instead of ``H x c x nc``)."""
        _, c, nc = pb.shape
        if run.cpu:
            head_sum = capture._buffer("head_sum", (c, nc), pb.device)
            torch.sum(pb, dim=0, out=head_sum)
        else:
            head_sum = pb.sum(0)
        run.probe = head_sum
        capture._put(run, "probs", head_sum, start)
        if capture.blocks is not None:
            run.out["probs_key0"][start:start + c] = pb[:, :, 0].sum(0)

    def add_maps(self, capture, batch: LayerBatch, maps):
        H = batch.query.shape[1]
        acc = capture.accs
        capture._add64(acc["probs"].sum[batch.li], maps["probs"], alpha=1.0 / H, lower=batch.causal)  # 0 above
        if "probs_key0" in maps:
            acc["probs_key0"].sum[batch.li].add_(maps["probs_key0"], alpha=1.0 / H)


STATISTIC = Probs()
