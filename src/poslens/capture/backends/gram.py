"""The symmetric Gram ``a @ a.T`` of the cosine maps, on the CPU and on a GPU."""

from __future__ import annotations

import numpy as np
import torch

from poslens.metrics.ties import equal_row_representatives as _equal_row_representatives
from poslens.runtime import numpy_blas_threads


def symmetric_gram(a: torch.Tensor, out: torch.Tensor | None = None, *, lower: bool = False) -> torch.Tensor:
    """``a @ a.T`` (float32 ``[S, S]``, into ``out`` if given), exactly symmetric.

    On a GPU one product. On the CPU with ``lower`` (float32) only the lower triangle, diagonal
    included, is written and the strict upper triangle of ``out`` is left as it was (the caller
    reads the lower triangle):

    - on one thread one symmetric rank-k product (scipy's BLAS ``ssyrk``: half the arithmetic, the
      fastest of the ways measured at one thread);
    - on more threads row bands of torch's own products (:func:`_lower_bands`, about 56 % of the full
      arithmetic): scipy's bundled OpenBLAS leaves its worker threads spinning after a call, and
      torch's next products on the same cores ran about half as fast again, which made a scan with
      every statistic about a tenth slower on two threads than the bands do.

    Without ``lower`` numpy's ``a @ a.T`` (a symmetric rank-k product, mirrored). The kernels' blocks
    (or threads) can round the same dot product apart, so rows of ``a`` that are bitwise equal get
    their entries from one row and column afterwards (:func:`_equal_row_representatives`): exact
    ties stay ties, as in one whole product."""
    S = a.shape[0]
    if a.is_cuda or a.dtype != torch.float32:
        return torch.matmul(a, a.T, out=out)
    if out is None:
        out = (torch.zeros(S, S, dtype=a.dtype, device=a.device) if lower
               else torch.empty(S, S, dtype=a.dtype, device=a.device))
    a = a.contiguous()
    threads = torch.get_num_threads()
    if lower and threads > 1:
        _lower_bands(a, out)
    else:
        _numpy_gram(a, out, lower, threads)
    return tie_rows(out, a, lower=lower)


def tie_rows(out: torch.Tensor, a: torch.Tensor, *, lower: bool = False) -> torch.Tensor:
    """``out [S, S]``, a symmetric product of ``a [S, K]``'s rows (its lower triangle alone with
    ``lower``), with the entries of rows of ``a`` that are bitwise equal taken from the first such row
    and column, in place: exact ties stay ties however the product was blocked."""
    S = a.shape[0]
    rep = _equal_row_representatives(a)
    if rep is not None:  # identical rows: their entries from one row and column, exact ties again
        if lower:
            full = out.tril() + out.tril(-1).T
            below = torch.ones(S, S, dtype=torch.bool, device=a.device).tril_()
            out.copy_(torch.where(below, full.index_select(0, rep).index_select(1, rep), out))
        else:
            out.copy_(out.index_select(0, rep).index_select(1, rep))
    return out


#: rows per band of :func:`_lower_bands` at the least (narrower products run below GEMM speed)
BAND_ROWS = 128


def _lower_bands(a: torch.Tensor, out: torch.Tensor) -> None:
    """The lower triangle of ``a @ a.T`` into ``out`` in row bands of torch products: band ``[r0, r1)``
    against the rows before it (written whole) and against itself (its lower triangle written). About
    eight bands of at least :data:`BAND_ROWS` rows: ``(n + 1) / 2n`` of the full product's arithmetic."""
    S = a.shape[0]
    n = max(1, min(8, S // BAND_ROWS))
    edges = [S * i // n for i in range(n + 1)]
    for r0, r1 in zip(edges[:-1], edges[1:]):
        if r0 > 0:
            torch.mm(a[r0:r1], a[:r0].T, out=out[r0:r1, :r0])
        block = out[r0:r1, r0:r1]
        tri = torch.ones(r1 - r0, r1 - r0, dtype=torch.bool, device=a.device).tril_()
        block.copy_(torch.where(tri, torch.mm(a[r0:r1], a[r0:r1].T), block))


def _numpy_gram(a: torch.Tensor, out: torch.Tensor, lower: bool, threads: int) -> None:
    """``a @ a.T`` into ``out`` through numpy's BLAS on ``threads`` threads: its lower triangle alone
    with ``lower`` (scipy's ``ssyrk``), else whole."""
    an = a.numpy()
    with numpy_blas_threads(threads):
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
