"""``head_scores`` / ``head_probs``: full per-head maps of the heads ``--heads`` names.

``head_scores[n]`` / ``head_probs[n]``: the score and weight maps of the ``n``-th ``(layer, head)``
pair of ``--heads``, mean over sequences; masked entries stored as 0. They follow ``--heads``, not
``--stats``.
"""

from __future__ import annotations

import torch

from poslens.capture.builtin.base import BuiltinStatistic, LayerBatch
from poslens.capture.kernels import sum_first


class HeadMaps(BuiltinStatistic):
    name = "heads"
    selectable = False  # follows --heads
    accumulators = ("head_scores", "head_probs")
    reads_maps = frozenset({"masked_logits", "weights"})

    def active(self, spec):
        return bool(spec.heads)

    def shapes(self, spec):
        M = spec.map_side()
        return {"head_scores": (len(spec.heads), M, M), "head_probs": (len(spec.heads), M, M)}

    def maps_at(self, capture, layer):
        return bool(capture.head_pos.get(layer))

    def begin_maps(self, capture, run, zeros):
        if run.heads:
            run.out["head_scores"] = zeros("head_scores", len(run.heads), run.M, run.M)
            run.out["head_probs"] = zeros("head_probs", len(run.heads), run.M, run.M)

    def chunk_masked_logits(self, capture, run, logits, start):
        for m, (_n, h) in enumerate(run.heads):
            lh = logits[:, h]
            capture._put(run, "head_scores", sum_first(lh.masked_fill(~torch.isfinite(lh), 0.0)), start, m)

    def chunk_weights(self, capture, run, p, start):
        for m, (_n, h) in enumerate(run.heads):
            capture._put(run, "head_probs", sum_first(p[:, h]), start, m)

    def add_maps(self, capture, batch: LayerBatch, maps):
        acc = capture.accs
        for m, (n, _h) in enumerate(batch.heads):
            capture._add64(acc["head_scores"].sum[n], maps["head_scores"][m])
            capture._add64(acc["head_probs"].sum[n], maps["head_probs"][m])


STATISTIC = HeadMaps()
