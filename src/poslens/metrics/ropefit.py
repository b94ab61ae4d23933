"""The RoPE decomposition of a head's logit (arXiv 2601.08297): does a rank-one query/key pair,
rotated by RoPE, predict the head's slash profile? Tensors in, numbers out.

Inputs are a scan's tensors: ``q_gram [L, H, D, D]`` / ``k_gram [L, Hk, D, D]`` (per-token second
moments of pre-RoPE queries and keys; eigenvalues = squared singular values of the tokens x
head_dim matrix / tokens) and ``dim_logit [L, H, D]`` (per-dimension mean post-RoPE logit
contribution over causal pairs).

**Rank-one reading.** With q_i ≈ a u and k_j ≈ b v (u, v the top eigenvectors of the pre-RoPE
second moments) and pair l = dims (l, l + r/2) read as the complex number
``u_l = u[l] + i u[l + r/2]``, Hugging Face's rotate_half rotation multiplies u_l by
``exp(i θ_l p)`` at position p, so

    logit(i - j) = Σ_l A_l cos(θ_l (i - j) + φ_l),   A_l = c |u_l| |v_l|,   φ_l = arg u_l - arg v_l

with ``c = scaling · sqrt(λ_q λ_k)`` (λ the top eigenvalues: the rms coefficients a, b) and the
sign of the product a·b taken from ``dim_logit`` (a negative sign adds π to every φ_l). The
predicted slash profile is the causal softmax of that logit, row by row, averaged over rows
exactly as SlashScore is; the predicted peak offset is its arg-max. Pairs are put into RoPE bands
(:func:`poslens.rope.frequency_bands`); a band's *usage* is its share of Σ A_l and its
*contribution to the peak* is ``Σ_{l in band} A_l cos(θ_l Δ* + φ_l)`` minus that sum's mean over
all offsets (how much the band lifts the peak above the average offset). *(inferred: the paper
gives no thresholds or shares.)*
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from poslens.errors import PoslensError
from poslens.metrics.diagonal import as_float64
from poslens.metrics.rank import top_direction
from poslens.rope import BANDS, frequency_bands, inv_freq


def pair_polar(u, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(|u_l|, arg u_l)`` of the rotary pairs ``u_l = u[l] + i u[l + r/2]`` (rotate_half layout)."""
    u = as_float64(u)
    half = rotary_dim // 2
    z = torch.complex(u[..., :half], u[..., half:rotary_dim])
    return z.abs(), z.angle()


def rank_one_logit(A, phi, theta, offsets) -> torch.Tensor:
    """``Σ_l A_l cos(θ_l Δ + φ_l)`` for every Δ in ``offsets``; returns ``[len(offsets)]``."""
    d = as_float64(offsets)
    return (as_float64(A)[None, :] * torch.cos(d[:, None] * as_float64(theta)[None, :] + as_float64(phi)[None, :])).sum(-1)


def causal_pair_mean(values_by_offset: torch.Tensor, S: int) -> torch.Tensor:
    """Mean over causal pairs j <= i < S of a function of Δ = i - j given as ``[..., S]`` (Δ has S - Δ pairs)."""
    w = (S - torch.arange(S, dtype=torch.float64, device=values_by_offset.device))
    return (values_by_offset * w).sum(-1) / w.sum()


def predicted_slash_profile(logit_by_offset, S: int | None = None) -> torch.Tensor:
    """SlashScore(Δ) of a head whose logit depends on Δ = i - j alone, under the causal softmax.

    Row i attends to Δ = 0..i with weights softmax(logit[0..i]); SlashScore(Δ) is the mean of
    row i's weight at Δ over rows i >= Δ, exactly as the scan accumulates it.
    """
    z = as_float64(logit_by_offset)
    S = z.shape[-1] if S is None else S
    z = z[:S]
    lse = torch.logcumsumexp(z, 0)  # [S] row normalisers: row i sums over Δ = 0..i
    p = torch.exp(z[None, :] - lse[:, None])  # [row i, Δ]
    offs = torch.arange(S, device=z.device)
    valid = offs[None, :] <= offs[:, None]
    p = torch.where(valid, p, torch.zeros((), dtype=p.dtype, device=z.device))
    return p.sum(0) / (S - offs.to(torch.float64))


