"""Small tensor kernels that several of the capture's statistics use."""

from __future__ import annotations

import math

import torch

from poslens.errors import PoslensError


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
