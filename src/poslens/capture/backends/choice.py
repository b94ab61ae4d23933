"""The backend seam: which code computes a layer's attention intermediates, chosen in one place, and
how large its chunks are.

Three backends provide the intermediates of :data:`poslens.capture.statistics.points.INTERMEDIATES`
(never statistics):

- ``torch``: the chunked pass in torch (:mod:`poslens.capture.backends.attnpass`), the readable path; it
  provides every intermediate on every device;
- ``native``: the same chunks with their logit sum, softmax and per-head weight sums in one fused C
  pass per row (:mod:`poslens.native`), on the CPU where the kernels are built;
- ``triton``: the fused Triton kernels (:mod:`poslens.capture.backends.cuda_maps`), which never write a
  logit, for whole layers on CUDA (on CPU tensors under Triton's interpreter, ``TRITON_INTERPRET=1``);
  they form no per-head weight map (``head_weight_sums``), so a layer whose statistics need one
  (``--heads all``) takes the torch pass there.

``POSLENS_CAPTURE_KERNEL`` takes ``auto`` (default: the fastest backend that provides what a layer
needs), ``torch`` (the torch pass everywhere, the C kernels off) or ``triton`` (the Triton kernels
wherever they provide what a layer needs, also on CPU tensors under the interpreter).
"""

from __future__ import annotations

import functools
import glob
import os

import torch

from poslens import native
from poslens.capture.backends import cuda_maps
from poslens.capture.statistics.builtin.base import Piece
from poslens.capture.statistics.points import CHUNKED
from poslens.errors import PoslensError

TORCH, NATIVE, TRITON = "torch", "native", "triton"
KERNEL_VALUES = ("auto", "torch", "triton")

#: the chunk intermediates each backend provides (every backend also hands over the layer-wide ones)
PROVIDES = {
    TORCH: CHUNKED,
    NATIVE: frozenset({"logit_sum", "weight_sum", "head_weight_sums", "diagonal_sums", "key0_weights",
                       "selected_weight_sums", "probs"}),
    TRITON: frozenset({"logit_sum", "weight_sum", "diagonal_sums", "key0_weights", "selected_logit_sums",
                       "selected_weight_sums"}),
}


def kernel_setting() -> str:
    """``POSLENS_CAPTURE_KERNEL``, checked: one of :data:`KERNEL_VALUES` (default ``auto``)."""
    value = os.environ.get(native.KERNEL_ENV, "auto").strip().lower() or "auto"
    if value not in KERNEL_VALUES:
        raise PoslensError(f"{native.KERNEL_ENV}={os.environ.get(native.KERNEL_ENV)!r}: not a capture kernel; "
                           f"set it to one of {', '.join(KERNEL_VALUES)} or unset it.")
    return value


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def choose(query: torch.Tensor, key: torch.Tensor, needs: frozenset, *, window, softcap,
           sink_off: bool = False) -> tuple[str, str]:
    """``(backend, reason)`` for a layer with these queries/keys whose statistics need ``needs``
    (chunk intermediates; the layer-wide ones come from every backend). ``sink_off``: key 0 is masked
    for the queries after it (an intervention), which only the torch pass applies."""
    setting = kernel_setting()
    needs = frozenset(needs) & CHUNKED
    if setting == TORCH:
        return TORCH, f"{native.KERNEL_ENV}=torch"
    if sink_off:
        return TORCH, "torch pass: the fused kernels do not mask key 0 (sink-off)"
    on_gpu = query.device.type != "cpu"
    if on_gpu or setting == TRITON:
        why = _triton_refusal(query, key, needs, window, softcap)
        if why is None:
            return TRITON, "fused Triton kernels" + (" under Triton's interpreter" if not on_gpu else "")
        if on_gpu:
            return TORCH, f"torch pass on {query.device.type}: {why}"
    if not native.available():
        return TORCH, f"torch pass: {native.status().removeprefix('torch path ').strip('()')}"
    if query.dtype != torch.float32 or window is not None or not needs <= PROVIDES[NATIVE]:
        what = ("a sliding window" if window is not None else "per-sequence logits or per-head maps"
                if query.dtype == torch.float32 else f"{query.dtype} inputs")
        return TORCH, f"torch pass: the C kernels do not take {what}"
    return NATIVE, "fused C kernels"


