"""Noise tests on independent groups of samples: is a mean map's structure beyond sampling noise?

A scan or simulation adds each sample to one of ``G`` groups
(:class:`poslens.capture.stats.GroupAccumulator`); these functions read the group sums. Under the
null each group's vector is an independent, symmetric, zero-mean draw, and no assumption is made
about the correlation of entries within a vector (a shared input component correlates every entry
of a score map).
"""

from __future__ import annotations

import functools

import torch

#: p-value below which a map is said to carry structure beyond sampling noise (the test's stated
#: false-positive rate).
NOISE_P = 0.01


@functools.lru_cache(maxsize=8)
def _flip_patterns(G: int, max_exact: int = 16, draws: int = 2**15, seed: int = 0) -> torch.Tensor:
    """Sign patterns ``[n, G]`` (float64) with the first sign fixed to +1 (``eps`` and ``-eps`` give the
    same statistic): all ``2^(G-1)`` for ``G <= max_exact``, else ``draws`` random ones plus the identity."""
    if G <= max_exact:
        codes = torch.arange(2 ** (G - 1), dtype=torch.int64)
        bits = (codes[:, None] >> torch.arange(G - 1, dtype=torch.int64)) & 1
        eps = 1.0 - 2.0 * bits.to(torch.float64)
        return torch.cat([torch.ones(eps.shape[0], 1, dtype=torch.float64), eps], dim=1)
    g = torch.Generator().manual_seed(seed)
    eps = 1.0 - 2.0 * torch.randint(0, 2, (draws, G), generator=g).to(torch.float64)
    return torch.cat([torch.ones(1, G, dtype=torch.float64), eps])


def min_pvalue(groups: int) -> float:
    """The smallest p-value :func:`signflip_pvalue` can return with ``groups`` groups."""
    if groups < 2:
        return 1.0
    return 1.0 / 2 ** (groups - 1) if groups <= 16 else 1.0 / (2**15 + 1)


def decisive(groups: int) -> bool:
    """Whether ``groups`` groups can give a p-value below :data:`NOISE_P` at all (8 or more)."""
    return min_pvalue(groups) < NOISE_P


def signflip_pvalue(vectors: torch.Tensor, weights: torch.Tensor) -> float | None:
    """p-value of "the weighted mean of ``vectors`` ``[G, n]`` is zero" by a sign-flip test.

    Under the null each group's vector is an independent, symmetric, zero-mean draw, so flipping
    any group's sign leaves the joint distribution unchanged: the statistic ``||sum_g w_g a_g||^2``
    is compared with its value under every flip (exact for G <= 16). No assumption is made about
    the correlation of entries within a vector. ``None`` with fewer than two groups.
    """
    a = torch.as_tensor(vectors).to(torch.float64).reshape(vectors.shape[0], -1)
    G = a.shape[0]
    if G < 2:
        return None
    w = torch.as_tensor(weights).to(torch.float64).to(a.device)
    w = w / w.sum()
    wa = a * w[:, None]
    K = (wa @ wa.T).cpu()
    eps = _flip_patterns(G)
    t = ((eps @ K) * eps).sum(1)
    t_obs = float(K.sum())
    return float((t >= t_obs * (1 - 1e-12)).to(torch.float64).mean())


def cross_mean_square(vectors: torch.Tensor, weights: torch.Tensor) -> tuple[float, float] | None:
    """``(signal, noise)`` mean squares of the weighted mean of ``vectors`` ``[G, n]``.

    ``signal`` is an unbiased estimate of ``mean(E[a]^2)`` from cross products of different groups
    only (each group's own noise never multiplies itself), ``noise`` the expected mean square the
    sampling noise alone adds to the weighted mean: observed = signal + noise on average.
    ``None`` with fewer than two groups.
    """
    a = torch.as_tensor(vectors).to(torch.float64).reshape(vectors.shape[0], -1)
    G, n = a.shape
    if G < 2 or n == 0:
        return None
    w = torch.as_tensor(weights).to(torch.float64).to(a.device)
    w = w / w.sum()
    K = (a @ a.T).cpu() / n
    W = torch.outer(w, w).cpu()
    off = ~torch.eye(G, dtype=torch.bool)
    signal = float((W * K)[off].sum() / W[off].sum())
    observed = float((W * K).sum())
    return signal, observed - signal


def jackknife_se(stat, group_sums: torch.Tensor, counts: torch.Tensor) -> float | None:
    """Delete-one-group jackknife standard error of ``stat(mean)`` from group sums ``[G, ...]``.

    ``stat`` maps a mean tensor to a float (or None); ``None`` if fewer than two groups or any
    leave-one-out value is None.
    """
    G = group_sums.shape[0]
    if G < 2:
        return None
    total = group_sums.sum(0)
    n = counts.to(torch.float64).sum()
    vals = []
    for g in range(G):
        v = stat((total - group_sums[g]) / (n - counts[g]).to(total.dtype))
        if v is None or v != v:
            return None
        vals.append(float(v))
    v = torch.tensor(vals, dtype=torch.float64)
    return float(((G - 1) / G * ((v - v.mean()) ** 2).sum()).sqrt())
