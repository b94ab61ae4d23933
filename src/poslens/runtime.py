"""Runtime settings shared by the library and the CLI: which device, which dtype, how many CPU
threads, and process-wide switches (Hugging Face progress bars) set for one block and restored after it.

Threads. torch runs each CPU operation on an OpenMP pool of ``torch.get_num_threads()`` threads
that meet at a barrier when the operation ends. By default a thread that arrives first *spins*
there (GNU OpenMP: up to ~300,000 polls) instead of sleeping. On an idle machine that saves a
wake-up; when another busy process shares the cores, the spinning thread burns the core that the
thread it waits for needs, and every operation waits for a scheduler time slice: beside one
competing busy process a run becomes many times slower than the 1.5-2x its share of the CPU
predicts (``benchmarks/bench_threads.py``).

The policy (:func:`configure_process`, :func:`default_threads`):

- ``OMP_WAIT_POLICY=PASSIVE`` (unless the user set it): waiting threads sleep. OpenMP reads it
  once, when torch is imported, so the CLI sets it before importing torch; a library user who
  imported torch first keeps torch's behaviour.
- threads = the CPUs this process may run on (``os.sched_getaffinity``) minus the busy threads of
  other processes seen on them now (:func:`busy_elsewhere`), at least 1: a thread that would
  only share a core with a busy process costs more in waiting than it adds.
- ``--threads N`` on every command that computes overrides the policy.

Work that splits into independent pieces (the simulator's chunks) runs them on separate threads,
each single-threaded inside torch (:func:`set_threads` ``(1)``): no barrier at all.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from poslens.errors import PoslensError

if TYPE_CHECKING:  # annotations only: torch is imported where a function needs it (CLI start-up)
    import torch


def cache_root() -> Path:
    """``$POSLENS_CACHE`` or ``~/.cache/poslens``: downloaded models, dequantised copies, built kernels."""
    env = os.environ.get("POSLENS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "poslens"


#: environment variable naming the device ``--device auto`` resolves to (see :func:`parse_device`)
DEVICE_ENV = "POSLENS_DEVICE"


def parse_device(device: str) -> str:
    """Resolve ``auto|cpu|cuda`` into a torch device string, with a clear error if CUDA is absent.

    ``auto`` is CUDA when a GPU is visible, else the CPU; the environment variable ``POSLENS_DEVICE``
    (``cpu``, ``cuda``, ``cuda:N``) replaces that choice, e.g. to keep a shared GPU free."""
    import torch

    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise PoslensError(f"--device {device!r} is not one of auto, cpu, cuda.")
    if device == "auto":
        env = os.environ.get(DEVICE_ENV, "auto").strip() or "auto"
        if env != "auto":
            if env not in ("cpu", "cuda") and not env.startswith("cuda:"):
                raise PoslensError(f"{DEVICE_ENV}={env!r} is not one of auto, cpu, cuda, cuda:N; unset it or fix it.")
            return parse_device(env)
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PoslensError(f"--device {device}: no CUDA GPU is visible; use --device cpu or auto.")
    return device


def resolve_dtype(dtype: str, device: str, config) -> "torch.dtype":
    """``auto|bf16|fp16|fp32`` -> torch dtype; ``auto`` is the checkpoint's half dtype on CUDA, fp32 on CPU."""
    import torch

    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}
    if dtype in names:
        return names[dtype]
    if dtype != "auto":
        raise PoslensError(f"--dtype {dtype!r} is not one of auto, bf16, fp16, fp32.")
    if device.startswith("cuda"):
        d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(d, str):
            d = names.get(d.replace("torch.", ""), None)
        return d if isinstance(d, torch.dtype) and d != torch.float32 else torch.bfloat16
    return torch.float32  # CPU: half-precision matmuls are slow and bring nothing


def torch_threads(n: int | None):
    """torch's intra-op thread count set to ``n`` inside the block, restored after; ``None``/0 leaves
    it unchanged (a library default: the policy of :func:`set_threads` is the CLI's)."""
    return set_threads(n) if n else contextlib.nullcontext()


@contextlib.contextmanager
def no_hf_progress_bars(active: bool = True) -> Iterator[None]:
    """Hugging Face's own progress bars (weight loading, saving) off inside the block when ``active``
    (e.g. ``--quiet``); the previous setting is restored after it."""
    if not active:
        yield
        return
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


