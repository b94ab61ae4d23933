"""One layer's attention pass: the intermediates its readers need, each computed once.

The pass walks the layer's query rows in chunks (flash attention's outer loop, with the key range of
a causal chunk cut at its last row). Per chunk, and per slice of the batch's sequences where a chunk
of the whole batch would outgrow the CPU cache, it forms the scaled logits once, then on request:

- the visible logits' batch-and-head sum (``logit_sum``) and the logits themselves (``scores``);
- the softmax, in place, and from it the layer output rows ``p @ v`` (when the capture computes the
  output) and the weights themselves (``probs``);
- each head's weights summed over the batch (``head_weight_sums``), and what follows from them: their
  head sum (``weight_sum``), their diagonals by offset (``diagonal_sums``), their key-0 column
  (``key0_weights``) and the ``--heads`` heads' rows (``selected_weight_sums``), with the same
  heads' logit sums (``selected_logit_sums``).

Per-sequence intermediates go to their readers slice by slice, batch sums once per chunk. The
``native`` backend forms the logit sum, softmax and per-head sums of a slice in one C pass (the
``triton`` backend, :func:`poslens.capture.backends.choice.triton_pass`, forms the batch sums of a whole
layer without writing a logit). Readers are ``(needs, callback)`` pairs; nothing here knows a
statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from poslens.capture.statistics.builtin.base import Piece
from poslens.capture.statistics.points import BATCH_SUMS
from poslens.capture.backends.kernels import finite, nonfinite_error, sum_first

#: intermediates derived from each head's batch-summed weights
_FROM_HEAD_SUMS = frozenset({"head_weight_sums", "weight_sum", "diagonal_sums", "key0_weights",
                             "selected_weight_sums"})


@dataclass
class Layer:
    """What the pass reads of one layer: grouped queries, transposed keys and the layer's structure."""

    index: int  # the model's decoder-layer index (named in errors)
    qs: torch.Tensor  # float32 queries grouped by key head [B, Hk, g, S, D] (unscaled, rotate-half layout)
    kT: torch.Tensor  # float32 keys [B, Hk, D, S]
    scaling: float
    causal: bool
    window: int | None
    softcap: float | None
    heads: list  # the --heads heads of the layer
    rows: int  # query rows per chunk
    bs: int  # sequences per slice of a chunk
    v: torch.Tensor | None = None  # float32 values [B, Hk, S, D]: compute the output here
    out_dtype: torch.dtype | None = None
    sink_off: bool = False  # key 0 masked for the queries after it (an intervention of poslens ablate)


def structure_mask(Sq: int, Sk: int, *, causal: bool, window: int | None, device, q_offset: int = 0,
                   sink_off: bool = False):
    """Bool ``[Sq, Sk]`` (True = attend) for the causal and sliding-window structure, or None.
    ``sink_off``: key 0 also hidden from every query after position 0."""
    if not causal and window is None and not sink_off:
        return None
    i = torch.arange(q_offset, q_offset + Sq, device=device)[:, None]  # absolute query positions
    j = torch.arange(Sk, device=device)[None, :]
    m = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if causal:
        m &= j <= i
    if window is not None:
        m &= (i - j) < window
    if sink_off:
        m &= (j > 0) | (i == 0)
    return m


def diagonal_view(zbuf: torch.Tensor, c: int, stop: int, pad: int) -> torch.Tensor:
    """View ``[H, c, stop]`` of the head-weight buffer with ``V[h, r, t] = A_h[start + r, start + r - d]``.

    ``zbuf [H, pad, W]`` holds a chunk's weights ``A_h[start + r, j]`` at column ``pad + j`` and zeros
    in its first ``pad >= c`` columns; ``d = stop - 1 - t`` with ``start = stop - c``. Row stride
    ``W + 1`` shifts each row one column further, so the columns line up by offset; entries with
    ``d > start + r`` (no such sub-diagonal element) land in the zero columns.
    """
    H, _, W = zbuf.shape
    return zbuf.as_strided((H, c, stop), (zbuf.stride(0), W + 1, 1), zbuf.storage_offset() + pad - c + 1)


