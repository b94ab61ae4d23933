"""Runtime settings shared by the library and the CLI: which device, which dtype."""

from __future__ import annotations

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
