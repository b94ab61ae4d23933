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
    if title:
        ax.set_title(title, fontsize=9)
    if colorbar:
        plt.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if annotate and a.shape[-1] <= 8:
        for (i, j), v in np.ndenumerate(a):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", color="w", fontsize=8)
    return im


def layer_grid(maps, *, titles: list[str], suptitle: str = "", cmap: str = "rocket",
               percentile: tuple[float, float] | None = None, center_zero: bool = False, positions: int | None = None):
    """One row of heat maps, one per layer; returns the figure (``positions``: see :func:`heatmap`)."""
    n = len(maps)
    fig, axes = plt.subplots(1, n, figsize=(3.3 * n, 3.2), squeeze=False)
    for ax, m, t in zip(axes[0], maps, titles):
        heatmap(ax, m, title=t, cmap=cmap, percentile=percentile, center_zero=center_zero, positions=positions)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    return fig


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
