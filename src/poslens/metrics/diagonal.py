"""Diagonal normalisation, relativity index and locality of causal score maps.

Maps are ``[..., S, S]`` with rows = queries and columns = keys; entries above the diagonal are
masked (NaN) because a causal query never sees later keys.

Definitions (arXiv 2509.21042 for the normalisation; the two numbers are
poslens' own, since the paper reads them off heat maps):

- **diagonal normalisation**: subtract from every diagonal (offset k = i - j >= 0) of the lower
  triangle its own mean. A purely relative (Toeplitz) map becomes exactly zero.
- **relativity index**: ``1 - Var(diag-normalised) / Var(map)`` over the valid entries; 1 means
  the map is a function of i - j alone, 0 means the diagonals carry none of the variation.
  With standard errors, both variances are corrected for Monte Carlo noise.
- **locality**: ``2 P - 1`` where P is the fraction of key pairs j < k < i in the same query row
  with score(i, k) > score(i, j) (ties count one half): +1 = every row rises monotonically
  towards the diagonal, 0 = no trend, -1 = every row falls.

By default the main diagonal (a token's score with itself) is excluded: with normalised inputs
it is a constant self-similarity that dominates any map and says nothing about position.

Noise: a map whose variation is consistent with its standard errors is *flat*; both numbers are
then ``None`` rather than a meaningless value computed from noise.
"""

from __future__ import annotations

import math

import torch

from poslens.metrics.neighborhood import rising_pair_fraction

#: z-score above which a map's variation is called real rather than Monte Carlo noise
#: (one-sided, p ~ 1e-3 under the chi-square approximation).
FLAT_Z = 3.09


def _as64(m) -> torch.Tensor:
    return torch.as_tensor(m).to(torch.float64)


def valid_mask(S: int, include_diagonal: bool = False, device=None) -> torch.Tensor:
    """Boolean ``[S, S]`` mask of causal entries: ``i > j`` (or ``i >= j``)."""
    i = torch.arange(S, device=device)
    return (i[:, None] > i[None, :]) if not include_diagonal else (i[:, None] >= i[None, :])


def _offsets(S: int, device=None) -> torch.Tensor:
    i = torch.arange(S, device=device)
    return (i[:, None] - i[None, :]).clamp_min(0)


def diagonal_means(m) -> torch.Tensor:
    """Mean of each lower diagonal: ``out[..., k]`` = mean of entries with ``i - j = k``."""
    m = _as64(m)
    S = m.shape[-1]
    mask = valid_mask(S, include_diagonal=True, device=m.device)
    off = _offsets(S, m.device)
    vals = torch.where(mask, torch.nan_to_num(m, nan=0.0), torch.zeros((), dtype=m.dtype, device=m.device))
    finite = mask & torch.isfinite(m)
    lead = m.shape[:-2]
    idx = off.reshape(-1).expand(*lead, S * S)
    sums = torch.zeros(*lead, S, dtype=m.dtype, device=m.device).scatter_add_(-1, idx, (vals * finite).reshape(*lead, S * S))
    counts = torch.zeros_like(sums).scatter_add_(-1, idx, finite.to(m.dtype).reshape(*lead, S * S))
    return sums / counts.clamp_min(1) + torch.where(counts > 0, 0.0, float("nan"))


def diagonal_normalize(m) -> torch.Tensor:
    """Subtract from each lower diagonal its own mean; entries above the diagonal become NaN."""
    m = _as64(m)
    S = m.shape[-1]
    means = diagonal_means(m)
    off = _offsets(S, m.device)
    centred = m - means[..., off]
    return torch.where(valid_mask(S, include_diagonal=True, device=m.device), centred, float("nan"))


def _valid_values(m: torch.Tensor, include_diagonal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    S = m.shape[-1]
    mask = valid_mask(S, include_diagonal, m.device) & torch.isfinite(m)
    return mask, m[mask]


def _chi2_z(stat: float, df: int) -> float:
    """Wilson-Hilferty normal approximation to a chi-square(df) upper tail, as a z-score."""
    if df <= 0:
        return -math.inf
    k = float(df)
    return ((stat / k) ** (1.0 / 3.0) - (1.0 - 2.0 / (9.0 * k))) / math.sqrt(2.0 / (9.0 * k))


def is_flat(m, stderr=None, include_diagonal: bool = False) -> bool:
    """True when the map's variation over its valid entries is within Monte Carlo noise.

    With standard errors: a chi-square test of "all valid entries are equal" at p ~ 1e-3.
    Without: only an exactly constant map (to float64 rounding) is flat.
    """
    m = _as64(m)
    mask, v = _valid_values(m, include_diagonal)
    if v.numel() < 2:
        return True
    dev = v - v.mean()
    if stderr is None:
        scale = v.abs().max().clamp_min(1e-300)
        return bool(dev.abs().max() <= 1e-12 * scale)
    se = _as64(stderr)[mask].clamp_min(1e-300)
    stat = float(((dev / se) ** 2).sum())
    return _chi2_z(stat, v.numel() - 1) < FLAT_Z


def relativity_index(m, stderr=None, include_diagonal: bool = False) -> float | None:
    """How much of a causal map's variation is explained by the offset i - j alone (1 = Toeplitz).

    Returns ``None`` for a flat map (see :func:`is_flat`). With ``stderr`` the two variances are
    corrected for noise: E[Var(noisy map)] = Var(map) + mean(se^2), and a diagonal's mean
    absorbs a 1/n_k share of its entries' noise.
    """
    m = _as64(m)
    if m.ndim != 2:
        raise ValueError("relativity_index takes one [S, S] map")
    if is_flat(m, stderr, include_diagonal):
        return None
    mask, v = _valid_values(m, include_diagonal)
    dn = diagonal_normalize(torch.where(mask, m, float("nan")))[mask]
    var_map = float(((v - v.mean()) ** 2).mean())
    var_dn = float((dn**2).mean())
    if stderr is not None:
        se2 = _as64(stderr)[mask] ** 2
        off = _offsets(m.shape[-1], m.device)[mask]
        n_k = torch.bincount(off, minlength=m.shape[-1]).to(torch.float64)[off]
        var_map = max(var_map - float(se2.mean()), 0.0)
        var_dn = max(var_dn - float((se2 * (1 - 1 / n_k)).mean()), 0.0)
    if var_map <= 0.0:
        return None
    return float(min(max(1.0 - var_dn / var_map, 0.0), 1.0))


def locality(m, stderr=None, include_diagonal: bool = False) -> float | None:
    """``2P - 1`` with P the fraction of same-row key pairs whose score rises towards the query.

    +1: every query's scores rise monotonically as keys approach it; ``None`` for a flat map.
    """
    m = _as64(m)
    if m.ndim != 2:
        raise ValueError("locality takes one [S, S] map")
    if is_flat(m, stderr, include_diagonal):
        return None
    return 2.0 * float(rising_pair_fraction(m, include_diagonal=include_diagonal, ties=0.5)) - 1.0