def _triton_refusal(query, key, needs, window, softcap) -> str | None:
    """Why the Triton kernels do not take this layer, or None when they do."""
    if "head_weight_sums" in needs:
        return "the Triton kernels do not form each head's weight map (head_weight_sums: --heads all)"
    if not needs or not needs <= PROVIDES[TRITON]:
        return "its statistics need per-sequence logits or weights"
    if window is not None or softcap is not None:
        return "a sliding window or a logit soft cap"
    if query.device.type == "cpu" and not _interpreted():
        return "CPU tensors without TRITON_INTERPRET=1"
    if not cuda_maps.supported(query, key):
        return "Triton is not installed or the head dimension is not a power of two in [16, 256]"
    return None


def describe(device) -> dict:
    """The backend a scan on ``device`` takes for its chunked layers when nothing rules it out, and
    why (what ``config.json`` records and ``poslens scan`` prints); layers that need more than the
    fast backend provides take the torch pass."""
    setting = kernel_setting()
    dev = torch.device(device if device not in (None, "auto") else "cpu")
    if setting == TORCH:
        return {"backend": TORCH, "reason": f"{native.KERNEL_ENV}=torch"}
    if dev.type == "cuda" or (setting == TRITON and _interpreted()):
        if cuda_maps._kernels() is not None:
            return {"backend": TRITON, "reason": "fused Triton kernels (layers without a window or soft cap)"}
        return {"backend": TORCH, "reason": "torch pass: Triton is not installed"}
    if dev.type == "cpu" and native.available():
        return {"backend": NATIVE, "reason": "fused C kernels (float32 layers without a window)"}
    return {"backend": TORCH, "reason": native.status()}


def triton_pass(query, key, scaling: float, causal: bool, heads: list, needs: frozenset) -> Piece | None:
    """The batch sums of a whole layer from the fused Triton kernels (:mod:`poslens.capture.backends.cuda_maps`),
    as one piece of rows ``0 .. S - 1``; None when a value is not finite (the caller's checked pass
    names the head)."""
    want_k0 = "key0_weights" in needs
    maps = cuda_maps.attention_maps(query, key, scaling, causal=causal, scores="logit_sum" in needs,
                                    probs="weight_sum" in needs or (want_k0 and "diagonal_sums" not in needs),
                                    slash="diagonal_sums" in needs,
                                    heads=list(heads) if needs & {"selected_logit_sums", "selected_weight_sums"}
                                    else [])
    if maps and not bool(torch.stack([torch.isfinite(t).all() for t in maps.values()]).all()):  # one sync
        return None
    names = {"scores": "logit_sum", "probs": "weight_sum", "slash": "diagonal_sums", "sink_heads": "key0_weights",
             "head_scores": "selected_logit_sums", "head_probs": "selected_weight_sums"}
    values = {names[k]: v for k, v in maps.items() if k in names}
    S = query.shape[2]
    return Piece(slice(0, S), slice(0, query.shape[0]), S, values)


# --------------------------------------------------------------------------------------------
# chunk sizes
# --------------------------------------------------------------------------------------------
#: Logits per chunk on CPU (float32) where the shared L3 cache is unknown or small (4 MiB): small enough
#: to stay cache-resident across a chunk's several passes (matmul, mask, softmax in place, p @ v,
#: batch and head sums), large enough that a layer is a few dozen chunks (every chunk costs a fixed
#: few dozen op calls, and every op is a parallel region; on a shared machine each one risks a stall
#: while a worker thread is descheduled). See :func:`cpu_chunk_elems`.
CPU_CHUNK_ELEMS = 2**20

#: The most logits per CPU chunk (float32: 16 MiB), on a CPU whose shared L3 cache holds eight of them.
CPU_CHUNK_ELEMS_MAX = 2**22


