"""poslens's fused CPU kernels, in C, built on this machine at first use.

Some of a scan's work on the CPU is a handful of memory passes that torch runs one by one: the
chunked attention pass (the logit sum, the softmax, the per-head sums of the weights), the
per-dimension logit sums, the RoPE un-rotation, the APS count, the cosine maps' unit vectors, the
float64 accumulation of each map. ``kernels.c`` does each in one pass, over an index range, so
that :class:`Workers` can split a call over the torch threads. It is compiled once
per source, compiler and CPU with the system C compiler (``$CC``, else ``cc``) into
``$POSLENS_CACHE/native`` (default ``~/.cache/poslens/native``) and loaded with :mod:`ctypes`.
Without a compiler, or with ``POSLENS_CAPTURE_KERNEL=torch``, every caller takes its torch path,
which computes the same numbers (to float32 rounding) more slowly.

The cache is checked before it is loaded: each library has a record beside it (``kernels-*.json``:
its size and sha256, written once it was compiled and installed), and a library that does not
match its record (cut short, changed, half-written, another's) is rebuilt, never loaded; loading a
damaged shared library would kill the process (SIGBUS, SIGILL). A compiler that failed or timed out
is remembered beside it (``kernels-*.failed``, keyed like the library): later processes take the
torch path at once instead of compiling again (delete the file to try again). Temporary files of a
compilation that was killed are removed by the next process; libraries are installed mode 0755.

Nothing here runs at import: the library is built or loaded on the first call that needs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from poslens.errors import PoslensWarning
from poslens.runtime import cache_root

SOURCE = Path(__file__).with_name("kernels.c")
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
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), cc.encode(), " ".join(FLAGS).encode(), _cpu_signature().encode(),
                 platform.machine().encode()):
        h.update(part)
        h.update(b"\0")
    return cache_root() / "native" / f"kernels-{h.hexdigest()[:16]}.so"


#: seconds a compilation may take before it counts as failed
COMPILE_TIMEOUT = 120


def record_path(library: Path) -> Path:
    """The record of a cached library: its size and sha256 (JSON)."""
    return library.with_suffix(".json")


def failure_path(library: Path) -> Path:
    """Where a compiler's failure to build ``library`` is remembered."""
    return library.with_suffix(".failed")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _intact(path: Path) -> bool | None:
    """Whether the library at ``path`` is the one its record describes: None when there is no
    library, or no readable record (nothing to warn about: it is built again)."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    try:
        rec = json.loads(record_path(path).read_text())
    except (OSError, ValueError):
        return None
    return isinstance(rec, dict) and rec.get("size") == size and rec.get("sha256") == _sha256(path)


def _tidy(folder: Path) -> None:
    """Remove the temporary files of compilations whose process is gone (a SIGKILL mid-compile)."""
    from poslens.rundir.lock import pid_alive

    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for p in entries:
        m = _TMP_NAME.match(p.name)
        if m is None:
            continue
        pid = int(m.group(1)) if m.group(1) else None
        if pid is None or (pid != os.getpid() and not pid_alive(pid)):
            try:
                p.unlink()
            except OSError:
                pass


#: a compilation's temporary file: ``.kernels-<key>.<pid>.<random>.tmp`` (``tmp*.so``: an older naming)
_TMP_NAME = re.compile(r"^\.kernels-[0-9a-f]+\.(\d+)\.[^.]+\.tmp$|^tmp[^.]*\.so()$")


class CompileError(OSError):
    """The C compiler failed or timed out (remembered in :func:`failure_path`)."""


def _write_small(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _build(cc: str, target: Path) -> None:
    """Compile into a temporary file beside ``target`` and rename it into place (atomic: processes
    building at once, such as torchrun's ranks, each install a whole library), then write its record.
    A compiler that fails or times out raises :class:`CompileError`, remembered in
    :func:`failure_path`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        try:
            proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                                  timeout=COMPILE_TIMEOUT)
            why = None if proc.returncode == 0 else f"{cc} failed: {proc.stderr.strip()[-500:]}"
        except subprocess.TimeoutExpired:
            why = f"{cc} did not finish in {COMPILE_TIMEOUT} s"
        if why is not None:
            with contextlib.suppress(OSError):
                _write_small(failure_path(target), json.dumps({"compiler": cc, "error": why}) + "\n")
            raise CompileError(why)
        os.chmod(tmp, 0o755)  # readable and loadable by every user of a shared cache
        record = json.dumps({"size": os.path.getsize(tmp), "sha256": _sha256(Path(tmp)), "compiler": cc}) + "\n"
        os.replace(tmp, target)
        _write_small(record_path(target), record)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_I64, _F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
