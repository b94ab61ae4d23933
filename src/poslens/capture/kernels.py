"""Small tensor kernels that several of the capture's statistics use."""

from __future__ import annotations

import torch


def sum_first(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)`` as in-place adds of the slices: the same float32 sum, but on the shared 2-thread
    benchmark machine a reduction over the outermost dim intermittently stalled for tens of ms."""
    if x.shape[0] == 1:
        return x[0]
    out = x[0] + x[1]
    for b in range(2, x.shape[0]):
        out += x[b]
    return out
