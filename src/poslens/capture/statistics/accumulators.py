"""Streaming, mergeable statistics (sum + count + state), in the spirit of running-stats objects.

Every tensor poslens reports is a mean over many sequences (and often heads). Accumulators hold
float64 sums so that 10^5..10^7 additions lose no precision; they can be merged (two shards of
the same run), saved and loaded (resumable runs), and all-reduced across torch.distributed ranks.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

# the noise tests on group sums are metrics (pure functions of tensors); scans and simulations fill the groups


def symmetric_from_lower(t: torch.Tensor) -> torch.Tensor:
    """The tensor, symmetric in its last two dimensions, whose lower triangle (diagonal included) is
    ``t``'s; ``t``'s strict upper triangle is not read."""
    low = t.tril()
    return low + low.tril(-1).transpose(-1, -2)


class MeanAccumulator:
    """Running mean of a fixed-shape tensor, optionally with per-entry variance.

    ``add(batch_sum, count, batch_sumsq)`` takes pre-reduced sums so callers can reduce over
    batch and heads with one matrix product; ``add_samples(x)`` reduces ``x`` over dim 0.

    ``lower``: the tensor is symmetric in its last two dimensions and only the lower triangle of
    the sums (diagonal included) counts; whatever the strict upper triangle holds is ignored, and
    every read (:meth:`sum_at`, :meth:`mean_at`, :meth:`release_mean`) mirrors the lower triangle
    into it. A symmetric product then needs to be formed and added only once per pair.
    """

    def __init__(self, shape: Iterable[int], *, with_var: bool = False, lower: bool = False,
                 device: str | torch.device = "cpu"):
        if lower and (with_var or len(tuple(shape)) < 2):
            raise ValueError("a lower-triangle accumulator holds matrices and no variance")
        self.shape = tuple(int(s) for s in shape)
        self.with_var = with_var
        self.lower = lower
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
        if other.shape != self.shape or other.with_var != self.with_var or other.lower != self.lower:
            raise ValueError("cannot merge accumulators of different shape or kind")
        self.add(other.sum, other.count, other.sumsq)
        return self

    # -- reading ----------------------------------------------------------------------------
    @property
    def mean(self) -> torch.Tensor:
        return self.mean_at(slice(None))

    def sum_at(self, index) -> torch.Tensor:
        """``sum[index]`` as the sums read (the lower triangle mirrored for a ``lower`` accumulator;
        index its leading dimensions only)."""
        part = self.sum[index]
        return symmetric_from_lower(part) if self.lower else part

    def mean_at(self, index) -> torch.Tensor:
        """``mean[index]`` without computing the whole mean (NaN before anything was added)."""
        part = self.sum_at(index)
        return part / self.count if self.count else torch.full_like(part, float("nan"))

    def mean_on(self, index, positions: torch.Tensor | None, matrix: bool) -> torch.Tensor:
        """``mean[index]`` on ``positions`` (increasing) of its last dimension, and of the one before
        where ``matrix``, the whole of it for None: the same values as ``mean_at(index)`` indexed so,
        with only those entries mirrored and divided."""
        part = self.sum[index]
        if positions is not None:
            p = positions.to(part.device)
            part = part[..., p, :][..., p] if matrix else part[..., p]
        part = symmetric_from_lower(part) if self.lower else part
        return part / self.count if self.count else torch.full_like(part, float("nan"))

    def release_mean(self, dtype=torch.float32) -> torch.Tensor:
        """The mean in ``dtype``, computed in place of the float64 sums, which are freed: the
        accumulator is empty afterwards. Peak memory stays at the sums' size (plus one matrix)."""
        if self.count == 0:
            out = self.mean.to(dtype)
        else:
            out = self.sum.div_(self.count).to(dtype)
            if self.lower:  # mirrored after the rounding, which it commutes with: half the bytes moved
                for mat in out.view(-1, *out.shape[-2:]):
                    mat.copy_(symmetric_from_lower(mat))
        self.sum, self.count = torch.zeros(0, dtype=torch.float64, device=self.sum.device), 0
        return out

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
        count = torch.tensor([self.count], dtype=torch.int64, device="cpu")
        out = {f"{prefix}sum": self.sum, f"{prefix}count": count}
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