#: each kernel's argument types
SIGNATURES = {
    "poslens_softmax_sums": ([_F32P, _I64, _I64, _I64, _I64, _I64, ctypes.c_int32, _I64, _I64, _F32P, _F32P, _I64,
                              _I64, ctypes.c_int32], _I64),
    "poslens_causal_pair_dim_sum": ([_F32P, _F32P, _I64, _I64, _I64, _I64, _I64, _F32P, _I64, _I64], None),
    "poslens_rising_pairs": ([_F32P, _I64, _I64, ctypes.POINTER(ctypes.c_int64), _I64, _I64], None),
    "poslens_pair_counts": ([ctypes.POINTER(ctypes.c_double), _I64, _I64, ctypes.POINTER(ctypes.c_int64),
                             ctypes.POINTER(ctypes.c_int64), _I64, _I64], None),
    "poslens_merge_pair_counts": ([ctypes.POINTER(ctypes.c_double), _I64, _I64, ctypes.POINTER(ctypes.c_int64),
                                   ctypes.POINTER(ctypes.c_int64), _I64, _I64], _I64),
    "poslens_diagonal_rows": ([ctypes.POINTER(ctypes.c_double), _I64, _I64, _I64, ctypes.POINTER(ctypes.c_double)],
                              None),
    "poslens_diagonal_stats": ([ctypes.POINTER(ctypes.c_double), _I64, _I64, ctypes.POINTER(ctypes.c_uint8),
                                ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_uint8)], None),
    "poslens_unrotate_half": ([_F32P, _I64, _I64, _I64, _I64, _I64, _F32P, _F32P, _I64, _F32P, _I64, _I64], None),
    "poslens_unit_rows": ([_F32P, _I64, _I64, _I64, _I64, _I64, _F32P, _F32P, _I64, _I64], None),
    "poslens_add_widened": ([ctypes.POINTER(ctypes.c_double), _F32P, _I64, _I64, ctypes.c_double, ctypes.c_int32,
                             _I64, _I64], None),
}


def _load():
    """The loaded library, or None (with the reason in :func:`status`)."""
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        lib, why = None, None
        cc = _compiler()
        if cc is None:
            why = "no C compiler (set CC, or install one)"
        else:
            try:
                lib = _checked_library(cc)
                for name, (args, res) in SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = args, res
            except (OSError, AttributeError, subprocess.SubprocessError) as e:
                lib, why = None, str(e) if isinstance(e, CompileError) else f"{type(e).__name__}: {e}"
        _state.update(lib=lib, why=why)
        return lib


def _checked_library(cc: str):
    """The cached library for ``cc``, loaded only once it matches its record; a library that does not
    (cut short, changed, half-written) is built again first, with one warning."""
    path = library_path(cc)
    _tidy(path.parent)
    failed = failure_path(path)
    if failed.exists():
        try:
            why = json.loads(failed.read_text()).get("error")
        except (OSError, ValueError, AttributeError):
            why = None
        raise CompileError(f"{why or 'the compiler failed'} (remembered in {failed}; delete it to try again)")
    intact = _intact(path)
    if not intact:
        if intact is False:
            warnings.warn(f"the cached kernel library {path} does not match its record (damaged or changed); "
                          "building it again.", PoslensWarning, stacklevel=2)
        _build(cc, path)
        if not _intact(path):
            raise OSError(f"{path} does not match its record after building it (another process changing it?)")
    return ctypes.CDLL(str(path))


def available() -> bool:
    """Whether the fused CPU kernels are in use (built or loadable here, not switched off)."""
    if os.environ.get(KERNEL_ENV, "auto") == "torch":
        return False
    return _load() is not None


def status() -> str:
    """One line: the kernel in use, or why the capture takes its torch path."""
    if os.environ.get(KERNEL_ENV, "auto") == "torch":
        return f"torch path ({KERNEL_ENV}=torch)"
    _load()
    return "fused C kernels" if _state.get("lib") else f"torch path ({_state.get('why')})"


def _cpu(*tensors: torch.Tensor) -> bool:
    """Whether every tensor lives in CPU memory (the kernels read raw pointers)."""
    return all(t.device.type == "cpu" for t in tensors)


def _ptr(t: torch.Tensor | None):
    return None if t is None else ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_float))


