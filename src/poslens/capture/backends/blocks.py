"""Block means of ``S x S`` maps, accumulated chunk by chunk (``--map-size``)."""

from __future__ import annotations

import torch

#: Rows of the row bands of the --map-size block Gram.
GRAM_BLOCK_ROWS = 128


class BlockMaps:
    """Block means of ``S x S`` maps on the fly (``--map-size N``).

    Blocks are ``f x f`` with ``f = ceil(S / N)`` (the last row/column of blocks is narrower when ``f``
    does not divide ``S``), ``n = ceil(S / f)`` blocks per axis. A stored map entry ``[I, J]`` is the
    mean of the entries ``(i, j)`` of block ``(I, J)`` that a query sees: ``j <= i`` for causal maps,
    and inside the sliding window where there is one. Blocks without a visible entry (every block
    right of the diagonal, in a causal map) are stored as 0, as the full maps store their upper
    triangle, and read as NaN. Cosine maps (symmetric, every entry defined) average every entry.
    The means are exact: chunk rows are summed into their blocks as they are computed and divided by
    the count of visible entries once per layer and batch; no ``S x S`` map is ever materialised.
    """

    def __init__(self, seq_len: int, map_size: int):
        if map_size < 1:
            raise ValueError("map_size must be positive")
        self.S = int(seq_len)
        self.f = -(-self.S // int(map_size))
        self.n = -(-self.S // self.f)
        self._inv: dict = {}
        self._counts: dict = {}

    def sizes(self) -> torch.Tensor:
        """Positions per block ``[n]`` (float64, CPU)."""
        out = torch.full((self.n,), float(self.f), dtype=torch.float64, device="cpu")
        out[-1] = float(self.S - (self.n - 1) * self.f)
        return out

    def counts(self, causal: bool, window: int | None) -> torch.Tensor:
        """Visible entries per block ``[n, n]`` (float64, CPU) of a map with this mask, counted once per
        mask (every layer of a scan reads them: the summary's blocks without a visible entry)."""
        key = (bool(causal), window)
        if key not in self._counts:
            self._counts[key] = self._count(causal, window)
        return self._counts[key].clone()

    def _count(self, causal: bool, window: int | None) -> torch.Tensor:
        S, f = self.S, self.f
        i = torch.arange(S, dtype=torch.int64, device="cpu")[:, None]
        lo = (i - window + 1).clamp_min(0) if window else torch.zeros_like(i)  # keys i - j < window
        hi = i if causal else torch.full_like(i, S - 1)
        j0 = torch.arange(self.n, dtype=torch.int64, device="cpu")[None, :] * f  # block J covers keys [J f, J f + f - 1]
        j1 = (j0 + f - 1).clamp_max(S - 1)
        per_row = (torch.minimum(hi, j1) - torch.maximum(lo, j0) + 1).clamp_min(0).to(torch.float64)  # [S, n]
        out = torch.zeros(self.n, self.n, dtype=torch.float64, device="cpu")
        return out.index_add_(0, torch.arange(S, device="cpu") // f, per_row)

    def inverse_counts(self, causal: bool, window: int | None, device) -> torch.Tensor:
        """``1 / counts`` (0 where a block has no visible entry), float32, cached per mask and device."""
        key = (bool(causal), window, str(device))
        if key not in self._inv:
            c = self.counts(causal, window)
            self._inv[key] = torch.where(c > 0, 1.0 / c.clamp_min(1), 0.0).to(torch.float32).to(device)
        return self._inv[key]

    def add_rows(self, dst: torch.Tensor, part: torch.Tensor, start: int) -> None:
        """Add a map's rows ``start .. start + c - 1`` (``part [..., c, nc]``, keys ``0 .. nc - 1``) to the
        block sums ``dst [..., n, n]`` (leading dims: several maps at once, e.g. every head's)."""
        *lead, c, nc = part.shape
        f = self.f
        nb = -(-nc // f)
        if nc != nb * f:
            part = torch.nn.functional.pad(part, (0, nb * f - nc))
        cols = part.reshape(*lead, c, nb, f).sum(-1)  # [..., c, nb]: column blocks
        r0, r1 = start // f, (start + c - 1) // f
        if r0 == r1:  # every row in one block row (the common case: chunks shorter than a block)
            dst[..., r0, :nb] += cols.sum(-2)
        else:
            idx = torch.arange(start, start + c, device=part.device) // f
            dst[..., :nb].index_add_(-2, idx, cols)

    def gram_means(self, a, device=None) -> torch.Tensor:
        """Block means ``[n, n]`` (float32) of ``a @ a.T`` for ``a [S, K]`` without the ``S x S`` product.

        The mean of ``a_i . a_j`` over a block ``I x J`` is the product of the blocks' mean rows,
        ``mean_I(a) . mean_J(a)``: one ``[n, K] x [K, n]`` product of the row-block means (``f^2`` times
        fewer multiplications than the ``S x S`` map).

        ``a`` may instead be a function ``rows(r0, r1)`` returning rows ``r0 .. r1 - 1`` of a symmetric
        ``S x S`` matrix on its first ``r1`` columns (then pass ``device``): row bands of the lower
        block triangle, reduced to block sums as they are computed, mirrored."""
        if not callable(a):
            m = self.row_means(a)
            return m @ m.T
        S, f, n = self.S, self.f, self.n
        on_gpu = torch.device(device).type != "cpu"  # few large products there, cache-sized ones on the CPU
        R = f * max(1, (4096 if on_gpu else GRAM_BLOCK_ROWS) // f)
        out = torch.zeros(n, n, dtype=torch.float32, device=device)
        for r0 in range(0, S, R):
            r1 = min(S, r0 + R)
            self.add_rows(out, a(r0, r1), r0)
        out = out.tril() + out.tril(-1).T  # blocks right of each computed row band: the mirrored ones
        sz = self.sizes().to(torch.float32).to(device)
        return out.div_(sz[:, None] * sz[None, :])

    def row_means(self, a: torch.Tensor) -> torch.Tensor:
        """The mean row of each block of ``f`` rows of ``a [S, K]``: ``[n, K]`` float32."""
        S, f, n = self.S, self.f, self.n
        a = a.to(torch.float32)
        full = (S // f) * f
        out = torch.empty(n, a.shape[1], dtype=torch.float32, device=a.device)
        torch.sum(a[:full].reshape(S // f, f, -1), dim=1, out=out[:S // f])
        if full < S:  # the last, narrower block
            torch.sum(a[full:], dim=0, keepdim=True, out=out[S // f:])
        return out.div_(self.sizes().to(torch.float32).to(a.device)[:, None])
