"""Noise tests on independent groups of samples: is a mean map's structure beyond sampling noise?

A scan or simulation adds each sample to one of ``G`` groups
(:class:`poslens.capture.statistics.accumulators.GroupAccumulator`); these functions read the group sums. Under the
null each group's vector is an independent, symmetric, zero-mean draw, and no assumption is made
about the correlation of entries within a vector (a shared input component correlates every entry
of a score map).
"""

from __future__ import annotations

import functools

import torch

from poslens.conventions import NOISE_P

#: most groups whose sign patterns are all enumerated (2^(G-1) of them); more groups draw patterns
MAX_EXACT_GROUPS = 16


@functools.lru_cache(maxsize=8)
def _flip_patterns(G: int, max_exact: int = MAX_EXACT_GROUPS, draws: int = 2**15, seed: int = 0) -> torch.Tensor:
    """Sign patterns ``[n, G]`` (float64, CPU) with the first sign fixed to +1 (``eps`` and ``-eps`` give
    the same statistic): all ``2^(G-1)`` for ``G <= max_exact``, else ``draws`` random ones plus the identity."""
    if G <= max_exact:
        eps = _half_patterns(G - 1)
        return torch.cat([torch.ones(eps.shape[0], 1, dtype=torch.float64, device="cpu"), eps], dim=1)
    g = torch.Generator().manual_seed(seed)
    eps = 1.0 - 2.0 * torch.randint(0, 2, (draws, G), generator=g, device="cpu").to(torch.float64)
    return torch.cat([torch.ones(1, G, dtype=torch.float64, device="cpu"), eps])


def min_pvalue(groups: int) -> float:
    """The smallest p-value :func:`signflip_pvalue` can return with ``groups`` groups."""
    if groups < 2:
        return 1.0
    return 1.0 / 2 ** (groups - 1) if groups <= MAX_EXACT_GROUPS else 1.0 / (2**15 + 1)


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
    t_obs = float(K.sum())
    t = _flip_statistics(K)
    return float((t >= t_obs * (1 - 1e-12)).to(torch.float64).mean())


def _flip_statistics(K: torch.Tensor) -> torch.Tensor:
    """``eps^T K eps`` for every sign pattern ``eps`` of :func:`_flip_patterns` (in some order), from
    the groups' cross products ``K [G, G]``.

    All ``2^(G-1)`` patterns (G <= 16): the groups split into a first part A (the fixed sign and half
    of the free ones) and the rest B; with ``eps = (a, b)``,
    ``eps^T K eps = a^T K_AA a + b^T K_BB b + a^T (K_AB + K_BAᵀ) b``: the two quadratic forms on
    ``2^|A|`` and ``2^|B|`` half patterns and one product of the halves, O(2^G) additions instead of
    O(2^G G^2) multiplications. Random patterns (G > 16): each evaluated directly."""
    G = K.shape[0]
    if G > MAX_EXACT_GROUPS:
        eps = _flip_patterns(G)
        return ((eps @ K) * eps).sum(1)
    na = 1 + (G - 1) // 2  # the fixed sign and the low free bits
    A, B = _flip_patterns(na), _half_patterns(G - na)
    qa = ((A @ K[:na, :na]) * A).sum(1)
    qb = ((B @ K[na:, na:]) * B).sum(1)
    cross = A @ (K[:na, na:] + K[na:, :na].T) @ B.T
    return (qa[:, None] + qb[None, :] + cross).reshape(-1)


@functools.lru_cache(maxsize=8)
def _half_patterns(n: int) -> torch.Tensor:
    """Every sign pattern of ``n`` signs, ``[2^n, n]`` float64 (one row of no signs for ``n = 0``)."""
    codes = torch.arange(2**n, dtype=torch.int64, device="cpu")
    bits = (codes[:, None] >> torch.arange(n, dtype=torch.int64, device="cpu")) & 1
    return 1.0 - 2.0 * bits.to(torch.float64)


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
    off = ~torch.eye(G, dtype=torch.bool, device="cpu")  # K and W are on the CPU
    signal = float((W * K)[off].sum() / W[off].sum())
    observed = float((W * K).sum())
    return signal, observed - signal


