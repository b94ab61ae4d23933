"""Runtime settings shared by the library and the CLI: which device, which dtype, and process-wide
switches (torch threads, Hugging Face progress bars) set for one block and restored after it."""

from __future__ import annotations

import contextlib
from typing import Iterator

from poslens.errors import PoslensError


def parse_device(device: str) -> str:
    """Resolve ``auto|cpu|cuda`` into a torch device string, with a clear error if CUDA is absent."""
    import torch

    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise PoslensError(f"--device {device!r} is not one of auto, cpu, cuda.")
    if device == "auto":
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


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` inside the block (``None``/0: unchanged), restored after."""
    import torch

    prev = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != prev:
            torch.set_num_threads(prev)


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
