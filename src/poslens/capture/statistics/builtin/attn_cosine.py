"""``attn_cosine``: self-cosine maps, norms and per-sequence APS of the attention output.

``attn_cosine[l]`` / ``attn_norms[l]`` / ``attn_aps_seq[l]``: what :mod:`poslens.capture.statistics.builtin.cosine`
computes of the residual stream, of layer ``l``'s concatenated head outputs before the output
projection (arXiv 2501.00073).
"""

from __future__ import annotations

from poslens.capture.statistics.builtin.base import BuiltinStatistic
from poslens.capture.statistics.builtin.cosine import add_cosine


class AttnCosine(BuiltinStatistic):
    name = "attn_cosine"
    accumulators = ("attn_cosine", "attn_norms", "attn_aps_seq")
    with_var = ("attn_aps_seq",)
    lower = ("attn_cosine",)
    needs = frozenset({"head_out"})

    def shapes(self, spec):
        L, M, S = len(spec.layers), spec.map_side(), spec.seq_len
        return {"attn_cosine": (L, M, M), "attn_norms": (L, S), "attn_aps_seq": (L,)}

    def add(self, batch, piece):
        """The head outputs ``[B, S, H, D]`` read as ``[B, S, H * D]`` (a view; the sequence-major copy
        is made once, inside :func:`~poslens.capture.statistics.builtin.cosine.add_cosine`)."""
        add_cosine(batch.capture, self.accumulators, batch.li, piece["head_out"])


STATISTIC = AttnCosine()