class Workers:
    """Threads for the kernels of one owner (a capture): a call's index range is cut into one part
    per torch thread, and the parts run at once (ctypes releases the GIL during a call). The pool is
    made at first need and ends with the object (or :meth:`close`)."""

    def __init__(self):
        self._pool = None
        self._size = 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            self._size = 0

    def run(self, fn, head: tuple, edges: list[int], tail: tuple = ()) -> list:
        """``fn(*head, lo, hi, *tail)`` for each range ``[edges[i], edges[i + 1])`` (empty ones
        skipped); the first range on the calling thread. Returns the results in order."""
        parts = [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]
        if len(parts) <= 1:
            return [fn(*head, lo, hi, *tail) for lo, hi in parts]
        if self._size < len(parts) - 1:
            self.close()
            self._pool = ThreadPoolExecutor(len(parts) - 1, thread_name_prefix="poslens-native")
            self._size = len(parts) - 1
        futures = [self._pool.submit(fn, *head, lo, hi, *tail) for lo, hi in parts[1:]]
        first = fn(*head, *parts[0], *tail)
        return [first] + [f.result() for f in futures]


def _parts(n: int, workers: Workers | None) -> int:
    return max(1, min(n, torch.get_num_threads())) if workers is not None else 1


def _even(n: int, parts: int) -> list[int]:
    return [n * i // parts for i in range(parts + 1)]


class SoftmaxSums:
    """The fused pass over chunks of attention logits (``poslens_softmax_sums``), each chunk's rows
    split over the torch threads through ``workers``."""

    def __init__(self, workers: Workers | None = None):
        self._fn = _load().poslens_softmax_sums
        self._workers = workers if workers is not None else Workers()

    def __call__(self, logits: torch.Tensor, start: int, causal: bool, logit_sum: torch.Tensor | None,
                 head_sum: torch.Tensor | None, accumulate: bool, threads: int = 1) -> int:
        """Fused pass over ``logits [n, H, c, nc]`` (float32, contiguous, CPU; the softmax in place):
        ``logit_sum [c, nc]`` (contiguous) written, ``head_sum [H, c, nc]`` (unit column stride)
        written or added to; the rows on ``threads`` threads. Returns the number of non-finite
        visible logits (0: the outputs hold)."""
        n, H, c, nc = logits.shape
        assert logits.is_contiguous() and logits.dtype == torch.float32
        assert logit_sum is None or (logit_sum.is_contiguous() and tuple(logit_sum.shape) == (c, nc))
        hs_h = hs_r = 0
        if head_sum is not None:
            assert tuple(head_sum.shape) == (H, c, nc) and head_sum.stride(2) == 1
            hs_h, hs_r = head_sum.stride(0), head_sum.stride(1)
        head = (_ptr(logits), n, H, c, nc, start, int(causal))
        tail = (_ptr(logit_sum), _ptr(head_sum), hs_h, hs_r, int(accumulate))
        # causal rows see start + r + 1 keys: cut the rows so each part holds about the same logits
        edges = _balanced_rows(start, c, nc, causal, max(1, min(threads, c)))
        return sum(int(b) for b in self._workers.run(self._fn, head, edges, tail))


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


def causal_pair_dim_sum(qg: torch.Tensor, k: torch.Tensor, workers: Workers | None = None) -> torch.Tensor | None:
    """``sum_{j <= i} q[..., i, d] k[..., j, d]`` per dimension, ``[B, Hk, g, D]`` float32, from grouped
    queries ``qg [B, Hk, g, S, D]`` and keys ``k [B, Hk, S, D]`` (float32, CPU; the running sums in
    float64); None when the kernels are not available (the caller's torch path)."""
    B, Hk, g, S, D = qg.shape
    if not available() or not _cpu(qg, k) or qg.dtype != torch.float32 or k.dtype != torch.float32 or D > 1024:
        return None
    qg, k = qg.contiguous(), k.contiguous()
    out = torch.empty(B, Hk, g, D, dtype=torch.float32)
    workers = workers or Workers()
    workers.run(_load().poslens_causal_pair_dim_sum, (_ptr(qg), _ptr(k), B, Hk, g, S, D, _ptr(out)),
                _even(B * Hk, _parts(B * Hk, workers)))
    return out


#: longest maps :func:`rising_pairs` counts (its T^3 / 6 comparisons per map outgrow the O(T^2 log^2 T)
#: merge count of :mod:`poslens.metrics.neighborhood` beyond)
RISING_PAIRS_MAX_T = 512


def rising_pairs(m: torch.Tensor) -> torch.Tensor | None:
    """For maps ``m [N, T, T]`` (float32, CPU, finite below the diagonal): the number of triples
    ``j < k < i`` with ``m[i, k] > m[i, j]``, int64 ``[N]``; None when the kernels are not available
    or ``T`` is above :data:`RISING_PAIRS_MAX_T` (the caller's merge count)."""
    N, T, _ = m.shape
    if not available() or not _cpu(m) or m.dtype != torch.float32 or T > RISING_PAIRS_MAX_T:
        return None
    m = m.contiguous()
    out = torch.empty(N, dtype=torch.int64)
    _load().poslens_rising_pairs(_ptr(m), N, T, ctypes.cast(out.data_ptr(), ctypes.POINTER(ctypes.c_int64)), 0, N)
    return out


#: longest rows :func:`pair_counts` counts (its T^2 / 2 comparisons per row outgrow the one value sort
#: per row of :mod:`poslens.metrics.neighborhood` beyond about 700-1,000; ``benchmarks/bench_pair_counts.py``)
PAIR_COUNTS_MAX_T = 512


def pair_counts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For each row of ``x [N, T]`` (CPU, float, no NaN): the pairs ``j < k`` with ``x[k] > x[j]`` and
    the pairs of equal entries above ``-inf``, int64 ``[N]`` each; None when the kernels are not
    available or ``T`` is above :data:`PAIR_COUNTS_MAX_T` (the caller's sort count)."""
    if x.ndim != 2 or not available() or not _cpu(x) or not x.is_floating_point() or x.shape[1] > PAIR_COUNTS_MAX_T:
        return None
    N, T = x.shape
    x = x.detach().to(torch.float64).contiguous()  # float32 and narrower: exactly
    gt, eq = torch.empty(N, dtype=torch.int64), torch.empty(N, dtype=torch.int64)
    as_i64 = ctypes.POINTER(ctypes.c_int64)
    _load().poslens_pair_counts(ctypes.cast(x.data_ptr(), ctypes.POINTER(ctypes.c_double)), N, T,
                                ctypes.cast(gt.data_ptr(), as_i64), ctypes.cast(eq.data_ptr(), as_i64), 0, N)
    return gt, eq


def merge_pair_counts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`pair_counts` of rows of any length (``x [N, T]``, CPU, float, no NaN, ``-inf`` only as a
    suffix), each row counted by a merge sort in O(T log T); None when the kernels are not available."""
    if x.ndim != 2 or not available() or not _cpu(x) or not x.is_floating_point():
        return None
    N, T = x.shape
    x = x.detach().to(torch.float64).contiguous()  # float32 and narrower: exactly
    gt, eq = torch.empty(N, dtype=torch.int64), torch.empty(N, dtype=torch.int64)
    as_i64 = ctypes.POINTER(ctypes.c_int64)
    if _load().poslens_merge_pair_counts(ctypes.cast(x.data_ptr(), ctypes.POINTER(ctypes.c_double)), N, T,
                                         ctypes.cast(gt.data_ptr(), as_i64), ctypes.cast(eq.data_ptr(), as_i64),
                                         0, N) != 0:
        return None  # no scratch memory: the caller's sort count
    return gt, eq


def diagonal_rows(m: torch.Tensor, first: int) -> torch.Tensor | None:
    """The lower diagonals of maps ``m [B, S, S]`` (float64, CPU) as rows ``[B, S - first, S]``:
    ``out[b, k - first, t] = m[b, t + k, t]``, NaN past the map's end; None when the kernels are not
    available (:func:`poslens.metrics.diagonal.diagonal_rows` gathers them with torch)."""
    if m.ndim != 3 or not available() or not _cpu(m) or m.dtype != torch.float64:
        return None
    B, S = m.shape[0], m.shape[-1]
    m = m.contiguous()
    out = torch.empty(B, S - first, S, dtype=torch.float64)
    as_f64 = ctypes.POINTER(ctypes.c_double)
    _load().poslens_diagonal_rows(ctypes.cast(m.data_ptr(), as_f64), B, S, first, ctypes.cast(out.data_ptr(), as_f64))
    return out


def diagonal_stats(D: torch.Tensor, excluded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For each row of ``D [R, S]`` (float64, CPU, contiguous; changed in place), over its finite
    entries outside the columns where ``excluded [S]`` (bool): ``[R, 5]`` float64 of count, sum, sum of
    squares about the row's mean, least and greatest (``inf``, ``-inf`` without an entry), and which
    columns hold such an entry (bool ``[S]``); the row is left packed, its counted entries in column
    order at the front and ``-inf`` after them. None when the kernels are not available."""
    if D.ndim != 2 or not available() or not _cpu(D) or D.dtype != torch.float64 or not D.is_contiguous():
        return None
    R, S = D.shape
    out = torch.empty(R, 5, dtype=torch.float64)
    seen = torch.zeros(S, dtype=torch.uint8)
    ex = excluded.to(torch.uint8).contiguous()
    as_u8, as_f64 = ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(ctypes.c_double)
    _load().poslens_diagonal_stats(ctypes.cast(D.data_ptr(), as_f64), R, S, ctypes.cast(ex.data_ptr(), as_u8),
                                   ctypes.cast(out.data_ptr(), as_f64), ctypes.cast(seen.data_ptr(), as_u8))
    return out, seen.bool()


def unrotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  workers: Workers | None = None) -> torch.Tensor | None:
    """``x [B, H, S, D]`` rotated back by RoPE in the rotate-half layout, float32 ``[B, H, S, D]``, from
    ``cos``/``sin`` ``[Bc, 1, S, r]`` (``Bc`` 1 or ``B``, already divided by ``cos^2 + sin^2``): what
    :func:`poslens.capture.engine.attention.unrotate_qk` computes, in one pass; None when the kernels are not
    available or the inputs are not float32 on the CPU (the caller's torch path)."""
    B, H, S, D = x.shape
    r = cos.shape[-1]
    if (not available() or not _cpu(x, cos, sin) or x.dtype != torch.float32 or cos.dtype != torch.float32
            or cos.shape[0] not in (1, B) or r % 2 or r > D):
        return None
    x = x.contiguous()
    cos = cos.expand(cos.shape[0], 1, S, r).contiguous()
    sin = sin.expand(sin.shape[0], 1, S, r).contiguous()
    out = torch.empty(B, H, S, D, dtype=torch.float32)
    workers = workers or Workers()
    workers.run(_load().poslens_unrotate_half, (_ptr(x), B, H, S, D, r, _ptr(cos), _ptr(sin), cos.shape[0], _ptr(out)),
                _even(B * H, _parts(B * H, workers)))
    return out


def add_widened(dst: torch.Tensor, src: torch.Tensor, alpha: float = 1.0, lower: bool = False,
                workers: Workers | None = None) -> bool:
    """``dst += alpha * src`` for a float64 ``dst`` and a float32 ``src`` of one shape (contiguous, CPU),
    bit for bit as ``dst.add_(src, alpha=alpha)``, in one pass; ``lower``: the rows of the last two
    dimensions add their lower triangle (diagonal included) alone. False (nothing done) when the
    kernels are not available or the tensors do not qualify (the caller's torch path)."""
    if (not available() or not _cpu(dst, src) or dst.dtype != torch.float64 or src.dtype != torch.float32
            or dst.shape != src.shape or dst.ndim == 0 or not dst.is_contiguous() or not src.is_contiguous()):
        return False
    C = dst.shape[-1]
    R = dst.numel() // max(1, C)
    if lower and dst.ndim != 2:
        return False
    parts = _parts(R, workers) if R * C >= 2**16 else 1
    workers = workers or Workers()
    edges = _balanced_rows(0, R, C, True, parts) if lower else _even(R, parts)
    workers.run(_load().poslens_add_widened,
                (ctypes.cast(dst.data_ptr(), ctypes.POINTER(ctypes.c_double)), _ptr(src), R, C, float(alpha),
                 int(lower)), edges)
    return True


def unit_rows(x: torch.Tensor, out: torch.Tensor, workers: Workers | None = None) -> torch.Tensor | None:
    """For ``x [B, S, d]`` (float32, CPU, each row's ``d`` values contiguous): the unit vectors written
    sequence-major into ``out [S, B, d]`` (contiguous) and the norms returned, float32 ``[B, S]``
    (sums of squares in float64), in one read of ``x``; None when the kernels are not available or
    the tensors do not qualify (the caller's torch path)."""
    if (not available() or not _cpu(x, out) or x.dtype != torch.float32 or x.ndim != 3 or x.stride(2) != 1
            or out.dtype != torch.float32 or not out.is_contiguous()
            or tuple(out.shape) != (x.shape[1], x.shape[0], x.shape[2])):
        return None
    B, S, d = x.shape
    norms = torch.empty(B, S, dtype=torch.float32)
    workers = workers or Workers()
    workers.run(_load().poslens_unit_rows, (_ptr(x), B, S, d, x.stride(0), x.stride(1), _ptr(out), _ptr(norms)),
                _even(S, _parts(S, workers)))
    return norms
