"""Data-parallel scans over ``torch.distributed`` and models spread over several devices.

Launched by ``torchrun`` (``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` in the environment), a scan
gives every rank the batches ``b`` with ``b % world_size == rank`` of the same deterministic batch
partition a single process uses, so the union over ranks is exactly the single-process set and
every batch's contribution is computed once. The float64 accumulators are summed over ranks
with one all-reduce at the end (gloo on CPU, NCCL on CUDA); rank 0 alone writes the run
directory. Each rank checkpoints its own partial sums (``checkpoint.rank{r}.safetensors``), so a
job that lost a rank resumes with ``--resume`` and the same number of processes.

``--device-map auto`` loads the model with accelerate's device map; the accumulators stay on
one device (the first GPU of the map, else the CPU) and :class:`DeviceMapCapture` moves the
tensors each layer hands to the capture onto it.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
from dataclasses import dataclass

import torch

from poslens.capture.engine.capture import Capture
from poslens.errors import PoslensError, Resumable

#: seconds a collective may wait for a peer before failing (``POSLENS_DIST_TIMEOUT`` overrides)
DEFAULT_TIMEOUT_S = 600

#: test hook: ``"RANK:N"`` makes that rank SIGKILL itself after N of its batches (after their checkpoint)
DIE_HOOK_ENV = "POSLENS_TEST_DIE_AFTER_BATCHES"


@dataclass
class DistContext:
    """Where this process stands in a (possibly one-process) job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    owns_group: bool = False  # we initialised the process group (and destroy it at the end)
    step: int | None = None  # the lockstep batch step this rank last reached (see :meth:`reach`)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def label(self) -> str:
        return f"rank {self.rank}/{self.world_size} ({socket.gethostname()}, local rank {self.local_rank})"

    # -- collectives (no-ops in a one-process job) -------------------------------------------
    def _tensor(self, values, dtype, device):
        return torch.tensor(values, dtype=dtype, device=device)

    def collective_device(self, device: str) -> str:
        return device if self.backend == "nccl" else "cpu"

    def all_sum(self, values: list[float], device: str = "cpu", dtype=torch.float64) -> list:
        if not self.enabled:
            return list(values)
        import torch.distributed as dist

        t = self._tensor(values, dtype, self.collective_device(device))
        self.guard(lambda: dist.all_reduce(t))
        return t.cpu().tolist()

    def all_min(self, values: list[int], device: str = "cpu") -> list[int]:
        if not self.enabled:
            return list(values)
        import torch.distributed as dist

        t = self._tensor(values, torch.int64, self.collective_device(device))
        self.guard(lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN))
        return [int(v) for v in t.cpu().tolist()]

    def all_max(self, values: list[float], device: str = "cpu") -> list[float]:
        if not self.enabled:
            return list(values)
        import torch.distributed as dist

        t = self._tensor(values, torch.float64, self.collective_device(device))
        self.guard(lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX))
        return t.cpu().tolist()

    def all_ok(self, ok: bool, device: str = "cpu") -> bool:
        """True iff every rank passes ``ok=True`` (used so no rank waits on one that already failed)."""
        return bool(self.all_min([int(ok)], device)[0])

    def barrier(self, device: str = "cpu") -> None:
        self.all_min([1], device)

    # -- failure reporting ----------------------------------------------------------------------
    def _store(self):
        try:
            from torch.distributed import distributed_c10d

            return distributed_c10d._get_default_store()
        except Exception:
            return None

    def _key(self, rank: int) -> str:
        return f"poslens/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/reached/{rank}"

    def reach(self, step: int) -> None:
        """Record in the job's key-value store that this rank finished the work of ``step``; when a
        collective fails, the ranks that never got there are the ones that died or hung."""
        self.step = step
        if not self.enabled:
            return
        store = self._store()
        if store is not None:
            try:
                store.set(self._key(self.rank), str(step))
            except Exception:
                pass

    def missing_ranks(self) -> list[int] | None:
        """Ranks that did not reach this rank's current step (None when that cannot be told)."""
        store = self._store()
        if store is None or self.step is None:
            return None
        try:
            late = []
            for r in range(self.world_size):
                if r == self.rank:
                    continue
                k = self._key(r)
                if not store.check([k]) or int(store.get(k)) < self.step:
                    late.append(r)
            return late
        except Exception:
            return None

    def guard(self, fn):
        """Run a collective; a failure (a peer died, a timeout) becomes a one-line error naming the ranks."""
        try:
            return fn()
        except PoslensError:
            raise
        except Exception as e:  # torch.distributed.DistError and backend RuntimeErrors
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            late = self.missing_ranks()
            who = (f"rank {', '.join(map(str, late))} never reached batch step {self.step} (killed or hung)" if late
                   else "another rank died or timed out (torchrun's summary names it)")
            raise Resumable(
                f"{self.label}: lost the other ranks: {who}; collective error: {first[:160]}. The checkpoints in "
                f"--out are intact: rerun the same command with --resume and the same number of processes.") from None

    def shutdown(self) -> None:
        if self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:
                    pass
            self.owns_group = False


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        raise PoslensError(f"environment variable {name}={os.environ[name]!r} is not an integer.") from None


