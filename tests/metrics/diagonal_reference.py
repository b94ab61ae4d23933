"""The readings of a score map as finalize computed them before they shared one diagonal layout:
:mod:`poslens.metrics.diagonal` (diagonal normalisation, relativity index, within-diagonal RMS,
diagonal trend, locality, ``describe_map``) and the scan's ``score_map_numbers``, kept verbatim as
the reference the shared computation is tested against (``tests/metrics/test_finalize_readings.py``).
Every reading of the new code equals these to float64 rounding.

Original docstring of poslens.metrics.diagonal:
Diagonal normalisation, relativity index, signed trend and locality of causal score maps.

Maps are ``[..., S, S]`` with rows = queries and columns = keys; entries above the diagonal are
masked (NaN) because a causal query never sees later keys.

Definitions (arXiv 2509.21042 for the normalisation; the numbers are poslens' own, since the
paper reads them off heat maps):

- **diagonal normalisation**: subtract from every diagonal (offset k = i - j >= 0) of the lower
  triangle its own mean. A purely relative (Toeplitz) map becomes exactly zero.
- **relativity index**: ``1 - Var(diag-normalised) / Var(map)`` over the valid entries; 1 means
  the map is a function of i - j alone, 0 means the diagonals carry none of the variation.
- **diagonal trend** (signed): ``2P - 1`` with P the fraction of same-diagonal entry pairs where the
  entry further right (later key and query) is higher: +1 = along every diagonal the entry further
  right is higher, -1 = lower ("left columns lower" is a positive trend).
- **within-diagonal RMS**: ``sqrt(mean(diag-normalised^2))`` in score units: how large the
  non-relative part is.
- **locality**: ``2 P - 1`` where P is the fraction of key pairs j < k < i in the same query row
  with score(i, k) > score(i, j) (ties count one half): +1 = every row rises monotonically
  towards the diagonal, 0 = no trend, -1 = every row falls.

By default the main diagonal (a token's score with itself) is excluded. ``exclude_keys`` masks
whole key columns (real models' attention-sink column 0, a BOS position): a Toeplitz map with a
raised sink column is purely relative everywhere else and reads 1 with ``exclude_keys=(0,)``.

Noise: with ``groups`` (group means of the map over independent groups of samples, see
:class:`poslens.capture.statistics.accumulators.GroupAccumulator`) every significance statement comes from the spread of
the groups, which holds whatever the correlation between entries of one sample: a sign-flip test
for "no variation" (flat) and for "no non-relative part", and noise-free (cross-group) estimates
of the variances. A flat map has relativity index and locality ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from poslens.conventions import NOISE_P
from poslens.metrics.neighborhood import (
    aps_positions,
    dead_leading_keys,
    finite,
    finite_prefix,
    key_pair_counts,
    ordered_pair_counts,
    pair_counts,
    pair_fraction,
    prefix_bands,
)
from poslens.metrics.noise import (
    cross_mean_square,
    decisive,
    jackknife_se_of,
    leave_one_out_means,
    signflip_pvalue,
)


def as_float64(m) -> torch.Tensor:
    """``m`` (tensor, array or nested list) as a float64 tensor; a list never passes through float32."""
    return torch.as_tensor(m, dtype=torch.float64)


def valid_mask(S: int, include_diagonal: bool = False, device=None) -> torch.Tensor:
    """Boolean ``[S, S]`` mask of causal entries: ``i > j`` (or ``i >= j``)."""
    i = torch.arange(S, device=device)
    return (i[:, None] > i[None, :]) if not include_diagonal else (i[:, None] >= i[None, :])


def _offsets(S: int, device=None) -> torch.Tensor:
    i = torch.arange(S, device=device)
    return (i[:, None] - i[None, :]).clamp_min(0)


def mask_keys(m, exclude_keys: Sequence[int] = ()) -> torch.Tensor:
    """A float64 copy of ``m`` with the key columns ``exclude_keys`` set to NaN."""
    m = as_float64(m).clone()
    keys = [k for k in exclude_keys if 0 <= k < m.shape[-1]]
    if keys:
        m[..., keys] = float("nan")
    return m


def diagonal_means(m) -> torch.Tensor:
    """Mean of each lower diagonal: ``out[..., k]`` = mean of the finite entries with ``i - j = k``."""
    m = as_float64(m)
    S = m.shape[-1]
    mask = valid_mask(S, include_diagonal=True, device=m.device)
    off = _offsets(S, m.device)
    fin = mask & finite(m)
    vals = torch.where(fin, m, torch.zeros((), dtype=m.dtype, device=m.device))
    lead = m.shape[:-2]
    idx = off.reshape(-1).expand(*lead, S * S)
    sums = torch.zeros(*lead, S, dtype=m.dtype, device=m.device).scatter_add_(-1, idx, vals.reshape(*lead, S * S))
    counts = torch.zeros_like(sums).scatter_add_(-1, idx, fin.to(m.dtype).reshape(*lead, S * S))
    return sums / counts.clamp_min(1) + torch.where(counts > 0, 0.0, float("nan"))


def diagonal_normalize(m) -> torch.Tensor:
    """Subtract from each lower diagonal its own mean; entries above the diagonal become NaN."""
    m = as_float64(m)
    S = m.shape[-1]
    means = diagonal_means(m)
    off = _offsets(S, m.device)
    centred = m - means[..., off]
    return torch.where(valid_mask(S, include_diagonal=True, device=m.device), centred, float("nan"))


def _entries(m: torch.Tensor, include_diagonal: bool) -> torch.Tensor:
    """Bool ``[S, S]``: valid causal entries that are finite in every leading slice of ``m``."""
    S = m.shape[-1]
    fin = finite(m)
    while fin.ndim > 2:
        fin = fin.all(0)
    return valid_mask(S, include_diagonal, m.device) & fin


def _centred(m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[..., n]``: the valid entries minus their own mean (the projection behind "flat")."""
    v = m[..., mask]
    return v - v.mean(-1, keepdim=True)


