"""``cosine``: self-cosine maps and norms of the residual stream, with each sequence's own APS.

``cosine[k, i, j]`` / ``norms[k, i]``: the cosine of the residual-stream vectors at positions ``i``
and ``j`` and the norm at ``i``, mean over sequences; ``k = 0`` is the input of the first layer
(the embeddings), ``k = m + 1`` the output of captured layer ``m``. ``aps_seq[k]``: the paper's
per-sequence APS (arXiv 2501.00073) of each sequence's own self-cosine map (the same vectors, on at
most ``aps_max_positions`` evenly spaced positions), with its sum of squares: mean and std over
sequences. :mod:`poslens.capture.statistics.builtin.attn_cosine` is the same statistic of the attention output.
"""

from __future__ import annotations

import torch

from poslens import native
from poslens.capture.statistics.builtin.base import BuiltinStatistic
from poslens.capture.backends.gram import symmetric_gram, tie_rows
from poslens.capture.backends.kernels import HALF, half_input_matmuls
from poslens.capture.statistics.points import RESIDUAL_POINTS
from poslens.metrics.neighborhood import (aps_positions, lower_cosines, lower_cosines_aps, per_sequence_aps,
                                         unit_rows_aps)


def add_cosine(capture, names: tuple[str, str, str], index: int, x: torch.Tensor) -> None:
    """Add ``sum_b cos(x_bi, x_bj)``, ``sum_b |x_bi|`` and each sequence's own APS for ``x [B, S, ...]``
    (trailing dims flattened) at ``index`` of the accumulators ``names`` (cosine, norms, APS).

    The unit vectors are written once, sequence-major (``[S, B * d]``), so the batch sum is one
    float32 symmetric product with inner dimension ``B * d`` (:func:`poslens.capture.backends.gram.symmetric_gram`),
    added to the float64 sum. On the CPU, when the per-sequence APS reads every position (``S <=
    aps_max_positions``), the sequences' own maps it computes anyway are summed instead. A
    half-precision model on a GPU takes each sequence's product of its own values (:func:`cosine_rows`).
    """
    cos_name, norm_name, aps_name = names
    B, S = x.shape[:2]
    exact_tf32 = x.is_cuda and x.dtype in HALF
    aps_acc = capture.accs[aps_name]
    blocks = capture.blocks
    if exact_tf32:
        add_aps(aps_acc, index, per_sequence_aps(x, capture.spec.aps_max_positions))
    x = x.to(torch.float32)
    if exact_tf32:
        n = torch.linalg.vector_norm(x, dim=tuple(range(2, x.ndim)))  # [B, S]
        rows = cosine_rows(x.reshape(B, S, -1), n.clamp_min(1e-30).reciprocal())
        gram = blocks.gram_means(rows, x.device) if blocks is not None else rows(0, S)
    else:
        # on the CPU with full maps into reused buffers (no fresh pages to fault in); with --map-size
        # (long contexts) the fold is freed, so it does not sit beside the MLP's activations at the peak
        cpu = x.device.type == "cpu" and blocks is None
        flat = x.reshape(B, S, -1)
        folded = capture.work.buffer("folded", (S, B, flat.shape[-1]), x.device, reuse=cpu)
        # the norms and unit vectors in one read of x (poslens.native), else two torch passes
        n = native.unit_rows(flat, folded, capture.work.workers)
        if n is None:
            n = torch.linalg.vector_norm(flat, dim=-1)  # [B, S]
            torch.mul(flat.transpose(0, 1), n.clamp_min(1e-30).reciprocal_().T[..., None], out=folded)
        # each sequence's APS from the same unit rows, at its evenly spaced positions (what
        # per_sequence_aps computes, without normalising them again)
        idx = aps_positions(S, capture.spec.aps_max_positions).to(x.device)
        finite = bool(torch.isfinite(n).all())
        if cpu and idx.numel() == S:
            # every position in the APS: the sequences' own cosine maps are this batch's, so their sum
            # is the batch's map (no second product of the same vectors)
            maps = lower_cosines(folded.transpose(0, 1))  # [B, S, S], lower triangle and diagonal
            gram = capture.work.held("gram_lower", (S, S), x.device)
            torch.sum(maps, dim=0, out=gram)
            tie_rows(gram, folded.reshape(S, -1), lower=True)
            add_aps(aps_acc, index, lower_cosines_aps(maps, finite))
        else:
            add_aps(aps_acc, index, unit_rows_aps(folded[idx].transpose(0, 1), finite=finite))  # u [B, T, d]
            folded = folded.reshape(S, -1)
            if blocks is not None:
                gram = blocks.gram_means(folded)
            else:
                gram = symmetric_gram(folded, out=capture.work.held("gram_lower", (S, S), x.device), lower=True) \
                    if cpu else symmetric_gram(folded)
    capture.work.add64(capture.accs[cos_name].sum[index], gram, lower=True)  # a lower-triangle accumulator
    capture.accs[norm_name].sum[index] += n.sum(0, dtype=torch.float64)


def add_aps(acc, index: int, aps: torch.Tensor) -> None:
    """Add a batch's per-sequence APS values ``[B]`` (sum and sum of squares, float64)."""
    aps = aps.to(torch.float64)
    acc.sum[index] += aps.sum()
    acc.sumsq[index] += (aps * aps).sum()


def cosine_rows(x: torch.Tensor, inv: torch.Tensor):
    """``rows(r0, r1)``: rows ``r0 .. r1 - 1`` of ``sum_b cos(x_bi, x_bj)`` on columns ``j < r1``, from
    ``x [B, S, d]`` (float32 holding half-precision values) and ``inv [B, S]`` (``1 / |x_bi|``).

    Each sequence's product is taken of the model's own values, which TF32 multiplies exactly
    (float32 accumulation, at the tensor cores' rate), and scaled by the inverse norms after it:
    unit vectors are not exact in TF32, and their product carried errors of 1e-5 (float32: 1e-7)."""
    def rows(r0: int, r1: int) -> torch.Tensor:
        out = None
        with half_input_matmuls(True):
            for b in range(x.shape[0]):
                g = torch.matmul(x[b, r0:r1], x[b, :r1].T)
                g.mul_(inv[b, r0:r1, None]).mul_(inv[b, None, :r1])
                out = g if out is None else out.add_(g)
        return out
    return rows


class Cosine(BuiltinStatistic):
    name = "cosine"
    accumulators = ("cosine", "norms", "aps_seq")
    with_var = ("aps_seq",)
    lower = ("cosine",)  # the CPU Gram writes its lower triangle alone
    needs = frozenset(RESIDUAL_POINTS)

    def shapes(self, spec):
        L, M, S = len(spec.layers), spec.map_side(), spec.seq_len
        return {"cosine": (L + 1, M, M), "norms": (L + 1, S), "aps_seq": (L + 1,)}

    def add_hidden(self, capture, index, x):
        add_cosine(capture, self.accumulators, index, x)


STATISTIC = Cosine()