def detect() -> DistContext:
    """The job layout from torchrun's environment (one process when ``WORLD_SIZE`` is absent or 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # a caller's own process group
        return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                           local_rank=_env_int("LOCAL_RANK", 0), local_world_size=_env_int("LOCAL_WORLD_SIZE", 1),
                           backend=dist.get_backend(), owns_group=False)
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return DistContext()
    rank = _env_int("RANK", 0)
    return DistContext(rank=rank, world_size=world, local_rank=_env_int("LOCAL_RANK", 0),
                       local_world_size=_env_int("LOCAL_WORLD_SIZE", 1))


def resolve_device(ctx: DistContext, device: str) -> str:
    """The device of this rank: ``cuda:LOCAL_RANK`` for ``auto``/``cuda`` under a multi-process job."""
    if not ctx.enabled or not device.startswith("cuda"):
        return device
    if device == "cuda":
        n = torch.cuda.device_count()
        if ctx.local_rank >= n:
            raise PoslensError(f"{ctx.label}: local rank {ctx.local_rank} has no GPU (this node sees {n}); launch "
                               f"at most {n} processes per node (--nproc-per-node {n}).")
        return f"cuda:{ctx.local_rank}"
    return device


def init(ctx: DistContext, device: str) -> None:
    """Initialise the process group (NCCL for CUDA devices, gloo otherwise) unless one exists."""
    if not ctx.enabled or ctx.backend is not None:
        return
    import torch.distributed as dist

    if not dist.is_available():
        raise PoslensError("WORLD_SIZE > 1 but this torch build has no torch.distributed support.")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    timeout = datetime.timedelta(seconds=_env_int("POSLENS_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    try:
        kwargs = {"device_id": torch.device(device)} if backend == "nccl" else {}
        dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    except Exception as e:
        raise PoslensError(f"{ctx.label}: could not join the process group ({str(e).splitlines()[0][:200]}); "
                           "check torchrun's --rdzv-endpoint / --master-addr and that the port is reachable.") from None
    ctx.backend = backend
    ctx.owns_group = True


def shard(num_batches: int, rank: int, world_size: int) -> list[int]:
    """Batch indices of one rank: ``b % world_size == rank`` (disjoint; their union is every batch)."""
    return list(range(rank, num_batches, world_size))


def announce_sigterm(ctx: DistContext):
    """In a multi-process job, say on stderr which rank torchrun stopped (it sends SIGTERM to the
    survivors when a rank fails) before the previous handler runs; returns a function restoring it."""
    import threading

    if not ctx.enabled or threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        late = ctx.missing_ranks() if ctx.step is not None else None
        who = f"rank {', '.join(map(str, late))} had not reached batch step {ctx.step}; " if late else ""
        print(f"poslens: error: {ctx.label}: stopped by SIGTERM (torchrun stops the other ranks when one fails; "
              f"{who}its summary names the failed rank). The checkpoints in --out are intact: rerun with --resume "
              "and the same number of processes.", file=sys.stderr, flush=True)
        if callable(previous):
            previous(signum, frame)
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def checkpoint_name(rank: int) -> str:
    return f"checkpoint.rank{rank}.safetensors"


def die_hook(ctx: DistContext, batches_done: int) -> None:
    """Test-only: ``POSLENS_TEST_DIE_AFTER_BATCHES=RANK:N`` SIGKILLs that rank after N batches."""
    spec = os.environ.get(DIE_HOOK_ENV)
    if not spec:
        return
    r, _, n = spec.partition(":")
    if int(r) == ctx.rank and batches_done >= int(n):
        print(f"poslens: {ctx.label}: test hook {DIE_HOOK_ENV}={spec}: killing this rank", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# models over several devices
# --------------------------------------------------------------------------------------------
def main_device(model) -> str:
    """The device holding the accumulators for a device-mapped model: its first GPU, else the CPU."""
    dmap = getattr(model, "hf_device_map", None)
    if not dmap:  # everything fitted on one device: transformers placed it there without dispatch hooks
        return str(next(model.parameters()).device)
    for v in dmap.values():
        if isinstance(v, int):
            return f"cuda:{v}"
        if isinstance(v, str) and v.startswith(("cuda", "mps", "xpu")):
            return v
    return "cpu"


class DeviceMapCapture(Capture):
    """A :class:`Capture` for a model spread over devices: every tensor a layer hands to it is moved
    to the accumulators' device first (the accumulation itself is unchanged), and the rotary
    cos/sin follow the queries they un-rotate."""

    def __init__(self, spec, device="cpu"):
        super().__init__(spec, device=device)
        self.device = torch.device(device)

    def _here(self, x):
        if x is None or x.device == self.device:
            return x
        # device-to-device copies are ordered by CUDA streams; a copy into host memory must block
        return x.to(self.device, non_blocking=self.device.type == "cuda")

    def unrotate(self, query, key, batch=None):
        if self.rope_cos_sin is not None and self.rope_cos_sin[0].device != query.device:
            cos, sin = self.rope_cos_sin
            self.rope_cos_sin = (cos.to(query.device), sin.to(query.device))
        return super().unrotate(query, key, batch=batch)

    def observe_hidden(self, index, hidden):
        return super().observe_hidden(index, self._here(hidden))

    def computes_output(self, layer, query, key, window, softcap, *, sink_off: bool = False) -> bool:
        # the output must come back on the layer's own device: only where the layer and the sums share one
        return query.device == self.device and super().computes_output(layer, query, key, window, softcap,
                                                                         sink_off=sink_off)

    def observe_attention(self, layer, query, key, out, *args, **kwargs):
        return super().observe_attention(layer, self._here(query), self._here(key), self._here(out), *args, **kwargs)