@functools.lru_cache(maxsize=1)
def _l3_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The shared L3 cache of CPU 0 in bytes (Linux sysfs), None where it cannot be read."""
    for d in sorted(glob.glob(f"{root}/index*")):
        try:
            with open(f"{d}/level") as f:
                if f.read().strip() != "3":
                    continue
            with open(f"{d}/size") as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        try:
            return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        except ValueError:
            return None
    return None


def cpu_chunk_elems() -> int:
    """Logits per CPU chunk: an eighth of the shared L3 cache (a chunk and the buffers of its size that
    its passes write stay well inside it, beside the model's own working set), between
    :data:`CPU_CHUNK_ELEMS` (4 MiB) and :data:`CPU_CHUNK_ELEMS_MAX` (16 MiB). Chunks of the size of the
    L3 cache fall out of it between passes and make the capture markedly dearer; chunks much smaller
    than it pay the fixed cost per chunk more often. On the benchmark model (``bench_scan.py``) a
    32 MiB L3 runs best at 4 MiB, a 480 MiB one at 16 MiB."""
    l3 = _l3_bytes()
    if not l3:
        return CPU_CHUNK_ELEMS
    return max(CPU_CHUNK_ELEMS, min(CPU_CHUNK_ELEMS_MAX, 1 << ((l3 // 8 // 4).bit_length() - 1)))

#: Rows per CPU chunk of each (batch, key head) logit product (``g`` query heads of a key head times
#: ``c`` query rows: ``c = CPU_TARGET_ROWS / g``, rounded up) by default; fewer, down to
#: ``CPU_MIN_ROWS / g``, where a single sequence's chunk would outgrow the cache budget (long
#: sequences). Thinner products run below GEMM speed; taller row blocks compute more logits above
#: the diagonal. Per layer on the Xeon, 1,024 tokens, scores and probs: 128 rows took 0.94x the time
#: of 64 on the benchmark model (192 and 256 rows: 1.01x), and SmolLM2's 3 x 44 rows 0.91x its 3 x 113.
CPU_TARGET_ROWS = 128
CPU_MIN_ROWS = 64

#: Logits per chunk on CUDA (float32: 1 GiB) for the torch fallback path: a layer is a few chunks, so
#: a few dozen kernel launches instead of thousands (the CPU size gave ~64 chunks per layer at 4k tokens).
CUDA_CHUNK_ELEMS = 2**28


def rows_per_chunk(B: int, H: int, S: int, device, g: int = 1, chunk_elems: int = 0) -> int:
    """Query rows per chunk: ``chunk_elems`` logits at most when set; else on the CPU
    :data:`CPU_TARGET_ROWS` rows per (batch, key head) product, fewer (down to :data:`CPU_MIN_ROWS`)
    where one sequence's chunk would outgrow the cache budget (the chunk then takes as many sequences
    as the budget holds: :func:`sequences_per_slice`); on CUDA large chunks.

    On the CPU every chunk is read several times (sum, softmax, batch sum, ``p @ v``); a block of a
    few megabytes stays cache-resident across those passes. Its products run at GEMM speed from about
    128 rows on, while a causal row block of ``c`` rows computes ``c^2 / 2`` logits above the diagonal
    (``c / S`` of the layer's). On CUDA launches, not caches, are the cost: large chunks.
    """
    cpu = torch.device(device).type == "cpu"
    elems = chunk_elems
    if cpu and not elems:
        budget = cpu_chunk_elems() // max(1, H * S)  # rows of one sequence's chunk within the budget
        lo, hi = -(-CPU_MIN_ROWS // max(1, g)), -(-CPU_TARGET_ROWS // max(1, g))
        return min(S, max(lo, min(hi, budget)))
    if cpu:
        elems = min(elems, cpu_chunk_elems())
    elif not elems:
        elems = CUDA_CHUNK_ELEMS
    return min(S, max(1, elems // max(1, B * H * S)))


def sequences_per_slice(B: int, H: int, S: int, rows: int, device, chunk_elems: int = 0) -> int:
    """Sequences per slice of a chunk: on the CPU as many as keep the slice's logits within the cache
    budget (the rows' floor at a large batch would outgrow it), elsewhere the whole batch."""
    if torch.device(device).type != "cpu":
        return B
    budget = min(chunk_elems or cpu_chunk_elems(), cpu_chunk_elems())
    return max(1, min(B, budget // max(1, H * rows * S)))


def used_line(used: dict) -> str:
    """One line for ``summary["capture_backends"]`` (``{backend: {"layers", "reason"}}``): which backend
    computed which decoder layers' attention statistics (layers from 0), and why."""
    if not used:
        return "capture backend: none (no attention statistic asked for)"
    parts = []
    for name, entry in used.items():
        layers = entry.get("layers") or []
        span = f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 and layers == list(
            range(layers[0], layers[-1] + 1)) else "layers " + ",".join(map(str, layers))
        parts.append(f"{name} ({entry.get('reason')}) for {span if len(layers) != 1 else f'layer {layers[0]}'}")
    return "capture backend: " + "; ".join(parts)