def leave_one_out_means(group_sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[G, ...]``: the mean of every group but ``g``, for each ``g``, from group sums ``[G, ...]`` and
    their counts ``[G]`` (the delete-one-group means a jackknife evaluates its statistic on)."""
    total = group_sums.sum(0)
    n = counts.to(torch.float64).sum()
    rest = (n - counts).to(total.dtype).reshape(-1, *([1] * total.ndim))
    return (total - group_sums) / rest


def jackknife_se_of(values) -> float | None:
    """Delete-one-group jackknife standard error from the ``G`` leave-one-out values of a statistic
    (:func:`leave_one_out_means`): ``sqrt((G - 1) / G * sum_g (v_g - mean v)^2)``; ``None`` with fewer
    than two values or any value None or NaN."""
    vals = [None if v is None else float(v) for v in values]
    G = len(vals)
    if G < 2 or any(v is None or v != v for v in vals):
        return None
    v = torch.tensor(vals, dtype=torch.float64, device="cpu")
    return float(((G - 1) / G * ((v - v.mean()) ** 2).sum()).sqrt())


def jackknife_se(stat, group_sums: torch.Tensor, counts: torch.Tensor) -> float | None:
    """Delete-one-group jackknife standard error of ``stat(mean)`` from group sums ``[G, ...]``.

    ``stat`` maps a mean tensor to a float (or None); ``None`` if fewer than two groups or any
    leave-one-out value is None. A statistic that takes every leave-one-out mean at once reads them
    from :func:`leave_one_out_means` and passes its values to :func:`jackknife_se_of`.
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
    return jackknife_se_of(vals)


def signflip_pvalues(diffs: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Two-sided sign-flip p-values of "the weighted mean of each column of ``diffs`` ``[G, n]`` is 0".

    Each column is one paired reading (B − A per sequence group, ``G`` groups); under the null each
    group's difference is an independent draw symmetric about 0, so every sign pattern is as likely
    as the observed one. The statistic ``|sum_g w_g d_g|`` of every column is compared with its value
    under every pattern of :func:`_flip_patterns` (all ``2^(G-1)`` for ``G <= 16``, exact). A column
    that is 0 in every group gets p = 1. NaN where a column holds a NaN; all NaN with fewer than two
    groups.
    """
    d = torch.as_tensor(diffs).to(torch.float64).cpu()
    d = d.reshape(d.shape[0], -1)
    G, n = d.shape
    if G < 2:
        return torch.full((n,), float("nan"), dtype=torch.float64, device="cpu")
    w = torch.ones(G, dtype=torch.float64, device="cpu") if weights is None else \
        torch.as_tensor(weights).to(torch.float64).cpu()
    wd = d * (w / w.sum())[:, None]
    bad = ~torch.isfinite(wd).all(0)
    wd = wd.nan_to_num(0.0, 0.0, 0.0)
    t_obs = wd.sum(0).abs()
    eps = _flip_patterns(G)  # [P, G]
    out = torch.empty(n, dtype=torch.float64, device="cpu")
    step = max(1, (1 << 22) // eps.shape[0])  # columns per product: a few million entries at a time
    for s in range(0, n, step):
        t = (eps @ wd[:, s:s + step]).abs()  # [P, c]
        out[s:s + step] = (t >= t_obs[s:s + step] * (1 - 1e-12)).to(torch.float64).mean(0)
    out[bad] = float("nan")
    return out


def paired_groups(a: torch.Tensor, b: torch.Tensor, weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Paired statistics of per-group readings ``a``, ``b`` ``[G, ...]`` (the same sequence groups under
    two variants): the weighted means ``a`` and ``b``, ``delta = b − a`` (the weighted mean of the group
    differences), its standard error over groups (the weighted standard deviation of the group
    differences over ``sqrt(G)``, with ``G − 1`` in the denominator: the SE of a mean of ``G`` equally
    sized groups) and the sign-flip ``p`` (:func:`signflip_pvalues`). Every output has ``a``'s trailing
    shape; SE and p are NaN with fewer than two groups."""
    a64, b64 = torch.as_tensor(a).to(torch.float64).cpu(), torch.as_tensor(b).to(torch.float64).cpu()
    G = a64.shape[0]
    w = torch.ones(G, dtype=torch.float64, device="cpu") if weights is None else \
        torch.as_tensor(weights).to(torch.float64).cpu()
    wn = (w / w.sum()).reshape(-1, *([1] * (a64.ndim - 1)))
    d = b64 - a64
    delta = (wn * d).sum(0)
    if G >= 2:
        var = (wn * (d - delta) ** 2).sum(0) * G / (G - 1)
        se = (var / G).sqrt()
    else:
        se = torch.full_like(delta, float("nan"))
    p = signflip_pvalues(d, w).reshape(delta.shape)
    return {"a": (wn * a64).sum(0), "b": (wn * b64).sum(0), "delta": delta, "se": se, "p": p}
