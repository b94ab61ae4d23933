"""Exact ties kept exact: identical vectors get bitwise-identical similarities.

A product ``u @ uᵀ`` computed in blocks (separate products, or a BLAS kernel that treats the edge
rows and columns of a tile with another accumulation order) can round the same dot product
differently in different places. Two identical rows of ``u`` (a repeated token's embedding) then
get similarities to a third row that differ in the last bit: a tie that a rank count such as the
APS (arXiv 2501.00073) takes for a rise or a fall, differently on different CPUs. Which kernels a
BLAS picks depends on the CPU, so the repair is needed wherever ties are counted.
"""

from __future__ import annotations

import torch

#: columns sampled to find candidate identical rows
TIE_SAMPLE_COLUMNS = 16

_INT_OF = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
           torch.bfloat16: torch.int16}


def equal_row_representatives(a: torch.Tensor) -> torch.Tensor | None:
    """For the rows of ``a [S, K]``: the index of the first row bitwise equal to each (itself when none
    is earlier), or None when all rows differ. Candidates share the bits of a few sampled columns; each
    is checked against its group's first row over all columns before it is tied to it. The indices lie on
    ``a``'s device."""
    S, K = a.shape
    if S < 2 or K == 0:
        return None
    as_int = _INT_OF[a.dtype]
    dev = a.device
    _, inv = torch.unique(_row_keys(a), return_inverse=True)
    if int(inv.max()) == S - 1:  # every key distinct: no identical rows
        return None
    rows = torch.arange(S, device=dev)
    first = torch.full((S,), S, dtype=torch.long, device=dev).scatter_reduce_(0, inv, rows, "amin")[inv]
    cand = (first != rows).nonzero().squeeze(1)
    same = (a[cand].contiguous().view(as_int) == a[first[cand]].contiguous().view(as_int)).all(1)
    rep = rows.clone()
    rep[cand[same]] = first[cand[same]]
    return rep if bool(same.any()) else None


def tie_columns(sim: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """``sim [B, T, T]`` (rows: queries, columns: keys, both the rows of ``vectors [B, T, d]``) with
    every column of a repeated vector replaced by the column of its first copy, in place: within a
    row, identical keys then compare as exact ties. A column's first copy comes no later, so the
    strict lower triangle reads only entries at or below it."""
    for b in _sequences_with_equal_keys(vectors):
        rep = equal_row_representatives(vectors[b])
        if rep is not None:
            sim[b] = sim[b][:, rep]
    return sim


def _sequences_with_equal_keys(vectors: torch.Tensor) -> list[int]:
    """The sequences of ``vectors [B, T, d]`` where two rows share the bits of the sampled columns
    (the candidates :func:`equal_row_representatives` then checks), found for the whole batch at once."""
    if vectors.shape[1] < 2 or vectors.shape[2] == 0:
        return []
    key = _row_keys(vectors).sort(dim=1).values  # [B, T]
    return (key[:, 1:] == key[:, :-1]).any(1).nonzero().flatten().tolist()


def _row_keys(a: torch.Tensor) -> torch.Tensor:
    """A key per row of ``a [..., S, K]`` from the exact bits of a few sampled columns (-0.0 and +0.0
    differ: no false tie): equal rows, equal keys (integer arithmetic, wrapping)."""
    K = a.shape[-1]
    cols = torch.linspace(0, K - 1, min(K, TIE_SAMPLE_COLUMNS), device=a.device).round().long()
    bits = a[..., cols].contiguous().view(_INT_OF[a.dtype]).long()
    mult = torch.arange(1, 2 * cols.numel(), 2, dtype=torch.long, device=a.device) * 0x9E3779B1  # odd multipliers
    return (bits * mult).sum(-1)
