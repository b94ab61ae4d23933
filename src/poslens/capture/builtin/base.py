"""What a built-in statistic is, and what the capture hands it.

The capture loop (:class:`poslens.capture.attention.Capture`) computes each shared intermediate of
an attention layer once and routes it to the statistics that read it:

- ``add(batch)``: the layer's float32 post-RoPE queries and keys (:class:`LayerBatch`), for
  statistics that set ``reads_qk``;
- the chunked attention pass, for statistics that set ``reads_maps``: query-row chunks of the
  logits (before the mask: :meth:`BuiltinStatistic.chunk_logits`; after it:
  :meth:`~BuiltinStatistic.chunk_masked_logits`), of the visible logits summed over the batch and
  the heads (:meth:`~BuiltinStatistic.chunk_logit_sum`), of the softmax weights
  (:meth:`~BuiltinStatistic.chunk_weights`) and of each head's weights summed over the batch
  (:meth:`~BuiltinStatistic.chunk_head_weights`). On the CPU the logit sum, the softmax and the
  per-head sums come from one fused pass (:mod:`poslens.native`) when no statistic of the
  layer reads the logits or weights chunk by chunk. A statistic writes its float32 sums for the layer
  into ``run.out`` (allocated in :meth:`~BuiltinStatistic.begin_maps`), and
  :meth:`~BuiltinStatistic.add_maps` adds them to its float64 accumulators once the pass is done;
- ``add_hidden(cap, index, x)``: residual-stream vectors (``reads_hidden``);
- ``add_output(cap, li, out)``: the layer's attention output before the output projection
  (``reads_output``).

A statistic's sums live in the capture's accumulators (:class:`poslens.capture.stats.AccumulatorSet`),
so checkpoints, resume, merges and the all-reduce treat every statistic alike; a statistic object
itself holds no state and is shared by every capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from poslens.capture.stats import MeanAccumulator


@dataclass
class LayerBatch:
    """One attention layer's batch: what every statistic of the layer shares, computed once."""

    capture: Any  # the Capture: its accumulators, workspaces, RoPE tables and reservoir
    layer: int  # the model's decoder-layer index
    li: int  # its index among the captured layers (the accumulators' first dimension)
    q: torch.Tensor | None  # float32 contiguous post-RoPE queries [B, H, S, D], in the model's pair layout
    k: torch.Tensor | None  # float32 contiguous post-RoPE keys [B, Hk, S, D]
    scaling: float  # the layer's logit scale
    causal: bool
    window: int | None  # the sliding window, None when a query sees every earlier key
    softcap: float | None = None  # the logit soft cap (Gemma 2), None without one
    query: torch.Tensor | None = None  # the queries as the model handed them (its dtype and layout)
    key: torch.Tensor | None = None
    heads: list = field(default_factory=list)  # (per-head map index, head) of the layer's --heads maps
    _half: tuple | None = field(default=None, repr=False)
    _pre: tuple | None = field(default=None, repr=False)

    def half_layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, k)`` with their dimensions in the rotate-half pair layout (pair ``l`` = dims ``l``,
        ``l + r/2``): the same tensors for a rotate-half model, permuted once for an interleaved one."""
        if self._half is None:
            cap = self.capture
            if cap.spec.rope_layout == "interleaved":
                perm = cap._half_perm(self.q.shape[-1], self.q.device)
                self._half = (self.q.index_select(-1, perm), self.k.index_select(-1, perm))
            else:
                self._half = (self.q, self.k)
        return self._half

    def pre_rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's float32 queries and keys before RoPE (the model's pair layout), un-rotated once
        for every statistic that reads them; the post-RoPE ones in a layer without RoPE (or under the
        ``--no-rope-layers`` control, where attention already sees un-rotated ones)."""
        if self._pre is None:
            cap, spec = self.capture, self.capture.spec
            q = self.q if self.q is not None else self.query.to(torch.float32)
            k = self.k if self.k is not None else self.key.to(torch.float32)
            if self.layer in spec.rope_layers and self.layer not in spec.no_rope_layers:
                cap.use_layer_rope(self.layer)
                q, k = cap.unrotate(q, k)
            self._pre = (q, k)
        return self._pre

    def pre_rope_computed(self) -> bool:
        return self._pre is not None


