"""A bounded, mergeable sample of pre-RoPE query and key vectors for the rank analysis.

Every token slot ``(sequence index, position)`` gets a random key that depends only on the scan's
seed and the slot itself; the reservoir keeps the ``R`` slots with the smallest keys (bottom-R
sampling: a uniform sample without replacement of all slots seen). Because the sample is a
function of the set of slots and not of the order they arrive in, a scan split into batches, cut
and resumed, or sharded over processes keeps exactly the same slots as one uninterrupted pass,
and merging two reservoirs is "keep the R smallest keys of both".

For each kept slot the reservoir stores, in every captured layer, the pre-RoPE query of every head
and the pre-RoPE key of every KV head (after q/k norm where the model has one): the tokens x
head_dim matrices whose singular values the slash paper's rank-one measures are about (arXiv
2601.08297). The exact second moments (``q_gram``/``k_gram``) give those singular values over
every token; the reservoir keeps the vectors themselves, for analyses that need directions and
phases rather than spectra.
"""

from __future__ import annotations

import torch

from poslens.errors import PoslensError

#: The reservoir's state tensors (saved, loaded and merged together).
_STATE = ("keys", "tokens", "q", "k")

#: Mixes the scan seed and a sequence index into one generator seed.
_SEED_MULT = 0x9E3779B97F4A7C15 & ((1 << 63) - 1)


def slot_keys(seed: int, seq_start: int, batch_size: int, seq_len: int) -> torch.Tensor:
    """Random keys ``[B * S]`` (float64 in [0, 1)) of the slots of sequences ``seq_start ..``, row-major.

    One generator per sequence, seeded from ``(seed, sequence index)``: the key of a slot does not
    depend on which batch or process the sequence falls in.
    """
    # on the host: a CPU generator per sequence gives the same keys on every device
    keys = torch.empty(batch_size, seq_len, dtype=torch.float64, device="cpu")
    for b in range(batch_size):
        g = torch.Generator().manual_seed((seed * _SEED_MULT + seq_start + b) % (1 << 63))
        keys[b] = torch.rand(seq_len, generator=g, dtype=torch.float64, device="cpu")
    return keys.reshape(-1)


