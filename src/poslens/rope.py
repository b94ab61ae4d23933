"""RoPE math in one place: frequencies, rotation and its inverse, frequency bands.

Layout follows Hugging Face's ``rotate_half``: dimension l is paired with l + r/2 where r is the
rotary dimension (r = head_dim unless the model rotates only a prefix, as Phi-3 does).
``theta_l = base^(-2l/r)``, l = 0 is the highest frequency (Su et al. 2021; layout as in
transformers' modeling_llama).
"""

from __future__ import annotations

import math

import torch


def inv_freq(rotary_dim: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """``theta_l = base^(-2l/rotary_dim)`` for l = 0 .. rotary_dim/2 - 1 (float64)."""
    if rotary_dim % 2:
        raise ValueError(f"rotary dimension must be even, got {rotary_dim}")
    return base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)


def cos_sin(positions: torch.Tensor, rotary_dim: int, base: float = 10000.0, dtype=torch.float32):
    """``cos, sin`` of shape ``[..., S, rotary_dim]`` in the rotate_half layout."""
    freqs = positions.to(torch.float64)[..., None] * inv_freq(rotary_dim, base, positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x``; the rest pass through (partial rotary)."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


def unapply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`apply_rope` (rotation by the opposite angle)."""
    return apply_rope(x, cos, -sin)


def wavelengths(rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Wavelength in tokens, ``2 pi / theta_l``, of each rotary pair."""
    return 2 * math.pi / inv_freq(rotary_dim, base)


BANDS = ("high", "medium", "low")


def frequency_bands(rotary_dim: int, base: float | None, context_len: int, theta=None) -> list[str]:
    """Label each rotary pair ``high``, ``medium`` or ``low`` by its wavelength against the context.

    *(poslens' choice; the slash paper speaks of medium/high frequencies without thresholds.)*
    ``low``: wavelength >= context length (less than one full turn over the context);
    ``high``: wavelength below the geometric midpoint of [2 pi, context], i.e. sqrt(2 pi * context);
    ``medium``: in between.

    With ``theta`` (the model's own ``inv_freq``: scaled RoPE variants, Gemma 3's per-layer-type
    bases) the wavelengths are ``2 pi / theta`` instead of the recomputed ``base^(-2l/r)``.
    """
    lam = wavelengths(rotary_dim, base) if theta is None else 2 * math.pi / torch.as_tensor(theta, dtype=torch.float64)
    mid = math.sqrt(2 * math.pi * context_len)
    return ["low" if w >= context_len else ("high" if w < mid else "medium") for w in lam.tolist()]
