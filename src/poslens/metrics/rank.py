"""Rank-one measures of pre-RoPE queries/keys and RoPE frequency-band contributions.

Rank measures (poslens' formulas for the rank-one condition of arXiv 2601.08297) on a head's
tokens x head_dim matrix X, computed from its second-moment matrix ``G = X^T X / n`` whose
eigenvalues are the squared singular values of X (up to the common factor n):

- ``top1_energy = sigma_1^2 / sum sigma^2`` (1 = rank one);
- ``effective_rank = exp(-sum p log p)``, ``p = sigma^2 / sum sigma^2``;
- ``n95``: the number of singular values holding 95 % of the energy.
"""

from __future__ import annotations

import torch

from poslens.errors import PoslensError
from poslens.metrics.diagonal import as_float64
from poslens.metrics.slash import kv_head_of
from poslens.rope import frequency_bands


def spectrum(gram) -> torch.Tensor:
    """Eigenvalues of symmetric PSD matrices ``[..., D, D]``, descending and clamped at 0."""
    g = torch.as_tensor(gram, dtype=torch.float64)
    g = 0.5 * (g + g.transpose(-1, -2))
    return torch.linalg.eigvalsh(g).flip(-1).clamp_min(0.0)


def rank_measures(gram, energy: float = 0.95) -> dict[str, torch.Tensor]:
    """``top1_energy``, ``effective_rank`` and ``n95`` of ``[..., D, D]`` second-moment matrices."""
    ev = spectrum(gram)
    total = ev.sum(-1, keepdim=True).clamp_min(1e-300)
    p = ev / total
    ent = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)
    n_e = (p.cumsum(-1) < energy - 1e-12).sum(-1) + 1
    return {"top1_energy": p[..., 0], "effective_rank": ent.exp(), "n95": n_e.clamp_max(ev.shape[-1])}


def band_contributions(dim_logit, rotary_dim: int | None, base: float | None, context_len: int,
                       inv_freq=None) -> dict[str, torch.Tensor]:
    """Sum per-dimension logit contributions ``[..., D]`` into RoPE bands.

    Pair l (dims l and l + r/2, rotate_half layout) belongs to the band of its wavelength
    (:func:`poslens.rope.frequency_bands`); dimensions beyond the rotary prefix are ``unrotated``.
    Without RoPE everything is ``unrotated``. ``inv_freq`` (the model's own frequencies, as the scan
    records them) takes precedence over ``base^(-2l/r)`` recomputed from ``base``.
    """
    x = torch.as_tensor(dim_logit, dtype=torch.float64)
    D = x.shape[-1]
    out: dict[str, torch.Tensor] = {}
    if inv_freq is not None:
        rotary_dim = 2 * len(inv_freq)
    if not rotary_dim or (base is None and inv_freq is None):
        return {"unrotated": x.sum(-1)}
    labels = frequency_bands(rotary_dim, base, context_len, theta=inv_freq)
    half = rotary_dim // 2
    for band in ("high", "medium", "low"):
        idx = [l for l, b in enumerate(labels) if b == band]
        dims = idx + [l + half for l in idx]
        out[band] = x[..., dims].sum(-1) if dims else torch.zeros(x.shape[:-1], dtype=torch.float64, device=x.device)
    if rotary_dim < D:
        out["unrotated"] = x[..., rotary_dim:].sum(-1)
    return out


def rank_table(q_gram, k_gram) -> dict[str, torch.Tensor]:
    """Rank-one measures per head: ``q_*`` ``[L, H]`` and ``k_*`` ``[L, H]`` (the KV head each query head reads).

    Keys: ``{q,k}_top1_energy`` (σ1²/Σσ²), ``{q,k}_effective_rank`` (exp entropy), ``{q,k}_n95``.
    """
    qg, kg = as_float64(q_gram), as_float64(k_gram)
    if qg.ndim != 4 or kg.ndim != 4 or qg.shape[-1] != kg.shape[-1] or qg.shape[1] % kg.shape[1]:
        raise PoslensError(f"q_gram {tuple(qg.shape)} / k_gram {tuple(kg.shape)}: expected [L, H, D, D] and "
                           "[L, Hk, D, D] with Hk dividing H (maps.safetensors of `poslens scan`).")
    H, Hk = qg.shape[1], kg.shape[1]
    rq, rk = rank_measures(qg), rank_measures(kg)
    idx = torch.tensor([kv_head_of(h, H, Hk) for h in range(H)], device=kg.device)
    out = {f"q_{k}": v for k, v in rq.items()}
    out.update({f"k_{k}": v[:, idx] for k, v in rk.items()})
    return out


# --------------------------------------------------------------------------------------------
# RoPE decomposition
# --------------------------------------------------------------------------------------------
def top_direction(gram) -> tuple[torch.Tensor, float]:
    """Top eigenvector (unit, sign arbitrary) and eigenvalue of one symmetric ``[D, D]`` matrix."""
    g = as_float64(gram)
    g = 0.5 * (g + g.T)
    ev, vec = torch.linalg.eigh(g)
    return vec[:, -1], float(ev[-1].clamp_min(0.0))
