"""Streaming, mergeable statistics (sum + count + state), in the spirit of running-stats objects.

Every tensor poslens reports is a mean over many sequences (and often heads). Accumulators hold
float64 sums so that 10^5..10^7 additions lose no precision; they can be merged (two shards of
the same run), saved and loaded (resumable runs), and all-reduced across torch.distributed ranks.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch


class MeanAccumulator:
    """Running mean of a fixed-shape tensor, optionally with per-entry variance.

    ``add(batch_sum, count, batch_sumsq)`` takes pre-reduced sums so callers can reduce over
    batch and heads with one matrix product; ``add_samples(x)`` reduces ``x`` over dim 0.
    """

    def __init__(self, shape: Iterable[int], *, with_var: bool = False, device: str | torch.device = "cpu"):
        self.shape = tuple(int(s) for s in shape)
        self.with_var = with_var
        self.sum = torch.zeros(self.shape, dtype=torch.float64, device=device)
        self.sumsq = torch.zeros(self.shape, dtype=torch.float64, device=device) if with_var else None
        self.count = 0

    # -- adding -----------------------------------------------------------------------------
    def add(self, batch_sum: torch.Tensor, count: int, batch_sumsq: torch.Tensor | None = None) -> None:
        self.sum += batch_sum.to(self.sum.device, torch.float64)
        if self.with_var:
            if batch_sumsq is None:
                raise ValueError("this accumulator tracks variance: pass batch_sumsq")
            self.sumsq += batch_sumsq.to(self.sum.device, torch.float64)
        self.count += int(count)

    def add_samples(self, x: torch.Tensor) -> None:
        """Add ``x`` of shape ``[n, *shape]``; sums are taken in float64."""
        x64 = x.to(torch.float64)
        self.add(x64.sum(0), x.shape[0], (x64 * x64).sum(0) if self.with_var else None)

    def merge(self, other: "MeanAccumulator") -> "MeanAccumulator":
        if other.shape != self.shape or other.with_var != self.with_var:
            raise ValueError("cannot merge accumulators of different shape or kind")
        self.add(other.sum, other.count, other.sumsq)
        return self

    # -- reading ----------------------------------------------------------------------------
    @property
    def mean(self) -> torch.Tensor:
        return self.mean_at(slice(None))

    def mean_at(self, index) -> torch.Tensor:
        """``mean[index]`` without computing the whole mean (NaN before anything was added)."""
        part = self.sum[index]
        return part / self.count if self.count else torch.full_like(part, float("nan"))

    @property
    def var(self) -> torch.Tensor:
        """Unbiased per-entry sample variance."""
        if not self.with_var:
            raise ValueError("this accumulator does not track variance")
        n = self.count
        if n < 2:
            return torch.full(self.shape, float("nan"), dtype=torch.float64, device=self.sum.device)
        mean = self.sum / n
        return ((self.sumsq - n * mean * mean) / (n - 1)).clamp_min(0.0)

    @property
    def stderr(self) -> torch.Tensor:
        """Standard error of the mean, per entry."""
        return (self.var / max(self.count, 1)).sqrt()

    # -- persistence / distribution ---------------------------------------------------------
    def state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        out = {f"{prefix}sum": self.sum, f"{prefix}count": torch.tensor([self.count], dtype=torch.int64)}
        if self.with_var:
            out[f"{prefix}sumsq"] = self.sumsq
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor], prefix: str = "", *, copy: bool = True) -> None:
        """Load sums and count; ``copy=False`` adopts the given tensors (when they are already float64
        on this device) instead of copying them, for a state freshly read from a file."""
        s = state[f"{prefix}sum"]
        if tuple(s.shape) != self.shape:
            raise ValueError(f"saved shape {tuple(s.shape)} differs from {self.shape}")

        def own(t):
            t2 = t.to(self.sum.device, torch.float64)
            return t2.clone() if copy and t2 is t else t2

        self.sum = own(s)
        self.count = int(state[f"{prefix}count"].item())
        if self.with_var:
            self.sumsq = own(state[f"{prefix}sumsq"])

    def all_reduce(self, group=None) -> None:
        """Sum this accumulator over all ranks of a torch.distributed process group, in place."""
        import torch.distributed as dist

        dist.all_reduce(self.sum, group=group)
        if self.with_var:
            dist.all_reduce(self.sumsq, group=group)
        n = torch.tensor([self.count], dtype=torch.float64, device=self.sum.device)
        dist.all_reduce(n, group=group)
        self.count = int(n.item())


class AccumulatorSet(dict):
    """Named accumulators saved together in one safetensors file (``name.sum``, ``name.count``...)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, acc in self.items():
            out.update(acc.state_dict(prefix=f"{name}."))
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor], *, copy: bool = True) -> None:
        for name, acc in self.items():
            acc.load_state_dict(state, prefix=f"{name}.", copy=copy)

    def merge(self, other: "AccumulatorSet") -> "AccumulatorSet":
        for name, acc in self.items():
            acc.merge(other[name])
        return self

    def all_reduce(self, group=None) -> None:
        for acc in self.values():
            acc.all_reduce(group)
