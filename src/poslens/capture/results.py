"""What a capture holds: its sums saved and loaded (checkpoints), merged across ranks, and their means."""

from __future__ import annotations

import torch

from poslens.capture.stats import GroupAccumulator
from poslens.errors import PoslensError


class CaptureSums:
    """The sums of a :class:`poslens.capture.engine.Capture` (``accs``, ``sequences``, ``reservoir``,
    ``users``): state, all-reduce and means."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every accumulated tensor (sums, counts, reservoir, the users' statistics' tensors under
        ``user.<i>.<n>``): what a checkpoint holds, with :meth:`state_metadata` beside it."""
        out = self.accs.state_dict()
        out["capture.sequences"] = torch.tensor([self.sequences], dtype=torch.int64, device="cpu")
        if self.reservoir is not None:
            out.update(self.reservoir.state_dict())
        out.update(self.users.state_dict())
        return out

    def state_metadata(self) -> dict:
        """What a checkpoint stores beside the tensors: the users' statistics' classes and state trees."""
        return self.users.state_metadata()

    def load_state_dict(self, state, *, copy: bool = True, metadata: dict | None = None) -> None:
        """Load a :meth:`state_dict` (and its :meth:`state_metadata`); ``copy=False`` adopts the tensors."""
        self.accs.load_state_dict(state, copy=copy)
        first = next(iter(self.accs.values()), None)
        self.sequences = int(state["capture.sequences"][0]) if "capture.sequences" in state else \
            (first.count if first is not None else 0)
        if self.reservoir is not None:
            if "reservoir.keys" not in state:
                raise PoslensError("the checkpoint has no q/k reservoir; resume with the original --reservoir.")
            self.reservoir.load_state_dict(state)
        self.users.load_state_dict(state, copy=copy, metadata=metadata)

    def all_reduce(self, group=None) -> None:
        """Sum the accumulators and merge the reservoirs and users' statistics of all processes."""
        import torch.distributed as dist

        self.accs.all_reduce(group)
        n = torch.tensor([float(self.sequences)], dtype=torch.float64,
                         device="cuda" if dist.get_backend(group) == "nccl" else "cpu")
        dist.all_reduce(n, group=group)
        self.sequences = int(n.item())
        if self.reservoir is not None:
            self.reservoir.all_gather_merge(group)
        self.users.all_reduce(group)

    def user_results(self, taken=()) -> dict[str, torch.Tensor]:
        """The users' statistics' named result tensors (on the CPU)."""
        return self.users.results(taken)

    def means(self) -> dict[str, torch.Tensor]:
        """Mean of every accumulator (float64); upper triangles of causal maps are left as computed."""
        return {name: acc.mean for name, acc in self.accs.items()}

    def release_means(self, dtype=torch.float32, group_means: dict | None = None) -> dict[str, torch.Tensor]:
        """Means in ``dtype``, converting and freeing the float64 sums one by one (peak memory stays at
        the sums' size). ``group_means``: a group accumulator's ``group_means()`` by name, where the
        caller has them already. The accumulators are empty afterwards: call this last."""
        out = {}
        for name, acc in self.accs.items():
            if isinstance(acc, GroupAccumulator):  # group means of the non-empty groups, and their counts
                out[name], counts = (group_means or {}).get(name) or acc.group_means()
                out[name] = out[name].to(dtype)
                out[name.replace("groups", "group_counts")] = counts.to(torch.int64)
                continue
            out[name] = acc.release_mean(dtype)
        return out
