"""Metrics: pure functions of accumulated tensors (tensors in, numbers out)."""

from poslens.metrics.diagonal import (
    describe_map,
    diagonal_means,
    diagonal_normalize,
    diagonal_trend,
    flat_pvalue,
    is_flat,
    locality,
    mask_keys,
    nonrelative_pvalue,
    relativity_index,
    trend_pvalue,
    valid_mask,
    within_diagonal_rms,
)
from poslens.metrics.neighborhood import (
    adjacency_probability_score,
    aps_positions,
    norm_score,
    per_sequence_aps,
    rising_pair_fraction,
)

__all__ = [
    "adjacency_probability_score",
    "aps_positions",
    "describe_map",
    "diagonal_means",
    "diagonal_normalize",
    "diagonal_trend",
    "flat_pvalue",
    "is_flat",
    "locality",
    "mask_keys",
    "nonrelative_pvalue",
    "norm_score",
    "per_sequence_aps",
    "relativity_index",
    "rising_pair_fraction",
    "trend_pvalue",
    "valid_mask",
    "within_diagonal_rms",
]
