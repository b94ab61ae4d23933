"""``head_maps``: every head's mean attention-weight map, block-averaged (``--heads all``).

``head_maps[l, h, I, J]``: head ``h`` of scanned layer ``l``, the mean over sequences of the block
mean of its post-softmax weights over the visible entries of block ``(I, J)``, on a grid of its own
(:func:`head_map_blocks`): at most :data:`~poslens.conventions.HEAD_MAP_MAX_SIDE` blocks per axis
(fewer under ``--map-size``), blocks of ``f = ceil(S / n)`` positions with the rule of
:class:`~poslens.capture.backends.blocks.BlockMaps`; ``f = 1`` (the exact maps) up to that many
tokens. Blocks without a visible entry are 0. It reads only each head's batch-summed weights
(``head_weight_sums``), which the pass forms anyway for ``probs``, ``slash`` and the sink, so the
fused C pass keeps every layer. It follows ``--heads all``, not ``--stats``.
"""

from __future__ import annotations

import functools

import torch

from poslens.capture.backends.blocks import BlockMaps
from poslens.capture.statistics.builtin.base import BuiltinStatistic, LayerBatch
from poslens.conventions import HEAD_MAP_MAX_SIDE


@functools.lru_cache(maxsize=8)
def _blocks(seq_len: int, side: int) -> BlockMaps:
    return BlockMaps(seq_len, side)


def head_map_blocks(seq_len: int, map_size: int = 0) -> BlockMaps:
    """The grid of the per-head maps at ``seq_len`` tokens: ``min(HEAD_MAP_MAX_SIDE, map_size or
    seq_len)`` blocks per axis asked for (``BlockMaps.n`` may be fewer; ``BlockMaps.f`` positions per
    block). One object per grid, shared (it caches its inverse block counts)."""
    return _blocks(int(seq_len), min(HEAD_MAP_MAX_SIDE, int(map_size) or int(seq_len)))


def add_head_rows(blocks: BlockMaps, dst: torch.Tensor, part: torch.Tensor, start: int) -> None:
    """Add rows ``start .. start + c - 1`` of every head's map (``part [H, c, nc]``, keys
    ``0 .. nc - 1``) to the block sums ``dst [H, n, n]``: :meth:`BlockMaps.add_rows` for all heads at
    once (with one-position blocks, the rows copied)."""
    if blocks.f == 1:
        dst[:, start:start + part.shape[1], :part.shape[2]].copy_(part)
    else:
        blocks.add_rows(dst, part, start)


class HeadMaps(BuiltinStatistic):
    name = "head_maps"
    selectable = False  # follows --heads all
    accumulators = ("head_maps",)
    needs = frozenset({"head_weight_sums"})

    def active(self, spec):
        return bool(getattr(spec, "head_maps", False))

    def shapes(self, spec):
        n = head_map_blocks(spec.seq_len, spec.map_size).n
        return {"head_maps": (len(spec.layers), spec.num_heads, n, n)}

    def begin_layer(self, batch, maps):
        n = head_map_blocks(maps.S, batch.capture.spec.map_size).n
        maps.zeros("head_maps", batch.query.shape[1], n, n)  # its own grid: not one of LayerMaps' S x S maps

    def add(self, batch, piece):
        blocks = head_map_blocks(batch.maps.S, batch.capture.spec.map_size)
        add_head_rows(blocks, batch.maps["head_maps"], piece["head_weight_sums"], piece.rows.start)

    def end_layer(self, batch: LayerBatch, maps):
        cap = batch.capture
        blocks = head_map_blocks(maps.S, cap.spec.map_size)
        m = maps["head_maps"]
        if blocks.f > 1:  # block sums -> means over each block's visible entries (one-position blocks: as they are)
            m.mul_(blocks.inverse_counts(batch.causal, batch.window, m.device))
        cap.work.add64(cap.accs["head_maps"].sum[batch.li], m)


STATISTIC = HeadMaps()