# --------------------------------------------------------------------------------------------
# group sums: a noise floor that holds for correlated entries
# --------------------------------------------------------------------------------------------
#: independent groups of samples kept per run (simulations and scans); the sign-flip test
#: (:func:`poslens.metrics.noise.signflip_pvalue`) resolves p-values down to 2 / 2^G.
NOISE_GROUPS = 16

class GroupAccumulator:
    """Sums of a fixed-shape tensor in ``G`` independent groups of samples, with per-group counts.

    Samples are assigned to groups by the caller (a simulation by contiguous sample ranges, a scan
    by batch index modulo G). The spread of the group means gives standard errors and null
    distributions that hold whatever the correlation *between entries* of one sample (a shared
    input component correlates every entry of a score map); only independence *between groups* is
    assumed. Same verbs as :class:`MeanAccumulator` (add, merge, state_dict, all_reduce).
    """

    def __init__(self, groups: int, shape: Iterable[int], *, device: str | torch.device = "cpu"):
        self.groups = int(groups)
        self.shape = tuple(int(s) for s in shape)
        self.sum = torch.zeros((self.groups,) + self.shape, dtype=torch.float64, device=device)
        self.counts = torch.zeros(self.groups, dtype=torch.int64, device="cpu")  # host-side: read as ints

    def add(self, group: int, batch_sum: torch.Tensor, count: int) -> None:
        self.sum[group] += batch_sum.to(self.sum.device, torch.float64)
        self.counts[group] += int(count)

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def merge(self, other: "GroupAccumulator") -> "GroupAccumulator":
        if other.shape != self.shape or other.groups != self.groups:
            raise ValueError("cannot merge group accumulators of different shape or group count")
        self.sum += other.sum.to(self.sum.device)
        self.counts += other.counts
        return self

    @property
    def mean(self) -> torch.Tensor:
        """The mean over every sample of every group (NaN before anything was added)."""
        n = self.count
        total = self.sum.sum(0)
        return total / n if n else torch.full_like(total, float("nan"))

    def group_means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(means [g, *shape], counts [g])`` of the non-empty groups only."""
        keep = self.counts > 0
        c = self.counts[keep].to(torch.float64)
        s = self.sum if bool(keep.all()) else self.sum[keep.to(self.sum.device)]  # no copy when none is empty
        return s / c.to(s.device).reshape((-1,) + (1,) * len(self.shape)), c

    def state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        return {f"{prefix}sum": self.sum, f"{prefix}counts": self.counts.clone()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], prefix: str = "", *, copy: bool = True) -> None:
        s = state[f"{prefix}sum"]
        if tuple(s.shape) != (self.groups,) + self.shape:
            raise ValueError(f"saved shape {tuple(s.shape)} differs from {(self.groups,) + self.shape}")
        t = s.to(self.sum.device, torch.float64)
        self.sum = t.clone() if copy and t is s else t
        self.counts = state[f"{prefix}counts"].to(torch.int64).cpu().clone()

    def all_reduce(self, group=None) -> None:
        import torch.distributed as dist

        dist.all_reduce(self.sum, group=group)
        n = self.counts.to(self.sum.device, torch.float64)
        dist.all_reduce(n, group=group)
        self.counts = n.round().to(torch.int64).cpu()


def noise_grid(S: int, max_positions: int) -> torch.Tensor:
    """Positions ``0, s, 2s, ...`` (CPU) (stride ``s = ceil(S / max_positions)``) of the group score maps:
    a constant stride keeps a Toeplitz map Toeplitz, so relativity is judged on the grid as on the map."""
    return torch.arange(0, S, -(-S // max(1, max_positions)), device="cpu")
