"""What a built-in statistic is, and what the capture hands it.

A statistic declares the intermediates it ``needs`` (:data:`poslens.capture.statistics.points.INTERMEDIATES`,
named as every capture point is); the attention pass
(:mod:`poslens.capture.backends.attnpass`) computes each of them once per layer, whichever backend runs it,
and hands them over in pieces (:class:`Piece`): chunks of query rows for the intermediates of the
attention weights, one piece per layer for the layer-wide ones. Per layer a statistic

- allocates its float32 sums (:meth:`BuiltinStatistic.begin_layer`, into :class:`LayerMaps`),
- fills them from each piece (:meth:`~BuiltinStatistic.add`),
- adds them to its float64 accumulators (:meth:`~BuiltinStatistic.end_layer`);

statistics of the residual stream (``resid_pre``, ``resid_post``) take :meth:`~BuiltinStatistic.add_hidden`
instead. Its sums live in
the capture's accumulators (:class:`poslens.capture.statistics.accumulators.AccumulatorSet`), so checkpoints, resume,
merges and the all-reduce treat every statistic alike; a statistic object holds no state and is
shared by every capture. It reaches the capture through public members only: ``accs``, ``spec``,
``work`` (:class:`poslens.capture.backends.sums.Workspace`), ``blocks``, ``grid``, ``seq_groups``,
``unrotate``, ``half_perm``, ``reservoir``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from poslens.capture.statistics.accumulators import MeanAccumulator
from poslens.capture.backends.sums import LayerMaps

@dataclass
class Piece:
    """A piece of one layer's intermediates: query rows ``rows`` of the sequences ``seqs`` (of the
    batch), keys ``0 .. keys - 1``; ``values`` by intermediate name."""

    rows: slice
    seqs: slice
    keys: int
    values: dict

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.values


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
    maps: LayerMaps | None = None  # the layer's float32 sums, while its attention pass runs
    sink_off: bool = False  # key 0 masked for the queries after it (an intervention of poslens ablate)
    _half: tuple | None = field(default=None, repr=False)
    _pre: tuple | None = field(default=None, repr=False)

    def half_layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, k)`` with their dimensions in the rotate-half pair layout (pair ``l`` = dims ``l``,
        ``l + r/2``): the same tensors for a rotate-half model, permuted once for an interleaved one."""
        if self._half is None:
            cap = self.capture
            if cap.spec.rope_layout == "interleaved":
                perm = cap.half_perm(self.q.shape[-1], self.q.device)
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
    """A built-in statistic: its name, the accumulators it fills and the intermediates it needs.

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
    needs: frozenset = frozenset()  # names of poslens.capture.statistics.points.INTERMEDIATES

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

    def reads_at(self, capture, layer: int) -> bool:
        """Whether it reads the attention of decoder layer ``layer`` (default: every captured layer)."""
        return True

    def begin_layer(self, batch: LayerBatch, maps: LayerMaps) -> None:
        """Allocate its float32 sums of the layer in ``maps`` (:meth:`LayerMaps.zeros`)."""

    def add(self, batch: LayerBatch, piece: Piece) -> None:
        """Add a piece of the layer's intermediates (those it needs) to its float32 sums
        (``batch.maps``), or for layer-wide intermediates straight to its accumulators."""

    def end_layer(self, batch: LayerBatch, maps: LayerMaps) -> None:
        """Add the layer's float32 sums to its float64 accumulators."""

    def add_hidden(self, capture, index: int, x: torch.Tensor) -> None:
        """Residual-stream vectors ``[B, S, d]``: index 0 the embeddings, ``m + 1`` the output of
        captured layer ``m`` (``needs`` holds ``"resid_pre"`` and ``"resid_post"``)."""