class QKReservoir:
    """Bottom-R sample of token slots with their pre-RoPE q/k vectors in every captured layer.

    State (all saved and merged): ``keys [R]`` (float64, ``inf`` = empty slot), ``tokens [R, 2]``
    (sequence index, position; ``-1`` = empty), ``q [L, H, R, D]`` and ``k [L, Hk, R, D]`` (float32).
    Slots are kept sorted by key, so equal sets of slots give equal tensors.
    """

    def __init__(self, size: int, num_layers: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 seq_len: int, seed: int = 0, device="cpu"):
        if size < 1:
            raise PoslensError(f"reservoir size must be at least 1, got {size}.")
        self.size, self.seq_len, self.seed = int(size), int(seq_len), int(seed)
        self.device = torch.device(device)
        self.keys = torch.full((size,), float("inf"), dtype=torch.float64, device=device)
        self.tokens = torch.full((size, 2), -1, dtype=torch.int64, device=device)
        self.q = torch.zeros(num_layers, num_heads, size, head_dim, dtype=torch.float32, device=device)
        self.k = torch.zeros(num_layers, num_kv_heads, size, head_dim, dtype=torch.float32, device=device)
        self._plan: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._pending: set[int] = set()

    # -- one batch ---------------------------------------------------------------------------
    def begin_batch(self, seq_start: int, batch_size: int) -> None:
        """Decide which of this batch's slots enter (the same decision for every layer)."""
        S, R = self.seq_len, self.size
        new_keys = slot_keys(self.seed, seq_start, batch_size, S).to(self.device)
        both = torch.cat([self.keys, new_keys])
        order = torch.sort(both, stable=True).indices[:R]
        from_old = order < R
        old_idx = order[from_old]
        new_idx = order[~from_old] - R  # row-major slot index b * S + s within the batch
        seq = torch.arange(seq_start, seq_start + batch_size, device=self.device)
        new_tokens = torch.stack([seq.repeat_interleave(S), torch.arange(S, device=self.device).repeat(batch_size)], 1)
        self.keys = both[order]
        self.tokens = torch.cat([self.tokens, new_tokens])[order]
        self._plan = (from_old, old_idx, new_idx // S, new_idx % S)
        self._pending = set(range(self.q.shape[0]))

    def observe(self, li: int, q_pre: torch.Tensor, k_pre: torch.Tensor) -> None:
        """Apply the batch's decision to layer ``li``: ``q_pre [B, H, S, D]``, ``k_pre [B, Hk, S, D]``."""
        self._check(li)
        _, _, b_idx, s_idx = self._plan
        self.observe_new(li, q_pre[b_idx, :, s_idx].transpose(0, 1), k_pre[b_idx, :, s_idx].transpose(0, 1))

    def new_slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's slots that enter the reservoir, in slot order: (sequence in the batch, position)."""
        self._check(None)
        return self._plan[2], self._plan[3]

    def observe_new(self, li: int, q_new: torch.Tensor, k_new: torch.Tensor) -> None:
        """Apply the batch's decision to layer ``li`` given only the entering slots' vectors (those of
        :meth:`new_slots`, in that order): ``q_new [H, n, D]``, ``k_new [Hk, n, D]``."""
        self._check(li)
        from_old, old_idx, _, _ = self._plan
        for store, x in ((self.q, q_new), (self.k, k_new)):
            row = torch.empty_like(store[li])
            row[:, from_old] = store[li][:, old_idx]
            row[:, ~from_old] = x.to(device=store.device, dtype=store.dtype)
            store[li] = row
        self._pending.discard(li)

    def _check(self, li) -> None:
        """That a batch was begun (and, for a layer ``li``, that it is still to be observed)."""
        if self._plan is None or (li is not None and li not in self._pending):
            raise PoslensError("reservoir: observe() without begin_batch() for this batch; call "
                               "Capture.begin_batch(batch_size, seq_start) before each forward.")

    def end_batch(self) -> None:
        if self._pending:
            raise PoslensError(f"reservoir: layers {sorted(self._pending)} were not observed in this batch.")
        self._plan = None

    # -- results, state, merging ----------------------------------------------------------------
    @property
    def filled(self) -> int:
        return int((self.tokens[:, 0] >= 0).sum())

    def result(self) -> dict[str, torch.Tensor]:
        """The filled slots: ``q_reservoir``, ``k_reservoir`` and ``reservoir_tokens`` (sequence, position)."""
        n = self.filled
        return {"q_reservoir": self.q[:, :, :n].clone(), "k_reservoir": self.k[:, :, :n].clone(),
                "reservoir_tokens": self.tokens[:n].clone()}

    def state_dict(self, prefix: str = "reservoir.") -> dict[str, torch.Tensor]:
        return {f"{prefix}{name}": getattr(self, name) for name in _STATE}

    def load_state_dict(self, state, prefix: str = "reservoir.") -> None:
        for name in _STATE:
            cur = getattr(self, name)
            got = state[f"{prefix}{name}"]
            if tuple(got.shape) != tuple(cur.shape):
                raise PoslensError(f"reservoir checkpoint {name} has shape {tuple(got.shape)}, expected "
                                   f"{tuple(cur.shape)}; resume with the original --reservoir.")
            setattr(self, name, got.to(device=cur.device, dtype=cur.dtype).clone())

    def merge(self, *others: "QKReservoir") -> "QKReservoir":
        """Keep the R smallest keys of this reservoir and ``others`` (ties: this one first, then in order)."""
        parts = [self, *others]
        self._keep_smallest(**{name: [getattr(p, name) for p in parts] for name in _STATE})
        return self

    def all_gather_merge(self, group=None) -> None:
        """Merge the reservoirs of every process (all end up with the merged one, ties in rank order)."""
        import torch.distributed as dist

        world = dist.get_world_size(group)
        gathered = {}
        for name in _STATE:
            t = getattr(self, name).contiguous()
            gathered[name] = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(gathered[name], t, group=group)
        self._keep_smallest(**gathered)

    def _keep_smallest(self, keys, tokens, q, k) -> None:
        """Set the state to the ``size`` slots with the smallest keys among the given parts (lists)."""
        dev = self.device
        all_keys = torch.cat([x.to(dev) for x in keys])
        order = torch.sort(all_keys, stable=True).indices[: self.size]
        self.keys = all_keys[order]
        self.tokens = torch.cat([x.to(dev) for x in tokens])[order]
        self.q = torch.cat([x.to(dev) for x in q], dim=2)[:, :, order].contiguous()
        self.k = torch.cat([x.to(dev) for x in k], dim=2)[:, :, order].contiguous()
