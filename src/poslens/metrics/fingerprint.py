"""Traits of a model's positional fingerprint: pure functions of a scan's accumulated tensors.

- **Sink** (Gu et al., ICLR 2025, "When Attention Sink Emerges in Language Models"): each head's
  mean attention weight on key 0 over the queries ``1 .. S-1`` (and sequences), from the scan's
  ``sink_heads`` ``[L, H, S]``; per layer, the share of heads above ``eps = 0.3``. Gu et al. average
  over the queries ``t >= k`` including the key's own position (query 0 for key 0, whose weight
  there is always 1); poslens leaves query 0 out, as :func:`poslens.metrics.slash.sink_weight` does.
- **RoPE frequency usage** (Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary
  Positional Encodings useful?"): per head, the share of the q·k energy in each rotary pair, from
  the pre-RoPE chunk norms. Pair ``l``'s term of a logit is ``|q_l| |k_l| cos(...)``; its scale over
  tokens is ``u_l = sqrt(E|q_l|^2 E|k_l|^2)`` (RoPE keeps each pair's norm, so pre- and post-RoPE
  norms agree), and the share is ``u_l / sum of u`` over every pair and every unrotated dimension
  (one term ``sqrt(E q_d^2 E k_d^2)`` each). ``E|q_l|^2`` is the sum of the two diagonal entries of
  the scan's per-token second moment ``q_gram`` of the pair.
- **Massive Q/K dimensions** (Jin et al., ICML 2025, "Massive Values in Self-Attention Modules are
  the Key to Contextual Knowledge Understanding", arXiv 2502.01563): ``M[h, d]``, the L2 norm over
  the sequence of dimension ``d`` of head ``h``'s pre-RoPE queries (keys), is massive when
  ``M[h, d] > lambda * mean(M)`` with ``lambda = 5`` (the paper's Definition 1; the mean over the
  layer's heads and dimensions). poslens takes ``M`` as the RMS over every token scanned,
  ``sqrt(gram[d, d])``: the per-sequence norm over ``sqrt(S)`` pooled over sequences (the paper
  averages per-sequence norms), exact from the scan's second moments, no sample involved.

Pairs follow the layout the scan stores (``"half"``: dims ``l`` and ``l + r/2``; ``"interleaved"``:
``2l`` and ``2l + 1``); ``r`` is the rotary dimension (partial rotary: a prefix of the head).
"""

from __future__ import annotations

import torch

from poslens.errors import PoslensError
from poslens.metrics.diagonal import as_float64
from poslens.metrics.slash import kv_head_of
from poslens.rope import BANDS

#: Gu et al.'s threshold: a head is a sink head when its mean weight on key 0 exceeds it
SINK_EPS = 0.3
#: Jin et al.'s lambda: a dimension is massive when its norm exceeds lambda times the mean norm
MASSIVE_LAMBDA = 5.0
#: the band of dimensions outside the rotary prefix (partial rotary) or of a layer without RoPE
UNROTATED = "unrotated"


# --------------------------------------------------------------------------------------------
# sink
# --------------------------------------------------------------------------------------------
def head_sink(sink_heads) -> torch.Tensor:
    """``[..., S]`` weights on key 0 per query (``sink_heads`` of a scan: ``[L, H, S]``) -> ``[...]``:
    the mean over queries ``1 .. S-1`` (query 0 sees key 0 alone). NaN for ``S < 2``."""
    s = as_float64(sink_heads)
    if s.shape[-1] < 2:
        return torch.full(s.shape[:-1], float("nan"), dtype=torch.float64, device=s.device)
    return s[..., 1:].mean(-1)


def sink_share(head_sinks, eps: float = SINK_EPS) -> torch.Tensor:
    """Share of heads whose sink weight exceeds ``eps``: ``[L, H]`` -> ``[L]`` (Gu et al.'s per-layer
    term of Sink_1^eps; their model-level rate is the mean of this over layers)."""
    s = as_float64(head_sinks)
    if s.ndim < 1 or s.shape[-1] == 0:
        raise PoslensError(f"head sink weights of shape {tuple(s.shape)}: expected [layers, heads].")
    return (s > eps).to(torch.float64).mean(-1)


# --------------------------------------------------------------------------------------------
# RoPE pairs
# --------------------------------------------------------------------------------------------
def rotary_pairs(rotary_dim: int, layout: str = "half") -> tuple[torch.Tensor, torch.Tensor]:
    """Indices ``(a, b)`` of the two dims of each rotary pair ``l = 0 .. r/2 - 1`` (l = 0: highest
    frequency) in the given layout."""
    if rotary_dim % 2 or rotary_dim < 0:
        raise PoslensError(f"rotary dimension {rotary_dim}: must be even and non-negative.")
    half = rotary_dim // 2
    l = torch.arange(half, device="cpu")  # indices into a tensor: they move with it when used
    if layout == "half":
        return l, l + half
    if layout == "interleaved":
        return 2 * l, 2 * l + 1
    raise PoslensError(f"RoPE layout {layout!r}: expected 'half' or 'interleaved'.")


def _diag(gram) -> torch.Tensor:
    g = as_float64(gram)
    if g.ndim < 2 or g.shape[-1] != g.shape[-2]:
        raise PoslensError(f"second-moment tensor of shape {tuple(g.shape)}: expected [..., D, D].")
    return g.diagonal(dim1=-2, dim2=-1)