@dataclass
class RopeDecomposition:
    """Rank-one RoPE reading of one head (see the module docstring)."""

    A: torch.Tensor  # [r/2] amplitudes, logit units (sign folded into phi)
    phi: torch.Tensor  # [r/2] phases
    theta: torch.Tensor  # [r/2] frequencies
    bands: list[str]  # [r/2] band labels
    sign: int  # sign of the coefficient product a·b read from dim_logit
    coherence: float | None  # fitted E[a b] / sqrt(E a² E b²) from dim_logit (1: constant coefficients)
    pair_fit: float | None  # cosine between observed and rank-one per-pair logit contributions
    logit: torch.Tensor  # [S] predicted logit by offset
    profile: torch.Tensor  # [S] predicted SlashScore(Δ)

    def band_usage(self) -> dict[str, float]:
        tot = float(self.A.sum()) or 1.0
        return {b: float(sum(a for a, lab in zip(self.A.tolist(), self.bands) if lab == b)) / tot for b in BANDS}

    def band_peak_contribution(self, delta: int) -> dict[str, float]:
        S = self.logit.shape[-1]
        offs = torch.arange(S, dtype=torch.float64, device=self.logit.device)
        out = {}
        for b in BANDS:
            idx = [l for l, lab in enumerate(self.bands) if lab == b]
            if not idx:
                out[b] = 0.0
                continue
            c = rank_one_logit(self.A[idx], self.phi[idx], self.theta[idx], offs)
            out[b] = float(c[delta] - c.mean())
        return out


def rope_decomposition(q_gram, k_gram, dim_logit, *, rotary_dim: int, base: float | None, scaling: float,
                       seq_len: int, theta=None, attention_scaling: float = 1.0) -> RopeDecomposition:
    """Rank-one RoPE decomposition of one head from its ``q_gram [D, D]``, its KV head's
    ``k_gram [D, D]`` and its ``dim_logit [D]`` (see the module docstring).

    ``theta`` is the model's own ``inv_freq`` (as the scan records it: scaled RoPE, Gemma 3's two
    bases); without it ``base^(-2l/r)`` is recomputed. ``attention_scaling`` is the factor the model's
    rotary module multiplies cos/sin by (YaRN, LongRoPE): the logit carries its square."""
    if theta is not None:
        rotary_dim = 2 * len(theta)
    u, lam_q = top_direction(q_gram)
    v, lam_k = top_direction(k_gram)
    if rotary_dim < 2 or rotary_dim > u.shape[0] or rotary_dim % 2:
        raise PoslensError(f"rotary dimension {rotary_dim} does not fit head_dim {u.shape[0]}.")
    half = rotary_dim // 2
    mu, au = pair_polar(u, rotary_dim)
    mv, av = pair_polar(v, rotary_dim)
    theta = inv_freq(rotary_dim, base) if theta is None else as_float64(theta)
    mag = scaling * attention_scaling ** 2 * math.sqrt(lam_q * lam_k)
    A_unit = mu * mv
    phi = au - av
    S = int(seq_len)
    offs = torch.arange(S, dtype=torch.float64, device=u.device)
    # Per-pair mean logit over causal pairs for unit coefficients: the rank-one prediction of
    # dim_logit's pair sums, up to the scalar E[a b]·scaling. Its sign is the sign of a·b.
    per_pair = A_unit[:, None] * torch.cos(offs[None, :] * theta[:, None] + phi[:, None])  # [half, S]
    g = causal_pair_mean(per_pair, S)  # [half]
    dl = as_float64(dim_logit)
    obs = dl[:half] + dl[half:rotary_dim]
    gg = float((g * g).sum())
    fit = float((obs * g).sum()) / gg if gg > 0 else 0.0
    sign = -1 if fit < 0 else 1
    denom = float(obs.norm() * g.norm())
    # both against the sign-folded prediction sign * g (the one the logit below uses): 1 for constant
    # coefficients whatever the arbitrary signs of the two eigenvectors
    pair_fit = sign * float((obs * g).sum()) / denom if denom > 0 else None
    coherence = sign * fit / mag if mag > 0 else None
    A = mag * A_unit
    phi = phi + (math.pi if sign < 0 else 0.0)
    logit = rank_one_logit(A, phi, theta, offs)
    bands = frequency_bands(rotary_dim, base, S, theta=theta)
    return RopeDecomposition(A=A, phi=phi, theta=theta, bands=bands, sign=sign, coherence=coherence,
                             pair_fit=pair_fit, logit=logit, profile=predicted_slash_profile(logit))


