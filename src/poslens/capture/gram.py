"""The symmetric Gram ``a @ a.T`` of the cosine maps, on the CPU and on a GPU."""

from __future__ import annotations

import numpy as np
import torch

from poslens.metrics.ties import equal_row_representatives as _equal_row_representatives
from poslens.runtime import numpy_blas_threads


def symmetric_gram(a: torch.Tensor, out: torch.Tensor | None = None, *, lower: bool = False) -> torch.Tensor:
    """``a @ a.T`` (float32 ``[S, S]``, into ``out`` if given), exactly symmetric.

    On a GPU one product. On the CPU one symmetric rank-k product (BLAS ``syrk``: half the
    arithmetic) on as many threads as torch uses. With ``lower`` (CPU float32) only the lower
    triangle, diagonal included, is written and the strict upper triangle of ``out`` is left as it
    was (scipy's ``ssyrk``; the caller reads the lower triangle): numpy's ``a @ a.T``, the same
    product, spends a tenth of its time mirroring the triangle, and torch's full product does
    twice the arithmetic. The kernel's blocks (or threads) can round the same dot
    product apart, so rows of ``a`` that are bitwise equal get their entries from one row and
    column afterwards (:func:`_equal_row_representatives`): exact ties stay ties, as in one whole
    product."""
    S = a.shape[0]
    if a.is_cuda or a.dtype != torch.float32:
        return torch.matmul(a, a.T, out=out)
    if out is None:
        out = torch.zeros(S, S, dtype=a.dtype, device=a.device) if lower else torch.empty(S, S, dtype=a.dtype)
    a = a.contiguous()
    an = a.numpy()
    with numpy_blas_threads(torch.get_num_threads()):
        if lower:
            from scipy.linalg import blas

            # a C-ordered [S, K] is a Fortran-ordered [K, S] (its transpose), and so is out's transpose:
            # ssyrk(trans=1) forms (a^T)^T a^T = a a^T in its upper triangle (Fortran), out's lower
            ft = out.numpy().T
            got = blas.ssyrk(1.0, an.T, trans=1, lower=0, c=ft, overwrite_c=1)
            if not np.shares_memory(got, ft):  # f2py copied the workspace (it should not): write it back
                ft[...] = got
        else:
            np.matmul(an, an.T, out=out.numpy())  # numpy takes a @ a.T as a symmetric rank-k product
    rep = _equal_row_representatives(a)
    if rep is not None:  # identical rows: their entries from one row and column, exact ties again
        if lower:
            full = out.tril() + out.tril(-1).T
            below = torch.ones(S, S, dtype=torch.bool).tril_()
            out.copy_(torch.where(below, full.index_select(0, rep).index_select(1, rep), out))
        else:
            out.copy_(out.index_select(0, rep).index_select(1, rep))
    return out
