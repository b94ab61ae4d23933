"""Figures in the papers' style: heat maps with query rows, key columns, masked triangle blank."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless: poslens never opens windows

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def _cmap(name: str):
    if name in ("rocket", "mako", "flare", "crest", "vlag", "icefire"):
        from seaborn import cm  # registers seaborn's perceptual maps

        return getattr(cm, name)
    return matplotlib.colormaps[name]


def heatmap(ax, m, *, title: str = "", cmap: str = "rocket", percentile: tuple[float, float] | None = None,
            center_zero: bool = False, colorbar: bool = True, annotate: bool = False, positions: int | None = None):
    """Draw one ``[S, S]`` map on ``ax``. NaN entries (the masked triangle) are left blank.

    ``positions``: the sequence length the map stands for when it was block-averaged to fewer
    pixels (the axes then read in positions, not pixels).

    ``percentile=(1, 99)`` clips the colour range to those percentiles of the finite entries, as
    the trained-model figures of arXiv 2509.21042 do; ``center_zero`` makes the range symmetric
    (for diagonal-normalised maps).
    """
    a = torch.as_tensor(m).detach().to(torch.float64).cpu().numpy()
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
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    integer_axis(ax.xaxis, nbins=4)
    integer_axis(ax.yaxis, nbins=4)
    if title:
        ax.set_title(title, fontsize=9)
    if colorbar:
        plt.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if annotate and a.shape[-1] <= 8:
        for (i, j), v in np.ndenumerate(a):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", color="w", fontsize=8)
    return im


#: heat maps per row of a layer grid: a page-wide figure keeps every panel large enough to read
GRID_COLUMNS = 4


def layer_grid(maps, *, titles: list[str], suptitle: str = "", cmap: str = "rocket",
               percentile: tuple[float, float] | None = None, center_zero: bool = False, positions: int | None = None,
               columns: int = GRID_COLUMNS):
    """Heat maps, one per layer, in rows of ``columns``; returns the figure (``positions``: see
    :func:`heatmap`). Each panel is 3.3 inches wide whatever the number of layers."""
    n = len(maps)
    ncol = max(1, min(columns, n))
    nrow = -(-n // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.3 * ncol, 3.2 * nrow), squeeze=False)
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


def layer_lines(panels: list[dict], *, suptitle: str = "", columns: int = 3, layer_label: str = "layer"):
    """Small multiples of per-layer quantities: one panel per quantity, one line per run.

    ``panels``: ``[{"title", "series": [{"label", "layers", "values", "errors" (or None)}],
    "ref": optional y of a reference line (e.g. 0.5 = chance)}]``. Missing values (None) are gaps;
    error bars where ``errors`` are given; integer layer ticks."""
    n = len(panels)
    ncol = max(1, min(columns, n))
    nrow = -(-n // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 2.7 * nrow), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        for s in p["series"]:
            x = np.asarray(s["layers"], dtype=float)
            y = np.asarray([np.nan if v is None else v for v in s["values"]], dtype=float)
            err = s.get("errors")
            if err is not None:
                e = np.asarray([np.nan if v is None else v for v in err], dtype=float)
                ax.errorbar(x, y, yerr=e, marker="o", ms=3, lw=1.2, capsize=2, label=s["label"])
            elif s.get("dashed"):
                ax.plot(x, y, ls="--", lw=1.0, color="0.4", label=s["label"])
            else:
                ax.plot(x, y, marker="o", ms=3, lw=1.2, label=s["label"])
        if p.get("ref") is not None:
            ax.axhline(p["ref"], color="0.6", lw=0.8, ls="--")
        ax.set_title(p["title"], fontsize=9)
        ax.set_xlabel(layer_label, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        integer_axis(ax.xaxis)
        if len(p["series"]) > 1:
            ax.legend(fontsize=7)
        if p["title"].startswith("p,"):
            ax.set_yscale("log")
    return _finish_grid(fig, axes, n, suptitle)


def head_layer_maps(maps: list[dict], *, layer_ids: list, suptitle: str = ""):
    """Head × layer heat maps side by side: ``maps`` = ``[{"title", "values": [L, H] array (NaN =
    absent head), "cmap"}]``; layers on the vertical axis (labelled with ``layer_ids``), heads on
    the horizontal, integer ticks, a colour bar each."""
    n = len(maps)
    L = len(layer_ids)
    H = max(np.asarray(m["values"]).shape[1] for m in maps)
    w = min(6.0, 1.2 + 0.35 * H)
    h = min(9.0, 1.4 + 0.22 * L)
    fig, axes = plt.subplots(1, n, figsize=(w * n, h), squeeze=False)
    for ax, m in zip(axes[0], maps):
        a = np.asarray(m["values"], dtype=float)
        cm = _cmap(m.get("cmap", "viridis")).with_extremes(bad=(0.9, 0.9, 0.9, 1.0))
        im = ax.imshow(np.ma.masked_invalid(a), aspect="auto", cmap=cm, interpolation="nearest",
                       vmin=m.get("vmin"), vmax=m.get("vmax"))
        ax.set_title(m["title"], fontsize=9)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        step = max(1, -(-L // 16))
        ax.set_yticks(range(0, L, step))
        ax.set_yticklabels([str(layer_ids[i]) for i in range(0, L, step)], fontsize=7)
        integer_axis(ax.xaxis)
        ax.tick_params(labelsize=7)
        plt.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return _finish_grid(fig, axes, n, suptitle)


def score_map_figures(scores, out_dir, *, prefix: str = "scores", label: str = "", percentile=None,
                      titles: list[str] | None = None) -> list[str]:
    """Write ``{prefix}_raw.png`` and ``{prefix}_diagnorm.png`` (all layers side by side).

    ``titles`` names the panels (default ``layer 0..L-1``; pass them when ``scores`` holds a subset
    of layers). Returns the file names written.
    """
    from pathlib import Path

    from poslens.metrics import diagonal_normalize
    from poslens.rundir import save_figure

    out_dir = Path(out_dir)
    L = scores.shape[0]
    titles = titles or [f"layer {l}" for l in range(L)]  # layers count from 0
    raw = layer_grid([scores[l] for l in range(L)], titles=titles, suptitle=f"{label} pre-softmax scores".strip(),
                     percentile=percentile)
    save_figure(raw, out_dir / f"{prefix}_raw.png")
    dn = diagonal_normalize(scores)
    norm = layer_grid([dn[l] for l in range(L)], titles=titles,
                      suptitle=f"{label} diagonal-normalised scores".strip(), percentile=percentile)
    save_figure(norm, out_dir / f"{prefix}_diagnorm.png")
    return [f"{prefix}_raw.png", f"{prefix}_diagnorm.png"]
