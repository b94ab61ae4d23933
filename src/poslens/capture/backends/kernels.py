"""Small tensor kernels that several of the capture's statistics use."""

from __future__ import annotations

import contextlib
import math

import torch

from poslens.errors import PoslensError

#: half-precision dtypes, whose values TF32 products multiply exactly
HALF = (torch.bfloat16, torch.float16)


@contextlib.contextmanager
def half_input_matmuls(enabled: bool):
    """TF32 matrix products while enabled: float32 products of bf16/fp16 values (logits, the raw
    cosine products), never of values derived from them (unit vectors, un-rotated q/k).

    A bf16 (8-bit mantissa) or fp16 (11-bit) value is exact in TF32's 10+1 bits except fp16's lowest
    bit, so TF32 multiplies the model's own numbers (almost) exactly and accumulates in float32, at
    the tensor cores' rate instead of the float32 units' (about 8x on an H100)."""
    if not enabled:
        yield
        return
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def sum_first(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)`` as in-place adds of the slices: the same float32 sum, but on the shared 2-thread
    benchmark machine a reduction over the outermost dim intermittently stalled for tens of ms."""
    if x.shape[0] == 1:
        return x[0]
    out = x[0] + x[1]
    for b in range(2, x.shape[0]):
        out += x[b]
    return out


def finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite, in one pass: a NaN or infinite entry makes the sum
    non-finite, so only a non-finite sum (or one that overflowed) needs the entry-wise test."""
    return math.isfinite(float(x.sum())) or bool(torch.isfinite(x).all())


def nonfinite_error(layer, head) -> PoslensError:
    return PoslensError(f"non-finite attention scores in layer {layer}, head {head} (model overflow?); "
                        "try --dtype fp32 or check the checkpoint.")