def _within(m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[..., n]``: the diagonal-normalised valid entries (the projection behind "non-relative")."""
    return diagonal_normalize(torch.where(mask, m, float("nan")))[..., mask]


#: why a map carries no noise floor (``describe_map``'s ``noise``), rendered by poslens.reporting.readings:
#: no valid entry to estimate noise on; fewer than two groups of samples; too few groups for the
#: smallest attainable p-value to lie under NOISE_P (p-values are given, nothing is called)
NO_VALID_ENTRY, NO_GROUPS, TOO_FEW_GROUPS = "no_valid_entry", "no_groups", "too_few_groups"
NOISE_NOTES = (NO_VALID_ENTRY, NO_GROUPS, TOO_FEW_GROUPS)


# --------------------------------------------------------------------------------------------
# noise from independent groups
# --------------------------------------------------------------------------------------------
def _groups(groups, weights, exclude_keys):
    if groups is None:
        return None, None
    g = mask_keys(groups, exclude_keys)
    w = torch.ones(g.shape[0], dtype=torch.float64, device=g.device) if weights is None else as_float64(weights)
    return g, w


def flat_pvalue(groups, weights=None, include_diagonal: bool = False, exclude_keys: Sequence[int] = ()) -> float | None:
    """Sign-flip p-value of "every valid entry of the mean map is equal" from group means ``[G, S, S]``."""
    g, w = _groups(groups, weights, exclude_keys)
    mask = _entries(g, include_diagonal)
    if int(mask.sum()) < 2:
        return None
    return signflip_pvalue(_centred(g, mask), w)


def nonrelative_pvalue(groups, weights=None, include_diagonal: bool = False,
                       exclude_keys: Sequence[int] = ()) -> float | None:
    """Sign-flip p-value of "the mean map is a function of i - j alone" from group means ``[G, S, S]``."""
    g, w = _groups(groups, weights, exclude_keys)
    mask = _entries(g, include_diagonal)
    if int(mask.sum()) < 2:
        return None
    return signflip_pvalue(_within(g, mask), w)


def is_flat(m, groups=None, weights=None, include_diagonal: bool = False, exclude_keys: Sequence[int] = ()) -> bool:
    """True when the map's variation over its valid entries is within sampling noise.

    With ``groups``: the sign-flip test of :func:`flat_pvalue` at p >= :data:`NOISE_P`. With too few
    groups for that test to reach p < NOISE_P (fewer than 8), or without groups, only an exactly
    constant map (to float64 rounding) is flat: too little data is no evidence of flatness.
    """
    m = mask_keys(m, exclude_keys)
    v = m[_entries(m, include_diagonal)]
    if v.numel() < 2:
        return True
    p = None
    if groups is not None and decisive(int(groups.shape[0])):
        p = flat_pvalue(groups, weights, include_diagonal, exclude_keys)
    return _flat_verdict(v, p)


def _flat_verdict(v: torch.Tensor, p: float | None) -> bool:
    """:func:`is_flat` from the map's valid entries ``v`` (two or more) and the groups' flat p-value
    (None without decisive groups: then only an exactly constant map is flat)."""
    if p is not None:
        return p >= NOISE_P
    scale = v.abs().max().clamp_min(1e-300)
    return bool((v - v.mean()).abs().max() <= 1e-12 * scale)


def relativity_index(m, groups=None, weights=None, include_diagonal: bool = False,
                     exclude_keys: Sequence[int] = ()) -> float | None:
    """How much of a causal map's variation is explained by the offset i - j alone (1 = Toeplitz).

    ``None`` for a flat map (:func:`is_flat`). With ``groups`` both variances are estimated from
    products of different groups only, so sampling noise (correlated or not) adds nothing to them.
    """
    m = mask_keys(m, exclude_keys)
    if m.ndim != 2:
        raise ValueError("relativity_index takes one [S, S] map")
    if is_flat(m, groups, weights, include_diagonal):
        return None
    mask = _entries(m, include_diagonal)
    g, w = _groups(groups, weights, exclude_keys)
    if g is not None and g.shape[0] >= 2:
        mask = mask & _entries(g, include_diagonal)
        return _relativity(m, mask, None, _centred(g, mask), cross_mean_square(_within(g, mask), w), w)
    return _relativity(m, mask, _within(m, mask), None, None, None)


def _relativity(m: torch.Tensor, mask: torch.Tensor, within_m: torch.Tensor | None, centred_g: torch.Tensor | None,
                cross: tuple | None, w: torch.Tensor | None) -> float | None:
    """:func:`relativity_index` of a map that is not flat: from the groups' centred entries and the
    cross mean squares of their diagonal-normalised ones where there are groups, else from the map's
    own valid entries (``mask``) and their diagonal-normalised values ``within_m``."""
    if centred_g is not None:
        var_map = cross_mean_square(centred_g, w)[0]
        var_dn = cross[0]
    else:
        var_map = float((_centred(m, mask) ** 2).mean())
        var_dn = float((within_m ** 2).mean())
    if var_map <= 0.0:
        return None
    return float(min(max(1.0 - max(var_dn, 0.0) / var_map, 0.0), 1.0))


def within_diagonal_rms(m, include_diagonal: bool = False, exclude_keys: Sequence[int] = ()) -> float:
    """``sqrt(mean(diag-normalised^2))`` over the valid entries, in the map's own units."""
    m = mask_keys(m, exclude_keys)
    mask = _entries(m, include_diagonal)
    if int(mask.sum()) == 0:
        return float("nan")
    return float((_within(m, mask) ** 2).mean().sqrt())


def diagonal_trend(m, include_diagonal: bool = False, exclude_keys: Sequence[int] = ()) -> float | None:
    """Signed trend along diagonals: ``2P - 1`` with P the fraction of same-diagonal entry pairs in
    which the entry further right (later key and query) is higher, ties counting one half.

    +1: on every diagonal the entry further right is higher; -1: lower; 0 for a Toeplitz map. It is
    the pair-weighted mean over diagonals of Kendall's tau between a diagonal's entries and their
    column index (the same pair count as :func:`locality`, along diagonals instead of rows).
    ``None`` when no diagonal has two valid entries.
    """
    m = mask_keys(m, exclude_keys)
    if m.ndim != 2:
        raise ValueError("diagonal_trend takes one [S, S] map")
    v = float(diagonal_trends(m, include_diagonal))
    return None if v != v else v


def diagonal_trends(m: torch.Tensor, include_diagonal: bool = False) -> torch.Tensor:
    """:func:`diagonal_trend` of every map of ``m [..., S, S]`` at once, float64 ``[...]`` (NaN where
    no diagonal has two valid entries; NaN entries take part in no pair).

    Each diagonal k (``D[k, t] = m[t + k, t]``, a strided view) becomes a row with its finite entries
    in column order at the front (:func:`poslens.metrics.neighborhood.finite_prefix`, after the key
    columns with no finite entry: :func:`poslens.metrics.neighborhood.dead_leading_keys`), and one
    value sort per row counts its rising and tied pairs
    (:func:`poslens.metrics.neighborhood.ordered_pair_counts`); the diagonals of at most ``w`` entries
    on their first ``w`` columns only."""
    m = as_float64(m)
    S = m.shape[-1]
    lead = m.shape[:-2]
    flat = m.reshape(-1, S, S)
    B = flat.shape[0]
    first = 0 if include_diagonal else 1
    fin = valid_mask(S, include_diagonal, m.device) & finite(flat)
    c = dead_leading_keys(fin)
    if c:  # a key column without a finite entry (an excluded sink) starts every diagonal: drop it
        flat, fin, S = flat[:, c:, c:], fin[:, c:, c:], S - c
    if S - first < 2:
        return torch.full(lead, float("nan"), dtype=torch.float64, device=m.device)
    # D[b, k - first, t] = m[b, t + k, t] (flat index (t + k) S + t); past the map's end, the padding:
    # not kept
    def diagonals(x: torch.Tensor, pad) -> torch.Tensor:
        padded = torch.cat([x.reshape(B, S * S), x.new_full((B, S * S), pad)], 1)
        return padded.as_strided((B, S - first, S), (2 * S * S, S, S + 1), first * S)

    D = finite_prefix(diagonals(flat, float("nan")), diagonals(fin, False))
    gt, lt, pairs = (torch.zeros(B, dtype=torch.float64, device=m.device) for _ in range(3))
    for lo, hi, w in prefix_bands(S - first, extra=1):  # band rows r = S - 1 - k: diagonal k has r + 1 entries
        if w < 2:
            continue
        rows = D[:, S - hi - first:S - lo - first, :w]
        g, e, n = (v.reshape(B, hi - lo) for v in ordered_pair_counts(rows.reshape(-1, w)))
        gt += g.sum(1)  # integer counts in float64: exact sums
        lt += (n - g - e).sum(1)
        pairs += n.sum(1)
    trend = (gt - lt) / pairs
    return torch.where(pairs > 0, trend, float("nan")).reshape(lead)


def _slope_functional(mask: torch.Tensor) -> torch.Tensor:
    """Weights ``[n]`` on the valid entries whose dot product with a map is the mean over diagonals
    of each diagonal's least-squares slope against the column index (a linear trend measure)."""
    S = mask.shape[-1]
    off = _offsets(S, mask.device)[mask]
    col = torch.arange(S, device=mask.device).expand(S, S)[mask].to(torch.float64)
    nk = torch.bincount(off, minlength=S).to(torch.float64)
    mean_c = torch.zeros(S, dtype=torch.float64, device=mask.device).scatter_add_(0, off, col) / nk.clamp_min(1)
    dc = col - mean_c[off]
    ss = torch.zeros(S, dtype=torch.float64, device=mask.device).scatter_add_(0, off, dc * dc)
    use = (nk >= 3) & (ss > 0)
    w = torch.where(use[off], dc / ss.clamp_min(1e-300)[off], torch.zeros_like(dc))
    return w / max(int(use.sum()), 1)


def trend_pvalue(groups, weights=None, include_diagonal: bool = False, exclude_keys: Sequence[int] = ()) -> float | None:
    """Two-sided sign-flip p-value of "no linear trend along the diagonals" (mean within-diagonal
    slope = 0) from group means ``[G, S, S]``."""
    g, w = _groups(groups, weights, exclude_keys)
    mask = _entries(g, include_diagonal)
    if int(mask.sum()) < 2:
        return None
    return signflip_pvalue((g[:, mask] @ _slope_functional(mask))[:, None], w)


def locality(m, groups=None, weights=None, include_diagonal: bool = False,
             exclude_keys: Sequence[int] = ()) -> float | None:
    """``2P - 1`` with P the fraction of same-row key pairs whose score rises towards the query.

    +1: every query's scores rise monotonically as keys approach it; ``None`` for a flat map.
    Excluded keys take part in no pair.
    """
    m = mask_keys(m, exclude_keys)
    if m.ndim != 2:
        raise ValueError("locality takes one [S, S] map")
    if is_flat(m, groups, weights, include_diagonal):
        return None
    return _locality(*pair_counts(m, include_diagonal))


def _locality(rises: torch.Tensor, tied: torch.Tensor, pairs: torch.Tensor) -> float | None:
    """``2P - 1`` from a map's pair counts (ties count one half); None without a pair."""
    v = float(pair_fraction(rises, tied, pairs, ties=0.5))
    return None if v != v else 2.0 * v - 1.0


def describe_map(m, groups=None, weights=None, *, include_diagonal: bool = False, exclude_keys: Sequence[int] = (),
                 locality_map=None, locality_all_keys: bool = False) -> dict:
    """Every number poslens reports on one score map, with its noise floor where groups are given.

    Keys: ``relativity_index``, ``locality``, ``diagonal_trend`` (+1 = further right is higher),
    ``within_diag_rms`` (score units); with at least two groups also ``flat_p`` (sign-flip p of
    "no variation"), ``nonrelative_p`` (of "purely relative"), ``trend_p`` (of "no trend along
    the diagonals"), ``within_diag_rms_noise`` (the RMS that sampling noise alone gives the
    mean map's diagonal-normalised entries), ``within_diag_rms_signal`` (noise removed),
    ``diagonal_trend_se`` (jackknife over groups), ``noise_groups``. Without them ``noise`` gives the code of why
    (:data:`NOISE_NOTES`).
    ``locality_map`` (optional) is a position subsample of ``m`` to compute the O(S^3) locality on.
    ``locality_all_keys``: also ``locality_all_keys``, the :func:`locality` of the map with the
    excluded keys taken in (None where the map is flat), from the same pair counts.
    """
    m = as_float64(m)
    if m.ndim != 2:
        raise ValueError("describe_map takes one [S, S] map")
    G = 0 if groups is None else int(groups.shape[0])
    # what the numbers below share is computed once: the masked map and its valid entries, the masked
    # groups, their joint mask and its two projections (centred, diagonal-normalised)
    mk = mask_keys(m, exclude_keys)
    mask_m = _entries(mk, include_diagonal)
    v = mk[mask_m]
    g, w = _groups(groups, weights, exclude_keys)
    mask_g = _entries(g, include_diagonal) if G >= 2 else None
    mask = mask_g & mask_m if G >= 2 else None
    vals_g = g[:, mask] if mask is not None else None  # [G, n]: the groups' jointly valid entries
    centred_g = vals_g - vals_g.mean(-1, keepdim=True) if mask is not None else None
    within_g = _within(g, mask) if mask is not None else None
    within_m = _within(mk, mask_m)
    # the flatness tests: the map's (groups with the keys excluded) and relativity_index's, which
    # judges flatness on the groups with every key
    p_flat = p_flat_ri = None
    same = False  # the groups' own mask is the joint one: the flat p-value is flat_p
    if v.numel() >= 2 and decisive(G):
        same = torch.equal(mask_g, mask)
        p_flat = None if int(mask_g.sum()) < 2 else signflip_pvalue(centred_g if same else _centred(g, mask_g), w)
        p_flat_ri = p_flat
        if any(0 <= k < m.shape[-1] for k in exclude_keys):  # flat_pvalue(groups, weights, include_diagonal)
            g_all = as_float64(groups)
            mask_all = _entries(g_all, include_diagonal)
            p_flat_ri = None if int(mask_all.sum()) < 2 else signflip_pvalue(_centred(g_all, mask_all), w)
    flat = v.numel() < 2 or _flat_verdict(v, p_flat)
    flat_ri = v.numel() < 2 or _flat_verdict(v, p_flat_ri)
    cross = cross_mean_square(within_g, w) if mask is not None else None
    out = {
        "relativity_index": None if flat_ri else _relativity(mk, mask_m, within_m, centred_g, cross, w),
        "locality": None,
        "diagonal_trend": diagonal_trend(mk, include_diagonal),
        "within_diag_rms": float("nan") if int(mask_m.sum()) == 0 else float((within_m ** 2).mean().sqrt()),
    }
    if not flat:
        lm = mk if locality_map is None else mask_keys(locality_map, exclude_keys)
        counts = pair_counts(lm, include_diagonal)
        out["locality"] = _locality(*counts)
        if locality_all_keys:  # the excluded columns' pairs added to the same counts
            full = m if locality_map is None else as_float64(locality_map)
            out["locality_all_keys"] = None if is_flat(full, include_diagonal=include_diagonal) else _locality(
                *(a + b for a, b in zip(counts, key_pair_counts(full, exclude_keys, include_diagonal))))
    elif locality_all_keys:
        out["locality_all_keys"] = None
    out["flat"] = flat
    if mask is not None and not bool(mask.any()):  # e.g. a one-position map: nothing to estimate noise on
        out["noise"] = NO_VALID_ENTRY
    elif G >= 2:
        sig, noise = cross
        out.update({
            "flat_p": p_flat if p_flat is not None and same else signflip_pvalue(centred_g, w),
            "nonrelative_p": signflip_pvalue(within_g, w),
            "trend_p": signflip_pvalue((vals_g @ _slope_functional(mask))[:, None], w),
            "within_diag_rms_noise": float(max(noise, 0.0) ** 0.5),
            "within_diag_rms_signal": float(max(sig, 0.0) ** 0.5),
            "noise_groups": G,
        })
        loo = leave_one_out_means(g * w.reshape(-1, 1, 1), w)  # every group's leave-one-out mean map
        out["diagonal_trend_se"] = jackknife_se_of(diagonal_trends(loo, include_diagonal).tolist())
        if not decisive(G):
            out["noise"] = TOO_FEW_GROUPS
    else:
        out["noise"] = NO_GROUPS
    return out


# --------------------------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------------------------
def causal_view(m: torch.Tensor, include_diagonal: bool = True) -> torch.Tensor:
    """NaN above the diagonal (entries a causal query never sees)."""
    S = m.shape[-1]
    i = torch.arange(S, device=m.device)
    keep = i[:, None] >= i[None, :] if include_diagonal else i[:, None] > i[None, :]
    return torch.where(keep, m, torch.full_like(m, float("nan")))


def window_view(m: torch.Tensor, window: int | None) -> torch.Tensor:
    """NaN where the key is ``window`` or more positions before the query (outside a sliding window)."""
    if not window or window >= m.shape[-1]:
        return m
    i = torch.arange(m.shape[-1], device=m.device)
    far = (i[:, None] - i[None, :]) >= window
    return m.masked_fill(far, float("nan"))


# --------------------------------------------------------------------------------------------
# the scan's score-map numbers (poslens.capture.scan.finalize), as they were
# --------------------------------------------------------------------------------------------
SINK_COLUMNS = (0,)


def _subsample(m: torch.Tensor, k: int) -> torch.Tensor:
    S = m.shape[-1]
    if S <= k:
        return m
    idx = aps_positions(S, k, device=m.device)
    return m[..., idx, :][..., idx] if m.ndim >= 2 and m.shape[-2] == S else m[..., idx]


def _opt(x):
    return None if x is None else float(x)


def score_map_numbers(sc: torch.Tensor, groups: torch.Tensor | None, counts: torch.Tensor | None, grid: torch.Tensor,
                      locality_positions: int, sink_columns=SINK_COLUMNS, grid_map: torch.Tensor | None = None) -> dict:
    """The score-map numbers of one layer: sink-excluded headline values on the full map (relativity
    index, locality on at most ``locality_positions`` positions, signed diagonal trend, within-diagonal
    RMS), the with-sink values beside them, and the noise floor from the group maps on ``grid``
    (p-values, RMS noise floor, trend standard error: :func:`poslens.metrics.diagonal.describe_map`).
    Where ``grid`` is coarser than the map, the same statistics of the grid map (``grid_*``, the ones
    the p-values and standard error test) are given too, under ``noise_positions`` positions; where it
    covers the map, the headline relativity index is the noise-corrected one (group cross-products,
    ``relativity_index_noise_corrected``), the uncorrected index in ``relativity_index_uncorrected``."""
    sub = _subsample(sc, locality_positions)
    out = describe_map(sc, exclude_keys=sink_columns, locality_map=sub, locality_all_keys=True)
    # the with-sink locality from the same pair counts; where the sink-excluded map is constant (no counts)
    # it is counted on its own
    locality_with_sink = out.pop("locality_all_keys")
    if out["flat"]:
        locality_with_sink = locality(sub)
    if groups is not None and groups.shape[0] >= 2:
        g = causal_view(groups, include_diagonal=True)
        on_grid = sc[grid][:, grid] if grid_map is None else grid_map  # grid_map: the mean map on the grid
        noise = describe_map(causal_view(on_grid), g, counts, exclude_keys=sink_columns)
        for key in ("flat_p", "nonrelative_p", "trend_p", "within_diag_rms_noise", "diagonal_trend_se", "noise_groups"):
            out[key] = noise.get(key)
        out["flat"] = bool(noise["flat"])
        out["noise_positions"] = int(grid.numel())
        if grid.numel() < sc.shape[-1]:
            # the p-values, noise floor and standard error belong to the statistics of the grid map: give
            # those beside the full-map headline numbers, so each uncertainty sits next to its own statistic
            for key in ("relativity_index", "diagonal_trend", "within_diag_rms", "locality"):
                out[f"grid_{key}"] = noise.get(key)
        elif noise.get("relativity_index") is not None:
            # the groups cover the whole map: the headline index is corrected with them (variances from
            # products of different groups only), the uncorrected one kept beside it
            out["relativity_index_uncorrected"] = out["relativity_index"]
            out["relativity_index"] = noise["relativity_index"]
            out["relativity_index_noise_corrected"] = True
        out.pop("noise", None)
        if noise.get("noise"):
            out["noise"] = noise["noise"]
        if out["flat"]:
            out["relativity_index"] = out["locality"] = None
            if "relativity_index_uncorrected" in out:
                out["relativity_index_uncorrected"] = None
    else:
        out["noise"] = NO_GROUPS
    flat = out["flat"] and groups is not None and groups.shape[0] >= 2
    out["relativity_index_with_sink"] = None if flat else _opt(relativity_index(sc))
    out["locality_with_sink"] = None if flat else _opt(locality_with_sink)
    out["sink_columns"] = list(sink_columns)
    return out