# ------------------------------------------------------------------------------------------------
# CPU threads
# ------------------------------------------------------------------------------------------------
#: environment variable read by OpenMP at start-up; see the module docstring.
_WAIT_ENV = "OMP_WAIT_POLICY"


def configure_process() -> None:
    """Make OpenMP threads sleep rather than spin while they wait (call before importing torch).

    Does nothing when the user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` themselves, or when
    torch is already imported (the setting would not take effect).
    """
    if "torch" in sys.modules or _WAIT_ENV in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    os.environ[_WAIT_ENV] = "PASSIVE"


# ------------------------------------------------------------------------------------------------
# memory allocator
# ------------------------------------------------------------------------------------------------
#: glibc ``mallopt`` parameters (``malloc.h``)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
#: free memory kept at the top of the heap before glibc returns it to the kernel (mallopt takes an int)
KEEP_FREE_BYTES = 2**31 - 1
#: variables by which a user chose an allocator or its settings: the allocator is then left alone
_MALLOC_ENV_PREFIXES = ("MALLOC_",)
_PRELOADED_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
ALLOCATOR_ENV = "POSLENS_MALLOC"


def allocator_left_alone(environ=None) -> str | None:
    """Why :func:`configure_allocator` would leave the allocator alone (None: it would not)."""
    env = os.environ if environ is None else environ
    if env.get(ALLOCATOR_ENV, "").strip().lower() in ("system", "default", "off", "0"):
        return f"{ALLOCATOR_ENV}={env[ALLOCATOR_ENV]}"
    if any(k.startswith(_MALLOC_ENV_PREFIXES) for k in env):
        return "a MALLOC_* variable is set"
    if "malloc" in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets malloc"
    if any(a in env.get("LD_PRELOAD", "") for a in _PRELOADED_ALLOCATORS):
        return "another allocator is preloaded"
    if not sys.platform.startswith("linux"):
        return "not Linux"
    return None


