"""``slash``: each head's mean attention weight by offset (the slash profile).

``slash[l, h, d]``: ``(1/(S-d)) sum_{i>=d} A_h[i, i-d]``, mean over sequences: SlashScore(d) of
arXiv 2601.08297. Brings ``sink_heads`` along (:mod:`poslens.capture.builtin.sink`).
"""

from __future__ import annotations

import torch

from poslens.capture.builtin.base import BuiltinStatistic, LayerBatch


def slash_view(zbuf: torch.Tensor, c: int, stop: int, pad: int) -> torch.Tensor:
    """View ``[H, c, stop]`` of the head-weight buffer with ``V[h, r, t] = A_h[start + r, start + r - d]``.

    ``zbuf [H, pad, W]`` holds a chunk's weights ``A_h[start + r, j]`` at column ``pad + j`` and zeros
    in its first ``pad >= c`` columns; ``d = stop - 1 - t`` with ``start = stop - c``. Row stride
    ``W + 1`` shifts each row one column further, so the columns line up by offset; entries with
    ``d > start + r`` (no such sub-diagonal element) land in the zero columns.
    """
    H, _, W = zbuf.shape
    return zbuf.as_strided((H, c, stop), (zbuf.stride(0), W + 1, 1), zbuf.storage_offset() + pad - c + 1)


class Slash(BuiltinStatistic):
    name = "slash"
    requires = ("sink_heads",)
    accumulators = ("slash",)
    reads_maps = frozenset({"head_weights"})

    def shapes(self, spec):
        return {"slash": (len(spec.layers), spec.num_heads, spec.seq_len)}

    def begin_maps(self, capture, run, zeros):
        run.out["slash"] = zeros("slash", run.H, run.S)

    def chunk_head_weights(self, capture, run, pb, start):
        c = pb.shape[1]
        run.out["slash"][:, :start + c] += slash_view(run.zbuf, c, start + c, run.rows).sum(dim=1).flip(-1)

    def add_maps(self, capture, batch: LayerBatch, maps):
        S = maps["slash"].shape[-1]
        capture.accs["slash"].sum[batch.li] += maps["slash"].to(torch.float64) / (
            S - torch.arange(S, device=maps["slash"].device, dtype=torch.float64))


STATISTIC = Slash()
