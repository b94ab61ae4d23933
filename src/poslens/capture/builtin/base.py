"""What a built-in statistic is, and what the capture hands it for one attention layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LayerBatch:
    """One attention layer's batch, as the capture hands it to the built-in statistics: the
    intermediates every statistic shares, computed once."""

    capture: Any  # the Capture: its accumulators, workspaces, RoPE tables and reservoir
    layer: int  # the model's decoder-layer index
    li: int  # its index among the captured layers (the accumulators' first dimension)
    q: torch.Tensor  # float32 contiguous post-RoPE queries [B, H, S, D], in the model's pair layout
    k: torch.Tensor  # float32 contiguous post-RoPE keys [B, Hk, S, D]
    scaling: float  # the layer's logit scale
    causal: bool
    window: int | None  # the sliding window, None when a query sees every earlier key
    _half: tuple | None = field(default=None, repr=False)

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


class BuiltinStatistic:
    """A built-in statistic: its ``--stats`` name, the accumulators it fills and :meth:`add`."""

    name: str = ""
    accumulators: tuple[str, ...] = ()  # the names :meth:`shapes` gives shapes to

    def shapes(self, spec) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the accumulators it fills (the ``maps.safetensors`` names)."""
        raise NotImplementedError

    def add(self, batch: LayerBatch) -> None:
        """Add one layer's batch to the capture's accumulators (counts are the capture's business)."""
        raise NotImplementedError
