"""Fused CPU kernels of the capture, in C, built on this machine at first use.

The capture's chunked attention pass on the CPU is a handful of memory passes over each chunk of
logits (their sum, the softmax, the per-head sums of the weights). ``softmax_sums.c`` does them in
one pass per row. It is compiled once per source, compiler and CPU with the system C compiler
(``$CC``, else ``cc``) into ``$POSLENS_CACHE/native`` (default ``~/.cache/poslens/native``) and
loaded with :mod:`ctypes`. Without a compiler, or with ``POSLENS_CAPTURE_KERNEL=torch``, the capture
runs its torch path, which computes the same numbers (to float32 rounding) more slowly.

Nothing here runs at import: :func:`softmax_sums` builds or loads the library on its first call.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("softmax_sums.c")
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fPIC", "-shared", "-std=gnu99") + (
    ("-mprefer-vector-width=512",) if platform.machine() in ("x86_64", "AMD64") else ())
#: environment variable that forces the torch path (as for the fused CUDA kernels)
KERNEL_ENV = "POSLENS_CAPTURE_KERNEL"

_lock = threading.Lock()
_state: dict = {}


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (``/proc/cpuinfo``), else the platform."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() + platform.machine()
    keep = [line for line in text.splitlines() if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(sorted(set(keep)))


def library_path(cc: str) -> Path:
    """The cached library for this source, compiler, flags and CPU."""
    from poslens.capture.model_source import cache_root

    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), cc.encode(), " ".join(FLAGS).encode(), _cpu_signature().encode(),
                 platform.machine().encode()):
        h.update(part)
        h.update(b"\0")
    return cache_root() / "native" / f"softmax_sums-{h.hexdigest()[:16]}.so"


def _build(cc: str, target: Path) -> None:
    """Compile into a temporary file beside ``target`` and rename it into place (atomic: processes
    building at once, such as torchrun's ranks, each install a whole library)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise OSError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load():
    """The kernel function, or None (with the reason in :func:`status`)."""
    if "fn" in _state:
        return _state["fn"]
    with _lock:
        if "fn" in _state:
            return _state["fn"]
        fn, why = None, None
        cc = _compiler()
        if cc is None:
            why = "no C compiler (set CC, or install one)"
        else:
            try:
                path = library_path(cc)
                if not path.exists():
                    _build(cc, path)
                lib = ctypes.CDLL(str(path))
                fn = lib.poslens_softmax_sums
                i64, f32p = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
                fn.argtypes = [f32p, i64, i64, i64, i64, i64, ctypes.c_int32, i64, i64, f32p, f32p, i64, i64,
                               ctypes.c_int32]
                fn.restype = i64
            except (OSError, subprocess.SubprocessError) as e:
                fn, why = None, f"{type(e).__name__}: {e}"
        _state.update(fn=fn, why=why)
        return fn


def available() -> bool:
    """Whether the fused CPU kernel is in use (built or loadable here, not switched off)."""
    if os.environ.get(KERNEL_ENV, "auto") == "torch":
        return False
    return _load() is not None


def status() -> str:
    """One line: the kernel in use, or why the capture takes its torch path."""
    if os.environ.get(KERNEL_ENV, "auto") == "torch":
        return f"torch path ({KERNEL_ENV}=torch)"
    _load()
    return "fused C kernel" if _state.get("fn") else f"torch path ({_state.get('why')})"


def _ptr(t: torch.Tensor | None):
    return None if t is None else ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_float))


class SoftmaxSums:
    """The fused pass over chunks of one capture; splits each chunk's rows over ``threads`` threads
    (ctypes releases the GIL during the call). Owns its thread pool: :meth:`close` ends it."""

    def __init__(self):
        self._fn = _load()
        self._pool = None
        self._threads = 1

    def _workers(self, threads: int):
        if threads != self._threads:
            self.close()
            self._threads = threads
        if threads > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="poslens-softmax")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __call__(self, logits: torch.Tensor, start: int, causal: bool, logit_sum: torch.Tensor | None,
                 head_sum: torch.Tensor | None, accumulate: bool, threads: int = 1) -> int:
        """Fused pass over ``logits [n, H, c, nc]`` (float32, contiguous, CPU; the softmax in place):
        ``logit_sum [c, nc]`` (contiguous) written, ``head_sum [H, c, nc]`` (unit column stride)
        written or added to. Returns the number of non-finite visible logits (0: the outputs hold)."""
        n, H, c, nc = logits.shape
        assert logits.is_contiguous() and logits.dtype == torch.float32
        assert logit_sum is None or (logit_sum.is_contiguous() and tuple(logit_sum.shape) == (c, nc))
        hs_h = hs_r = 0
        if head_sum is not None:
            assert tuple(head_sum.shape) == (H, c, nc) and head_sum.stride(2) == 1
            hs_h, hs_r = head_sum.stride(0), head_sum.stride(1)
        args = (_ptr(logits), n, H, c, nc, start, int(causal))
        tail = (_ptr(logit_sum), _ptr(head_sum), hs_h, hs_r, int(accumulate))
        pool = self._workers(max(1, min(threads, c)))
        if pool is None:
            return int(self._fn(*args, 0, c, *tail))
        # causal rows see start + r + 1 keys: cut the rows so each part holds about the same logits
        parts = self._threads
        edges = _balanced_rows(start, c, nc, causal, parts)
        futures = [pool.submit(self._fn, *args, r0, r1, *tail) for r0, r1 in zip(edges[1:-1], edges[2:])]
        bad = int(self._fn(*args, edges[0], edges[1], *tail))
        return bad + sum(int(f.result()) for f in futures)


def _balanced_rows(start: int, c: int, nc: int, causal: bool, parts: int) -> list[int]:
    """Row edges ``0 = e_0 <= ... <= e_parts = c`` splitting the chunk's visible logits evenly."""
    if not causal:
        return [c * i // parts for i in range(parts + 1)]
    counts = [min(nc, start + r + 1) for r in range(c)]
    total, edges, acc = sum(counts), [0], 0
    for r, k in enumerate(counts):
        acc += k
        while len(edges) < parts and acc >= total * len(edges) / parts:
            edges.append(r + 1)
    edges += [c] * (parts + 1 - len(edges))
    return edges
