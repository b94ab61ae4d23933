"""RoPE undone: queries and keys before the rotation, from the rotated ones and the model's cos/sin."""

from __future__ import annotations

import torch

from poslens import native


def _unrotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, H, S, D]`` back by the RoPE angle: the inverse of ``x*cos + rotate_half(x)*sin``.

    Written half by half into one output (no ``rotate_half`` copy, no concatenation); dimensions
    beyond the rotary width (partial rotary) pass through. ``cos``/``sin`` are ``[B, 1, S, r]``.
    """
    r = cos.shape[-1]
    h = r // 2
    xf = x.to(torch.float32)
    out = torch.empty_like(xf)
    x1, x2 = xf[..., :h], xf[..., h:r]
    # rotate_half(x) = [-x2, x1]; with -sin: out1 = x1 cos1 + x2 sin1, out2 = x2 cos2 - x1 sin2
    o1, o2 = out[..., :h], out[..., h:r]
    torch.mul(x1, cos[..., :h], out=o1)
    o1.addcmul_(x2, sin[..., :h])
    torch.mul(x2, cos[..., h:], out=o2)
    o2.addcmul_(x1, sin[..., h:], value=-1.0)
    if r < x.shape[-1]:
        out[..., r:] = xf[..., r:]
    return out.to(x.dtype)


def _unrotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Inverse of the interleaved rotation (pairs ``2l, 2l+1``; ``cos``/``sin`` repeat each angle twice):
    ``y = x cos + rot(x) sin`` with ``rot(x)_(2l, 2l+1) = (-x_(2l+1), x_(2l))``. Suffix passes through."""
    r = cos.shape[-1]
    xf = x.to(torch.float32)
    out = xf.clone()
    ye, yo = xf[..., 0:r:2], xf[..., 1:r:2]
    c, s = cos[..., 0:r:2], sin[..., 0:r:2]
    out[..., 0:r:2] = ye * c + yo * s
    out[..., 1:r:2] = yo * c - ye * s
    return out.to(x.dtype)


def unrotate_qk(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half",
                workers=None):
    """Pre-RoPE ``query``/``key`` ``[B, H, S, D]`` from post-RoPE ones and the model's ``cos``/``sin``
    ``[B, S, r]``, in the model's pair layout (``half`` or ``interleaved``); ``workers``: the C
    kernel's threads (:class:`poslens.native.Workers`), else one."""
    cos = cos[:, None].to(torch.float32)
    sin = sin[:, None].to(torch.float32)
    # Inverse rotation divided by attention_scaling^2 (cos^2 + sin^2, for scaled RoPE variants);
    # the division is folded into the small cos/sin tables rather than into a pass over q and k.
    s2 = cos[..., :1] ** 2 + sin[..., :1] ** 2
    cos, sin = cos / s2, sin / s2
    if layout == "interleaved":
        return _unrotate_interleaved(query, cos, sin), _unrotate_interleaved(key, cos, sin)
    if query.device.type == "cpu":  # one pass over each (poslens.native), where it is built
        q, k = native.unrotate_half(query, cos, sin, workers), native.unrotate_half(key, cos, sin, workers)
        if q is not None and k is not None:
            return q, k
    return _unrotate(query, cos, sin), _unrotate(key, cos, sin)


def half_layout_perm(head_dim: int, rotary_dim: int, device=None) -> torch.Tensor:
    """Dimension order that takes interleaved pairs ``(2l, 2l+1)`` to the rotate_half layout
    ``(l, l + r/2)``: ``[0, 2, 4, .., 1, 3, 5, .., r, r+1, ..]`` (the unrotated suffix stays)."""
    return torch.cat([torch.arange(0, rotary_dim, 2, device=device), torch.arange(1, rotary_dim, 2, device=device),
                      torch.arange(rotary_dim, head_dim, device=device)])


def rotate_qk(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """RoPE applied to ``x [B, H, S, D]`` (float32) with the model's ``cos``/``sin`` ``[B, S, r]``, in its
    pair layout: the inverse of :func:`unrotate_qk` (dims beyond the rotary width pass through)."""
    cos = cos[:, None].to(x.dtype)
    sin = sin[:, None].to(x.dtype)
    r = cos.shape[-1]
    out = x.clone()
    if layout == "interleaved":
        xe, xo = x[..., 0:r:2], x[..., 1:r:2]
        c, s = cos[..., 0:r:2], sin[..., 0:r:2]
        out[..., 0:r:2] = xe * c - xo * s
        out[..., 1:r:2] = xo * c + xe * s
        return out
    h = r // 2
    x1, x2 = x[..., :h], x[..., h:r]
    out[..., :h] = x1 * cos[..., :h] - x2 * sin[..., :h]
    out[..., h:r] = x2 * cos[..., h:] + x1 * sin[..., h:]
    return out
