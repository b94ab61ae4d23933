"""Metrics: pure functions of accumulated tensors (tensors in, numbers out)."""

from poslens.metrics.diagonal import (
    diagonal_means,
    diagonal_normalize,
    is_flat,
    locality,
    relativity_index,
    valid_mask,
)
from poslens.metrics.neighborhood import adjacency_probability_score, norm_score, rising_pair_fraction

__all__ = [
    "adjacency_probability_score",
    "diagonal_means",
    "diagonal_normalize",
    "is_flat",
    "locality",
    "norm_score",
    "relativity_index",
    "rising_pair_fraction",
    "valid_mask",
]