class BuiltinStatistic:
    """A built-in statistic: its name, the accumulators it fills and the intermediates it reads.

    ``name`` is its ``--stats`` name when ``selectable``; a statistic that is not selectable is
    brought along by the selectable ones that name it in ``requires`` (or, like the per-head maps,
    follows another option: override :meth:`active`).
    """

    name: str = ""
    selectable: bool = True  # a --stats name of its own
    requires: tuple[str, ...] = ()  # names of the non-selectable statistics it brings along
    accumulators: tuple[str, ...] = ()  # the names it fills (the maps.safetensors names)
    with_var: tuple[str, ...] = ()  # accumulators that also keep a sum of squares (per-sequence values)
    lower: tuple[str, ...] = ()  # symmetric accumulators summed in their lower triangle only
    reads_qk: bool = False  # add(batch): the layer's float32 post-RoPE q/k
    #: what it reads of the chunked attention pass: "logits", "masked_logits", "logit_sum", "weights",
    #: "head_weights"
    reads_maps: frozenset = frozenset()
    reads_hidden: bool = False  # add_hidden: residual-stream vectors
    reads_output: bool = False  # add_output: the layer's attention output before the output projection

    def active(self, spec) -> bool:
        """Whether a scan with this spec computes it (a non-selectable one: also when required)."""
        return self.name in spec.stats

    def shapes(self, spec) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the mean accumulators it fills (the ``maps.safetensors`` names)."""
        raise NotImplementedError

    def make_accumulators(self, spec, device) -> dict:
        """Its accumulators, zeroed (float64 sums, counted in sequences)."""
        return {k: MeanAccumulator(s, device=device, with_var=k in self.with_var, lower=k in self.lower)
                for k, s in self.shapes(spec).items()}

    def maps_at(self, capture, layer: int) -> bool:
        """Whether it reads the chunked attention pass at ``layer`` (with ``reads_maps``)."""
        return bool(self.reads_maps)

    # -- q/k ---------------------------------------------------------------------------------
    def add(self, batch: LayerBatch) -> None:
        """Add one layer's batch from its float32 q/k (``reads_qk``)."""

    # -- the chunked attention pass ---------------------------------------------------------
    def begin_maps(self, capture, run, zeros) -> None:
        """Allocate its float32 sums for one layer in ``run.out``: ``zeros(name, *shape)`` gives a
        zeroed (reused, on the CPU) buffer."""

    def chunk_logits(self, capture, run, logits: torch.Tensor, start: int, allowed) -> None:
        """A chunk's logits ``[b, H, c, nc]`` (rows ``start .. start + c - 1`` of a slice of the batch,
        keys ``0 .. nc - 1``), before the mask; ``allowed`` is the chunk's ``[c, nc]`` sliding-window
        mask or None. Read only: the capture masks them in place afterwards."""

    def chunk_masked_logits(self, capture, run, logits: torch.Tensor, start: int) -> None:
        """The chunk's logits after the mask (``-inf`` where a query does not see the key)."""

    def chunk_logit_sum(self, capture, run, block_sum: torch.Tensor, start: int) -> None:
        """The chunk's logits summed over the slice's sequences and the heads, ``[c, nc]``: visible
        entries only, 0 where a query does not see the key (all finite: a non-finite visible logit
        stops the pass first, naming its head). Read only; valid until the next chunk."""

    def chunk_weights(self, capture, run, p: torch.Tensor, start: int) -> None:
        """The chunk's softmax weights ``[b, H, c, nc]``."""

    def chunk_head_weights(self, capture, run, pb: torch.Tensor, start: int) -> None:
        """Each head's weights of the chunk summed over the whole batch, ``pb [H, c, nc]`` (a view of
        ``run.zbuf``, whose first ``run.rows`` columns are zeros: see
        :func:`poslens.capture.builtin.slash.slash_view`)."""

    def add_maps(self, capture, batch: LayerBatch, maps: dict) -> None:
        """Add the layer's float32 sums (``maps``: what :meth:`begin_maps` allocated, filled) to its
        float64 accumulators."""

    # -- residual stream and attention output -------------------------------------------------
    def add_hidden(self, capture, index: int, x: torch.Tensor) -> None:
        """Residual-stream vectors ``[B, S, d]``: index 0 the embeddings, ``m + 1`` the output of
        captured layer ``m`` (``reads_hidden``)."""

    def add_output(self, capture, li: int, out: torch.Tensor) -> None:
        """The layer's attention output ``[B, H, S, D]`` before the output projection (``reads_output``)."""
