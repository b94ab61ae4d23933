"""Matplotlib figures of a run: created, saved atomically as PNG, released."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from poslens.rundir.io import _atomic_write_bytes


def save_figures(out_dir: str | os.PathLike, figures) -> list[dict]:
    """Save ``(file_name, figure, caption)`` triples into ``out_dir``; returns the run-dir contract's
    ``[{"file", "caption"}]`` list for ``summary.json``."""
    saved = []
    for name, fig, caption in figures:
        save_figure(fig, Path(out_dir) / name)
        saved.append({"file": name, "caption": caption})
    return saved


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize=None, **subplots_kw):
    """``(figure, axes)`` like ``pyplot.subplots``, but outside pyplot: no backend is chosen or
    changed and nothing is registered globally, so drawing a poslens figure leaves a notebook's
    matplotlib state as it was (saving to PNG renders with Agg)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **subplots_kw)


def close_figure(fig) -> None:
    """Release a figure: one made by pyplot is closed there; one of :func:`new_figure` is freed by
    the garbage collector and needs nothing."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close(fig)


def figure_png(fig, dpi: int) -> bytes:
    """A figure rendered as PNG bytes (the figure is released)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    close_figure(fig)
    return buf.getvalue()


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """Atomically save a matplotlib figure as PNG and release it."""
    _atomic_write_bytes(Path(path), figure_png(fig, dpi))
