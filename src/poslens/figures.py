"""Attention maps drawn as PNG files: heat maps with query rows, key columns and the masked
triangle blank, in grids of layers, and the score-map figures every run directory of maps carries.

Tensors in, figures out, no readings: the capture, the simulator and the report all draw through
here (the report's own multi-panel figures live in :mod:`poslens.reporting.plots`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.figure
import numpy as np
import torch

from poslens.metrics import diagonal_normalize
from poslens.rundir.figures import new_figure, save_figure


class NotebookFigure(matplotlib.figure.Figure):
    """A matplotlib Figure that Jupyter shows as a PNG with no ``%matplotlib`` magic: poslens draws
    outside pyplot (no backend is chosen or changed), so no backend would display it; IPython asks the
    object itself (``_repr_png_``)."""

    def _repr_png_(self) -> bytes:
        import io

        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        return buf.getvalue()


def notebook_figure(nrows: int = 1, ncols: int = 1, *, figsize=None, **subplots_kw):
    """``(figure, axes)`` as :func:`poslens.rundir.figures.new_figure`, the figure a :class:`NotebookFigure`."""
    fig = NotebookFigure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **subplots_kw)


def _cmap(name: str):
    if name in ("rocket", "mako", "flare", "crest", "vlag", "icefire"):
        from seaborn import cm  # registers seaborn's perceptual maps

        return getattr(cm, name)
    return matplotlib.colormaps[name]


def blank_causal_triangle(a: np.ndarray) -> np.ndarray:
    """A square map whose strict upper triangle is all 0 or NaN (what the causal mask leaves: keys
    after the query), with that triangle NaN, i.e. blank when drawn; any other map as given. A
    bidirectional map (values above the diagonal) keeps them."""
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 2:
        return a
    upper = np.triu(np.ones(a.shape, dtype=bool), 1)
    if np.any(np.nan_to_num(a[upper], nan=0.0) != 0) or not np.any(np.nan_to_num(a[~upper], nan=0.0) != 0):
        return a
    out = a.astype(float, copy=True)
    out[upper] = np.nan
    return out


#: font sizes (points) of the heat maps' tick labels, axis labels and colour bars: at the figures' size a
#: page shows them (:data:`GRID_PANEL_INCHES`), about 10 pixels or more
TICK_POINTS, LABEL_POINTS, COLORBAR_POINTS = 8, 8, 7


def heatmap(ax, m, *, title: str = "", cmap: str = "rocket", percentile: tuple[float, float] | None = None,
            center_zero: bool = False, colorbar: bool = True, annotate: bool = False, positions: int | None = None):
    """Draw one ``[S, S]`` map on ``ax``. NaN entries (the masked triangle) are left blank, and so is
    a causal map's upper triangle given as zeros (:func:`blank_causal_triangle`).

    ``positions``: the sequence length the map stands for when it was block-averaged to fewer
    pixels (the axes then read in positions, not pixels).

    ``percentile=(1, 99)`` clips the colour range to those percentiles of the finite entries, as
    the trained-model figures of arXiv 2509.21042 do; ``center_zero`` makes the range symmetric
    (for diagonal-normalised maps).
    """
    a = blank_causal_triangle(torch.as_tensor(m).detach().to(torch.float64).cpu().numpy())
    # Colour range from the off-diagonal entries: a token's score with itself (the diagonal) is a
    # self-similarity that would otherwise swamp the positional structure; it saturates instead.
    off = a.copy()
    if off.ndim == 2 and off.shape[0] == off.shape[1] and off.shape[0] > 1:
        np.fill_diagonal(off, np.nan)
    finite = off[np.isfinite(off)]
    if finite.size == 0:
        finite = a[np.isfinite(a)]
    vmin = vmax = None
    if finite.size:
        if percentile is not None:
            vmin, vmax = np.percentile(finite, percentile)
        else:
            vmin, vmax = float(finite.min()), float(finite.max())
        if center_zero:
            lim = max(abs(vmin), abs(vmax)) or 1.0
            vmin, vmax = -lim, lim
        if vmin == vmax:
            vmin, vmax = vmin - 1e-12, vmax + 1e-12
    cm = _cmap(cmap).with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    extent = None if positions is None or positions == a.shape[-1] else (0, positions, positions, 0)
    im = ax.imshow(np.ma.masked_invalid(a), cmap=cm, vmin=vmin, vmax=vmax, interpolation="nearest", extent=extent)
    ax.set_xlabel("key position", fontsize=LABEL_POINTS)
    ax.set_ylabel("query position", fontsize=LABEL_POINTS)
    ax.tick_params(labelsize=TICK_POINTS)
    integer_axis(ax.xaxis, nbins=4)
    integer_axis(ax.yaxis, nbins=4)
    if title:
        ax.set_title(title, fontsize=9)
    if colorbar:
        cb = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        cb.ax.tick_params(labelsize=COLORBAR_POINTS)
    if annotate and a.shape[-1] <= 8:
        for (i, j), v in np.ndenumerate(a):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", color="w", fontsize=8)
    return im


#: heat maps per row of a layer grid, and each panel's width and height in inches: four panels make a
#: figure about as wide as a report's column at 110 dpi, so a page shows it near its own size, its text
#: readable (a 30-layer model: eight rows)
GRID_COLUMNS = 4
GRID_PANEL_INCHES = (2.6, 2.5)


def layer_grid(maps, *, titles: list[str], suptitle: str = "", cmap: str = "rocket",
               percentile: tuple[float, float] | None = None, center_zero: bool = False, positions: int | None = None,
               columns: int = GRID_COLUMNS):
    """Heat maps, one per layer, in rows of ``columns``; returns the figure (``positions``: see
    :func:`heatmap`). Each panel is :data:`GRID_PANEL_INCHES` whatever the number of layers."""
    n = len(maps)
    ncol = max(1, min(columns, n))
    nrow = -(-n // ncol)
    w, h = GRID_PANEL_INCHES
    fig, axes = new_figure(nrow, ncol, figsize=(w * ncol, h * nrow), squeeze=False)
    for k, (ax, m, t) in enumerate(zip(axes.flat, maps, titles)):
        heatmap(ax, m, title=t, cmap=cmap, percentile=percentile, center_zero=center_zero, positions=positions)
        if nrow > 1:  # axis titles once per row / column: more room for the maps themselves
            if k % ncol:
                ax.set_ylabel("")
            if k + ncol < n:
                ax.set_xlabel("")
    return _finish_grid(fig, axes, n, suptitle)


def _finish_grid(fig, axes, n: int, suptitle: str):
    """Hide the grid's unused panels (beyond the first ``n``), add the title, lay out."""
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    return fig