def pair_energy(gram, rotary_dim: int, layout: str = "half") -> tuple[torch.Tensor, torch.Tensor]:
    """``(E|x_l|^2 [..., r/2], E x_d^2 [..., D - r])`` from per-token second moments ``[..., D, D]``:
    each rotary pair's energy and each unrotated dimension's."""
    d = _diag(gram)
    D = d.shape[-1]
    if rotary_dim > D:
        raise PoslensError(f"rotary dimension {rotary_dim} exceeds the head dimension {D}.")
    a, b = rotary_pairs(rotary_dim, layout)
    rot = torch.zeros(D, dtype=torch.bool, device=d.device)
    rot[a] = True
    rot[b] = True
    return d[..., a] + d[..., b], d[..., ~rot]


def frequency_usage(q_gram, k_gram, rotary_dim: int, layout: str = "half") -> tuple[torch.Tensor, torch.Tensor]:
    """Per query head, the share of q·k energy in each rotary pair and in the unrotated dims.

    ``q_gram`` ``[L, H, D, D]`` and ``k_gram`` ``[L, Hk, D, D]`` (pre-RoPE per-token second moments;
    each query head reads KV head ``kv_head_of(h)``). Returns ``(pairs [L, H, r/2], unrotated [L, H])``
    whose sum over pairs plus the unrotated share is 1 (NaN for a head with no energy at all)."""
    qg, kg = as_float64(q_gram), as_float64(k_gram)
    if qg.ndim != 4 or kg.ndim != 4 or qg.shape[-1] != kg.shape[-1] or qg.shape[1] % kg.shape[1]:
        raise PoslensError(f"q_gram {tuple(qg.shape)} / k_gram {tuple(kg.shape)}: expected [L, H, D, D] and "
                           "[L, Hk, D, D] with Hk dividing H (maps.safetensors of `poslens scan`).")
    H, Hk = qg.shape[1], kg.shape[1]
    kg = kg[:, [kv_head_of(h, H, Hk) for h in range(H)]]
    qp, qu = pair_energy(qg, rotary_dim, layout)
    kp, ku = pair_energy(kg, rotary_dim, layout)
    up, uu = (qp * kp).sqrt(), (qu * ku).sqrt()
    total = up.sum(-1) + uu.sum(-1)
    total = torch.where(total > 0, total, torch.full_like(total, float("nan")))
    return up / total[..., None], uu.sum(-1) / total


def band_shares(pair_shares, unrotated, labels: list[str]) -> dict[str, torch.Tensor]:
    """Pair shares ``[..., r/2]`` summed by band (``labels[l]`` in :data:`poslens.rope.BANDS`, e.g. from
    :func:`poslens.rope.frequency_bands`); ``unrotated`` ``[...]`` as its own band."""
    p = as_float64(pair_shares)
    if len(labels) != p.shape[-1]:
        raise PoslensError(f"{len(labels)} band labels for {p.shape[-1]} rotary pairs.")
    out = {}
    for band in BANDS:
        idx = [l for l, b in enumerate(labels) if b == band]
        out[band] = p[..., idx].sum(-1)
    out[UNROTATED] = as_float64(unrotated)
    return out


# --------------------------------------------------------------------------------------------
# massive dimensions
# --------------------------------------------------------------------------------------------
def dim_rms(gram) -> torch.Tensor:
    """``[..., D]``: the RMS over tokens of each dimension, ``sqrt(gram[d, d])``."""
    return _diag(gram).clamp_min(0.0).sqrt()


def massive_dims(gram, lam: float = MASSIVE_LAMBDA) -> torch.Tensor:
    """Bool ``[L, H, D]``: dims whose RMS exceeds ``lam`` times the mean RMS over the layer's heads and
    dims (Jin et al.'s Definition 1, lambda = 5), from per-token second moments ``[L, H, D, D]``."""
    m = dim_rms(gram)
    if m.ndim != 3:
        raise PoslensError(f"second moments of shape {tuple(as_float64(gram).shape)}: expected [L, H, D, D].")
    return m > lam * m.mean((1, 2), keepdim=True)


def dim_bands(head_dim: int, rotary_dim: int, labels: list[str] | None, layout: str = "half") -> list[str]:
    """The band of every dimension of a head: its rotary pair's label, or :data:`UNROTATED` (dims
    outside the rotary prefix; every dim when ``labels`` is None: a layer without RoPE)."""
    out = [UNROTATED] * head_dim
    if labels is None:
        return out
    a, b = rotary_pairs(rotary_dim, layout)
    for l, (i, j) in enumerate(zip(a.tolist(), b.tolist())):
        out[i] = out[j] = labels[l]
    return out


def massive_by_band(mask, bands: list[str]) -> dict[str, torch.Tensor]:
    """Counts of massive dims per band: ``mask`` ``[..., H, D]`` (e.g. one layer's ``[H, D]``),
    ``bands`` the band of each dim -> ``{band: [...]}`` for :data:`poslens.rope.BANDS` and
    :data:`UNROTATED` (the heads of a layer share their dims' bands)."""
    m = torch.as_tensor(mask, dtype=torch.bool)
    if m.shape[-1] != len(bands):
        raise PoslensError(f"{len(bands)} dimension bands for a head dimension of {m.shape[-1]}.")
    out = {}
    for band in (*BANDS, UNROTATED):
        idx = [d for d, b in enumerate(bands) if b == band]
        out[band] = m[..., idx].sum((-1, -2)) if idx else torch.zeros(m.shape[:-2], dtype=torch.long, device=m.device)
    return out