class AttentionPass:
    """The chunked pass of one layer (torch or native backend) handing intermediates to its readers."""

    def __init__(self, layer: Layer, readers: list, work, *, checked: bool, native=None):
        self.L, self.work, self.checked, self.native = layer, work, checked, native
        self.readers = [(frozenset(n), fn) for n, fn in readers]
        needs = frozenset().union(*(n for n, _ in self.readers)) if self.readers else frozenset()
        self.needs = needs
        self.head_sums = bool(needs & _FROM_HEAD_SUMS)
        self.need_p = self.head_sums or "probs" in needs or layer.v is not None
        B, Hk, g, S, D = layer.qs.shape
        self.B, self.H, self.S, self.D = B, Hk * g, S, D
        dev = self.device = layer.qs.device
        self.cpu = dev.type == "cpu"
        self.above = torch.ones(layer.rows, layer.rows, dtype=torch.bool, device=dev).triu_(1)  # j > i in a block
        self.bad = None if checked else torch.zeros((), dtype=torch.bool, device=dev)
        self.output = None
        if layer.v is not None:
            self.output = torch.empty(B, S, self.H, D, dtype=layer.out_dtype or layer.v.dtype, device=dev)
        if self.head_sums:  # `rows` zero columns, then a chunk's per-head batch sums (see diagonal_view)
            self.zbuf = work.buffer("head_sums", (self.H, layer.rows, layer.rows + S), dev)
            self.zbuf[:, :, :layer.rows] = 0.0

    def run(self) -> bool:
        """The whole pass; False when a non-finite value was met and not named (the unchecked CUDA
        pass, the native pass): the caller redoes the layer checked."""
        L = self.L
        for start in range(0, self.S, L.rows):
            if not self._chunk(start, min(self.S, start + L.rows)):
                return False
        return not (self.bad is not None and bool(self.bad))

    # -- one chunk ---------------------------------------------------------------------------
    def _chunk(self, start: int, stop: int) -> bool:
        L = self.L
        c, nc = stop - start, stop if L.causal else self.S
        allowed = None
        if L.window is not None or L.sink_off:
            allowed = structure_mask(c, nc, causal=L.causal, window=L.window, device=self.device, q_offset=start,
                                     sink_off=L.sink_off)
        lsum = self.work.buffer("logit_sum", (c, nc), self.device) if "logit_sum" in self.needs else None
        sel = None
        if "selected_logit_sums" in self.needs:
            sel = self.work.zeros("selected_logits", (len(L.heads), c, nc), self.device)
        pb = self.zbuf[:, :c, L.rows:L.rows + nc] if self.head_sums else None
        for b0 in range(0, self.B, L.bs):
            b1 = min(self.B, b0 + L.bs)
            logits = self._logits(b0, b1, start, stop)
            if self.native is not None:
                part = lsum if (lsum is None or b0 == 0) else self.work.buffer("logit_sum_part", (c, nc), self.device)
                if self.native(logits, start, L.causal, part, pb, accumulate=b0 > 0, threads=torch.get_num_threads()):
                    return False  # a non-finite visible logit: the caller's checked torch pass names its head
                if part is not lsum:
                    lsum.add_(part)
                p = logits
            else:
                if lsum is not None:
                    self._logit_sum(logits, start, allowed, lsum if b0 == 0 else None, lsum)
                if allowed is not None:
                    logits.masked_fill_(~allowed, float("-inf"))
                elif L.causal:
                    logits[..., start:stop].masked_fill_(self.above[:c, :c], float("-inf"))
                if sel is not None:
                    for m, h in enumerate(L.heads):
                        lh = logits[:, h]
                        sel[m].add_(sum_first(lh.masked_fill(~torch.isfinite(lh), 0.0)))
                self._hand_sequences({"scores": logits}, start, b0, b1, nc)
                p = None
                if self.need_p:
                    p = torch.softmax(logits, dim=-1, out=logits) if self.cpu else torch.softmax(logits, dim=-1)
                    if self.head_sums:
                        self._add_head_sums(p, pb, first=b0 == 0)
            if p is not None:
                self._output_rows(p, start, b0, b1)
                self._hand_sequences({"probs": p}, start, b0, b1, nc)
        self._hand_sums(start, stop, lsum, pb, sel)
        return True

    def _logits(self, b0: int, b1: int, start: int, stop: int) -> torch.Tensor:
        """The chunk's scaled logits ``[b, H, c, nc]`` of sequences ``b0 .. b1 - 1`` (soft-capped where
        the model caps), in a reused buffer on the CPU."""
        L = self.L
        _, Hk, g, S, D = L.qs.shape
        B, c = b1 - b0, stop - start
        nc = stop if L.causal else S
        rows = L.qs[b0:b1, :, :, start:stop]  # [b, Hk, g, c, D]
        if self.cpu:  # the scale folded into a cache-sized copy of the chunk's rows (not a copy of all of q)
            qc = self.work.buffer("q_rows", (B, Hk, g, c, D), rows.device)
            torch.mul(rows, L.scaling, out=qc) if L.scaling != 1.0 else qc.copy_(rows)
            logits = self.work.buffer("logits", (B, Hk, g * c, nc), rows.device)
            torch.matmul(qc.view(B, Hk, g * c, D), L.kT[b0:b1, :, :, :nc], out=logits)
        else:
            qc = rows * L.scaling if L.scaling != 1.0 else rows.contiguous()
            logits = torch.matmul(qc.view(B, Hk, g * c, D), L.kT[b0:b1, :, :, :nc])
        logits = logits.view(B, self.H, c, nc)
        if L.softcap is not None:  # Gemma 2: the logits the softmax sees are capped, so are the captured ones
            logits = torch.tanh_(logits.div_(L.softcap)).mul_(L.softcap)
        return logits

    def _logit_sum(self, logits, start, allowed, out, acc) -> None:
        """The slice's batch/head sum of the visible logits (before the mask), written to ``out`` (the
        first slice) or added to ``acc``; masked entries 0. A non-finite sum is traced to its head
        (checked) or flagged (unchecked)."""
        B, H, c, nc = logits.shape
        if self.cpu:  # the batch/head sum as one outer reduction into a reused buffer
            s = out if out is not None else self.work.buffer("logit_sum_part", (c, nc), logits.device)
            torch.sum(logits.view(B * H, c * nc), dim=0, out=s.view(c * nc))
        else:
            s = logits.sum(dim=(0, 1))
        if self.checked and not finite(s):  # locate the head only on failure
            bad = ~torch.isfinite(logits)
            if allowed is not None:
                bad &= allowed
            elif self.L.causal:
                bad[..., start:start + c] &= ~self.above[:c, :c]
            if bool(bad.any()):
                raise nonfinite_error(self.L.index, int(bad.any(dim=(0, 2, 3)).nonzero()[0]))
            s = logits.masked_fill(~torch.isfinite(logits), 0.0).sum(dim=(0, 1))
        if self.L.causal:  # above the diagonal: not seen, stored as 0
            s[:, start:start + c].masked_fill_(self.above[:c, :c], 0.0)
        if allowed is not None:  # outside the sliding window: unseen, stored as 0 like above the diagonal
            s.masked_fill_(~allowed, 0.0)
        if self.bad is not None:
            self.bad |= ~torch.isfinite(s).all()
        if out is not None:
            if s is not out:
                out.copy_(s)
        else:
            acc.add_(s)

    def _add_head_sums(self, p, pb, first: bool) -> None:
        """Each head's weights of the slice summed over its sequences, written (first slice) or added
        into ``pb [H, c, nc]``."""
        B = p.shape[0]
        if self.cpu:  # slice adds: see kernels.sum_first
            b = 0
            if first:
                torch.add(p[0], p[1], out=pb) if B > 1 else pb.copy_(p[0])
                b = 2
            for i in range(b, B):
                pb.add_(p[i])
        elif first:
            torch.sum(p, dim=0, out=pb)
        else:
            pb.add_(p.sum(0))

    def _output_rows(self, p, start, b0, b1) -> None:
        """The chunk's rows of the layer output ``p @ v`` (per key head group) from its weights."""
        if self.output is None:
            return
        B, H, c, nc = p.shape
        v = self.L.v
        Hk, D = v.shape[1], v.shape[-1]
        pv = self.work.buffer("pv", (B, Hk, H // Hk * c, D), p.device)
        torch.matmul(p.view(B, Hk, H // Hk * c, nc), v[b0:b1, :, :nc], out=pv)
        self.output.view(*self.output.shape[:2], Hk, H // Hk, D)[b0:b1, start:start + c].copy_(
            pv.view(B, Hk, H // Hk, c, D).permute(0, 3, 1, 2, 4))

    # -- handing over ------------------------------------------------------------------------
    def _hand_sequences(self, values: dict, start, b0, b1, nc) -> None:
        name = next(iter(values))
        for needs, fn in self.readers:
            if name in needs:
                fn(Piece(slice(start, start + values[name].shape[2]), slice(b0, b1), nc, values))

    def _hand_sums(self, start, stop, lsum, pb, sel) -> None:
        """The chunk's batch sums, once its last slice is in, to the readers of batch sums."""
        L, c = self.L, stop - start
        nc = lsum.shape[1] if lsum is not None else (stop if L.causal else self.S)
        values = {}
        if lsum is not None:
            values["logit_sum"] = lsum
        if sel is not None:
            values["selected_logit_sums"] = sel
        probe = None
        if pb is not None:
            values["head_weight_sums"] = pb
            if "weight_sum" in self.needs:
                ws = self.work.buffer("weight_sum", (c, nc), pb.device)
                torch.sum(pb, dim=0, out=ws)
                values["weight_sum"] = probe = ws  # also the finiteness probe: c x nc values, not H x c x nc
            if "diagonal_sums" in self.needs:
                values["diagonal_sums"] = diagonal_view(self.zbuf, c, stop, L.rows).sum(dim=1).flip(-1)
            if "key0_weights" in self.needs:
                values["key0_weights"] = pb[:, :, 0]
            if "selected_weight_sums" in self.needs:
                values["selected_weight_sums"] = pb[[h for h in L.heads]] if L.heads else pb[:0]
            if self.checked and not finite(pb if probe is None else probe):
                raise nonfinite_error(L.index, int((~torch.isfinite(pb)).any(dim=(1, 2)).nonzero()[0]))
            if self.bad is not None:
                self.bad |= ~torch.isfinite(pb).all()
        if not values:
            return
        piece = Piece(slice(start, stop), slice(0, self.B), nc, values)
        for needs, fn in self.readers:
            if needs & BATCH_SUMS:
                fn(piece)
