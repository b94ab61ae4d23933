"""Where a layer's sums are formed: reused float32 workspaces, the float32 maps a layer's statistics
fill piece by piece, and their exact addition into float64 accumulators."""

from __future__ import annotations

import math

import torch

from poslens import native

#: Rows per band when a whole layer's ``S x S`` map is reduced to --map-size block sums (bounds the
#: padded copy :meth:`poslens.capture.backends.blocks.BlockMaps.add_rows` makes).
BAND_ROWS = 4096


class Workspace:
    """Reused buffers of one capture (grown when too small), and the float64 additions into its sums.

    A fresh multi-megabyte temporary on the CPU is a fresh ``mmap`` whose pages fault in again (sys
    time); a buffer kept from chunk to chunk and layer to layer is not. Off the CPU buffers are not
    kept (a kept one would hold GPU memory between layers)."""

    def __init__(self, workers=None):
        self.workers = workers if workers is not None else native.Workers()
        self._buffers: dict = {}
        self._held: dict = {}

    def buffer(self, name: str, shape: tuple, device, dtype=torch.float32, reuse: bool | None = None) -> torch.Tensor:
        """An uninitialised workspace of ``shape`` named ``name``: reused on the CPU (``reuse=None``),
        fresh elsewhere or with ``reuse=False``. Valid until the next request of the same name."""
        device = torch.device(device)
        if reuse is False or (reuse is None and device.type != "cpu"):
            return torch.empty(shape, dtype=dtype, device=device)
        n = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n or buf.device != device or buf.dtype != dtype:
            buf = torch.empty(n, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:n].view(shape)

    def zeros(self, name: str, shape: tuple, device, dtype=torch.float32) -> torch.Tensor:
        """:meth:`buffer`, zeroed."""
        return self.buffer(name, shape, device, dtype).zero_()

    def held(self, name: str, shape: tuple, device) -> torch.Tensor:
        """A float32 tensor of exactly ``shape``, zeroed when made and kept, contents and all, from call
        to call (made again when the shape or device changes): e.g. a map whose strict upper triangle
        no one writes, so it stays zero."""
        t = self._held.get(name)
        if t is None or tuple(t.shape) != tuple(shape) or t.device != torch.device(device):
            t = torch.zeros(shape, dtype=torch.float32, device=device)
            self._held[name] = t
        return t

    def f32(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` as a contiguous float32 tensor (on the CPU a copy into a reused buffer: a layer's q, k
        and v are tens of megabytes at batch 20)."""
        if x.device.type != "cpu":
            return x.to(torch.float32).contiguous()
        return self.buffer(name, tuple(x.shape), x.device).copy_(x)

    def add64(self, dst: torch.Tensor, x: torch.Tensor, alpha: float = 1.0, lower: bool = False) -> None:
        """``dst += alpha * x`` for a float64 ``dst`` and a float32 ``x``, bit-identical to ``add_``.

        On the CPU one fused pass (:func:`poslens.native.add_widened`), which with ``lower`` adds the
        lower triangle alone (pass it where the upper triangle of ``x`` is zero or the accumulator
        reads its lower triangle only). Without the kernels ``x`` is first widened into a reused
        float64 buffer: torch's mixed-dtype ``add_`` casts element by element, unvectorised."""
        if x.device.type == "cpu" and x.dtype != torch.float64:
            if native.add_widened(dst, x, alpha, lower, self.workers):
                return
            x = self.buffer("wide", tuple(x.shape), x.device, dtype=torch.float64).copy_(x)
        dst.add_(x, alpha=alpha)


class LayerMaps(dict):
    """One layer's float32 sums, by name: what its statistics allocate (:meth:`zeros`), fill from the
    pieces of the attention pass (:meth:`put` for ``S x S`` maps) and add to their float64
    accumulators at the layer's end. Under ``--map-size`` the ``S x S`` maps are block sums, turned
    into block means over each block's visible entries by :meth:`finish`."""

    def __init__(self, work: Workspace, blocks, seq_len: int, device):
        super().__init__()
        self.work, self.blocks, self.device = work, blocks, torch.device(device)
        self.S = seq_len
        self.M = blocks.n if blocks is not None else seq_len  # side of a stored map
        self._maps: set = set()

    def zeros(self, name: str, *shape: int) -> torch.Tensor:
        """A zeroed float32 sum ``name`` of ``shape`` (a reused buffer on the CPU), kept in this dict."""
        self[name] = self.work.zeros("map_" + name, shape, self.device)
        return self[name]

    def put(self, name: str, part: torch.Tensor, start: int, index: int | None = None) -> None:
        """Write rows ``start .. start + c - 1`` (``part [c, k]``, keys ``0 .. k - 1``) of the ``S x S``
        map ``name`` (of its ``index``-th map when it holds several); under --map-size, add them to
        its block sums."""
        self._maps.add(name)
        dst = self[name] if index is None else self[name][index]
        if self.blocks is None:
            dst[start:start + part.shape[0], :part.shape[1]].copy_(part)
            return
        band = self.blocks.f * max(1, BAND_ROWS // self.blocks.f)  # whole block rows per band
        for r0 in range(0, part.shape[0], band):
            self.blocks.add_rows(dst, part[r0:r0 + band], start + r0)

    def finish(self, causal: bool, window: int | None) -> None:
        """Block sums -> block means over each block's visible entries (under --map-size)."""
        if self.blocks is None:
            return
        inv = self.blocks.inverse_counts(causal, window, self.device)
        for name in self._maps:
            self[name].mul_(inv)