def configure_allocator(environ=None) -> bool:
    """Keep freed memory in the process for reuse instead of handing it back to the kernel (glibc).

    glibc serves an allocation above its mmap threshold (128 KiB, rising to at most 32 MiB) with a
    fresh ``mmap`` and unmaps it on free, and trims free memory off the top of the heap: the next
    activation of the same size faults its pages in again, and the kernel zeroes every page: a large
    share of a plain forward's CPU time becomes ``sys``. With ``mmap`` off for the heap
    (``M_MMAP_MAX = 0``; a thread arena still maps what its heap cannot hold) and up to
    :data:`KEEP_FREE_BYTES` kept at the top, freed blocks are reused, and the ``sys`` time nearly
    vanishes (``benchmarks/bench_scan.py`` compares both settings); the price is a higher peak RSS.
    The memory freed is mostly kept until the process ends, so the CLI applies it (a command is a
    process), not the library.

    Does nothing (returns False) where :func:`allocator_left_alone` gives a reason: the user's own
    ``MALLOC_*``/``GLIBC_TUNABLES`` malloc settings or a preloaded allocator, ``POSLENS_MALLOC=system``,
    or no glibc ``mallopt``. Returns whether both settings took effect.
    """
    if allocator_left_alone(environ) is not None:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and others: no glibc mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) & bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREE_BYTES))


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def busy_elsewhere(samples: int = 3, interval: float = 0.005) -> float:
    """Busy threads of other processes on this process's CPUs right now.

    Linux: threads in state R (running or waiting for a CPU) whose last CPU is one this process
    may use, counted from ``/proc`` ``samples`` times ``interval`` seconds apart (median: a
    thread that runs for a millisecond is not a competitor). Elsewhere the 1-minute load average
    (which lags: a competitor started a minute ago counts about 63 %); 0 where neither is known.
    """
    cpus = _affinity()
    counts = []
    for k in range(samples):
        n = _runnable_others(cpus)
        if n is None:
            break
        counts.append(n)
        if k + 1 < samples:
            time.sleep(interval)
    if counts:
        return float(sorted(counts)[len(counts) // 2])
    try:
        return max(0.0, os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _runnable_others(cpus: set[int] | None, proc: str = "/proc") -> int | None:
    """Threads of other processes in state R last seen on one of ``cpus``; None without ``proc``."""
    me = os.getpid()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit() and int(p) != me]
    except OSError:
        return None
    n = 0
    for pid in pids:
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            continue  # exited meanwhile, or not ours to read
        for tid in tids:
            try:
                with open(f"{proc}/{pid}/task/{tid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()  # the name before ")" may hold spaces
            except (OSError, IndexError):
                continue
            # fields[0] is the state (stat field 3); fields[36] the CPU it last ran on (field 39)
            if fields and fields[0] == b"R" and (cpus is None or len(fields) < 37 or int(fields[36]) in cpus):
                n += 1
    return n


def default_threads(cpus: int | None = None, busy: float | None = None) -> int:
    """The thread policy: available CPUs minus the busy processes elsewhere (rounded), at least 1.

    ``cpus`` and ``busy`` default to :func:`available_cpus` and :func:`busy_elsewhere`.
    """
    cpus = available_cpus() if cpus is None else int(cpus)
    busy = busy_elsewhere() if busy is None else float(busy)
    return max(1, min(cpus, cpus - int(busy + 0.5)))


def max_threads() -> int:
    """The largest ``--threads`` count taken: four per CPU (and at least 64); more would only oversubscribe
    the machine, and a count beyond what the OpenMP runtime can make crashes it."""
    return max(64, 4 * (os.cpu_count() or 1))


def resolve_threads(threads: int | None, flag: str = "--threads") -> int:
    """``--threads`` value to a count: ``None`` or 0 = the policy; a negative count, or one above
    :func:`max_threads`, is an error (``flag`` names the option: ``threads=`` from Python)."""
    if threads is None or threads == 0:
        return default_threads()
    sep = "" if flag.endswith("=") else " "
    if threads < 0:
        raise PoslensError(f"{flag}{sep}{threads}: must be a positive count (or 0 for the default policy).")
    if threads > max_threads():
        raise PoslensError(f"{flag}{sep}{threads}: at most {max_threads()} threads ({os.cpu_count()} CPUs here); pass a "
                           "smaller count, or 0 for the default policy.")
    return int(threads)


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count for the rest of the process (``None``/0: the policy);
    returns it. For a command line; a library call should use :func:`set_threads`."""
    import torch

    n = resolve_threads(threads)
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


@contextlib.contextmanager
def set_threads(n: int | None) -> Iterator[int]:
    """Run the block with ``n`` torch intra-op threads (``None``/0: :func:`default_threads`), then
    restore the previous count. Yields the count in force."""
    import torch

    n = resolve_threads(n)
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield n
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Undo what the block draws from Python's global ``random`` generator: rich draws 24 bits from it when
    first imported (its style ids), and a library call of poslens leaves the caller's stream as it was."""
    import random

    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


@contextlib.contextmanager
def environ_kept() -> Iterator[None]:
    """Undo whatever the block adds to or changes in ``os.environ``: scikit-learn and threadpoolctl set
    ``KMP_DUPLICATE_LIB_OK`` when first imported, and a library call of poslens leaves the caller's
    environment as it was."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for k in [k for k in os.environ if k not in before]:
            del os.environ[k]
        for k, v in before.items():
            if os.environ.get(k) != v:
                os.environ[k] = v


@functools.lru_cache(maxsize=1)
def _blas_controller():
    """threadpoolctl's handle on the BLAS libraries numpy and scipy load (None without threadpoolctl).
    scipy's BLAS (its own OpenBLAS, which the CPU cosine Gram calls) is loaded first: the handle only
    knows the libraries loaded when it is made."""
    try:
        with environ_kept():
            from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    try:
        import scipy.linalg.blas  # noqa: F401
    except ImportError:
        pass
    return ThreadpoolController()


@contextlib.contextmanager
def numpy_blas_threads(n: int):
    """numpy's and scipy's BLAS on ``n`` threads while inside (their own pools otherwise take every
    CPU, beside torch's threads)."""
    ctl = _blas_controller()
    if ctl is None:
        yield
        return
    with ctl.limit(limits=max(1, int(n)), user_api="blas"):
        yield
