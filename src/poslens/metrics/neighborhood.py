"""Neighbourhood metrics of self-similarity maps (arXiv 2501.00073).

The adjacency probability score (APS) counts, over all position triples j < k < i, how often
query row i is more similar to the nearer key k than to the farther key j:
``APS = #{(j, k, i): j < k < i, S[i, k] > S[i, j]} / C(T, 3)``; 1 = every row rises
monotonically towards the diagonal, 0.5 = chance.
"""

from __future__ import annotations

import torch


def rising_pair_fraction(m, include_diagonal: bool = False, ties: float = 0.0, chunk_elems: int = 2**24) -> torch.Tensor:
    """Fraction of same-row key pairs (j < k, both visible to row i) where ``m[i, k] > m[i, j]``.

    Visible means ``k < i`` (or ``k <= i`` with ``include_diagonal``). Works on ``[..., T, T]``
    and returns ``[...]``. Ties count ``ties`` (0 as in the APS definition, 0.5 for a symmetric
    trend measure). Cost is O(T^3) comparisons, done in row chunks with bounded memory.
    """
    m = torch.as_tensor(m)
    m = m.to(torch.float64) if not m.is_floating_point() else m
    T = m.shape[-1]
    lead = m.shape[:-2]
    flat = m.reshape(-1, T, T)
    B = flat.shape[0]
    hits = torch.zeros(B, dtype=torch.float64, device=m.device)
    total = 0
    jj = torch.arange(T, device=m.device)
    pair_upper = jj[:, None] < jj[None, :]  # j < k
    rows_per_chunk = max(1, chunk_elems // max(1, B * T * T))
    for start in range(0, T, rows_per_chunk):
        rows = torch.arange(start, min(T, start + rows_per_chunk), device=m.device)
        limit = rows + (1 if include_diagonal else 0)  # keys visible: index < limit
        vis = jj[None, :] < limit[:, None]  # [R, T]
        pairs = pair_upper[None] & vis[:, :, None] & vis[:, None, :]  # [R, j, k]
        r = flat[:, rows, :]  # [B, R, T]
        greater = (r[:, :, None, :] > r[:, :, :, None]).to(torch.float64)  # [B,R,j,k]: m[i,k] > m[i,j]
        if ties:
            greater = greater + ties * (r[:, :, None, :] == r[:, :, :, None]).to(torch.float64)
        hits += (greater * pairs[None]).sum(dim=(1, 2, 3))
        total += int(pairs.sum())
    out = hits / max(total, 1)
    return out.reshape(lead)


def adjacency_probability_score(sim) -> torch.Tensor:
    """APS of a self-similarity matrix ``[..., T, T]`` (arXiv 2501.00073); 1 = perfect adjacency."""
    return rising_pair_fraction(sim, include_diagonal=False, ties=0.0)


def norm_score(norms) -> torch.Tensor:
    """The same triple count applied to ``-||h_i||``: 1 when norms shrink monotonically with position.

    ``norms`` is ``[..., T]``. Each pair j < k is counted once for every later row i > k, as in
    the APS count.
    """
    n = -torch.as_tensor(norms).to(torch.float64)
    T = n.shape[-1]
    sim = n[..., None, :].expand(*n.shape[:-1], T, T)
    return adjacency_probability_score(sim)