def integer_axis(axis, nbins: int | str = "auto") -> None:
    """Integer ticks only (layer, head and position indices)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins=nbins, integer=True))


#: Figures show at most this many positions per axis; longer maps are block-averaged down to it
#: (a 4,096-position map has 16 M pixels, far beyond a panel's resolution, and takes minutes to draw).
FIGURE_MAX_POSITIONS = 1024
#: the zoom figure's window: sinks (key 0) and slashes (small offsets) live in the first positions
ZOOM_POSITIONS = 64


def pool_for_figure(m: torch.Tensor, max_positions: int = FIGURE_MAX_POSITIONS) -> torch.Tensor:
    """Block means of a ``[S, S]`` map over ``f x f`` blocks, ``f = ceil(S / max_positions)``; NaN
    entries (the causal upper triangle) are left out of each mean, all-NaN blocks stay NaN."""
    S = m.shape[-1]
    f = -(-S // max_positions)
    if f <= 1:
        return m
    pad = (-S) % f
    x = torch.nn.functional.pad(m.to(torch.float64), (0, pad, 0, pad), value=float("nan"))
    n = x.shape[-1] // f
    x = x.reshape(n, f, n, f)
    finite = torch.isfinite(x)
    total = torch.where(finite, x, torch.zeros((), dtype=x.dtype)).sum(dim=(1, 3))
    count = finite.sum(dim=(1, 3))
    return torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, float("nan")))


def score_map_figures(scores, out_dir, *, layer_ids: list | None = None, prefix: str = "scores", label: str = "",
                      percentile: tuple[float, float] | None = (1, 99), per_figure: int = 32,
                      zoom: int | None = None, block: int = 1) -> list[str]:
    """The one writer of score-map figures: per group of at most ``per_figure`` layers,
    ``{prefix}_raw.png`` (mean pre-softmax scores), ``{prefix}_diagnorm.png`` (each layer's map
    diagonal-normalised: its non-relative part) and, with ``zoom`` shorter than the maps,
    ``{prefix}_zoom.png`` (the first ``zoom`` positions). Returns the file names written.

    ``scores`` ``[L, S, S]`` (NaN where a query never sees the key); ``layer_ids`` names the layers
    (default 0..L-1: decoder layers count from 0). More than one group: the prefix gains
    ``_layers{first}-{last}``. Maps longer than :data:`FIGURE_MAX_POSITIONS` are
    diagonal-normalised at full resolution, then drawn block-averaged (:func:`pool_for_figure`).
    Block maps (``scan --map-size``, ``block`` positions per block) are drawn as stored, without
    the zoom.
    """
    out_dir = Path(out_dir)
    L, S = scores.shape[0], scores.shape[-1]
    layer_ids = list(range(L)) if layer_ids is None else list(layer_ids)
    columns = GRID_COLUMNS
    lead = f"{label} " if label else ""
    unit = "" if block == 1 else f", blocks of {block} positions"
    files = []
    for g in range(0, L, per_figure):
        sel = list(range(g, min(L, g + per_figure)))
        titles = [f"layer {layer_ids[i]}" for i in sel]
        name = prefix if L <= per_figure else f"{prefix}_layers{layer_ids[sel[0]]}-{layer_ids[sel[-1]]}"
        raw = layer_grid([pool_for_figure(scores[i]) for i in sel], titles=titles, percentile=percentile,
                         suptitle=f"{lead}mean pre-softmax scores (decoder layers from 0{unit})", positions=S, columns=columns)
        save_figure(raw, out_dir / f"{name}_raw.png")
        # per layer: diagonal_normalize on a stacked [n, S, S] NaN-masked map fails (see report)
        dn = [pool_for_figure(diagonal_normalize(scores[i])) for i in sel]
        fig = layer_grid(dn, titles=titles, percentile=percentile, positions=S, columns=columns,
                         suptitle=f"{lead}diagonal-normalised scores (decoder layers from 0{unit})")
        save_figure(fig, out_dir / f"{name}_diagnorm.png")
        files += [f"{name}_raw.png", f"{name}_diagnorm.png"]
        if zoom and S > zoom and block == 1:
            fig = layer_grid([scores[i, :zoom, :zoom] for i in sel], titles=titles, percentile=percentile,
                             columns=columns, suptitle=f"{lead}pre-softmax scores, first {zoom} positions "
                                                       "(key 0: the sink column)")
            save_figure(fig, out_dir / f"{name}_zoom.png")
            files.append(f"{name}_zoom.png")
    return files
