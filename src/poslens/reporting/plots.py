"""The report's figures in the papers' style: per-layer lines with their noise floors, per-head maps;
the heat maps and score-map figures themselves are drawn by :mod:`poslens.figures`."""

from __future__ import annotations

import textwrap

import numpy as np

from poslens.figures import _cmap, _finish_grid, integer_axis
from poslens.rundir.figures import new_figure


#: dash patterns of the companions drawn beside one line (noise floor, with key 0, ...), in order
COMPANION_STYLES = ("--", ":", "-.")

#: the widest figure (inches) the report draws: at its 100 dpi about the width of the page's column, so
#: the page shows it at its own size and its 8-point text stays readable; panels share it
PAGE_INCHES = 10.0
#: the narrowest panel (inches) of a row of panels; fewer panels per row rather than narrower ones
MIN_PANEL_INCHES = 3.2


def layer_lines(panels: list[dict], *, suptitle: str = "", columns: int = 3, layer_label: str = "layer"):
    """Small multiples of per-layer quantities: one panel per quantity, one line per run.

    ``panels``: ``[{"title", "series": [{"label", "layers", "values", "errors" (or None)}],
    "ref": optional y of a reference line (e.g. 0.5 = chance)}]``. Missing values (None) are gaps;
    error bars where ``errors`` are given; integer layer ticks."""
    n = len(panels)
    ncol = max(1, min(columns, n, int(PAGE_INCHES // MIN_PANEL_INCHES)))
    nrow = -(-n // ncol)
    fig, axes = new_figure(nrow, ncol, figsize=(min(4.2, PAGE_INCHES / ncol) * ncol, 2.7 * nrow), squeeze=False)
    # one colour per run in every panel (the same label, the same colour), in order of first appearance
    labels = list(dict.fromkeys(s["label"] for p in panels for s in p["series"] if not s.get("dashed")))
    palette = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    # runs of very different depth (2 and 30 layers) share the axis as normalised depth, said in its label
    depths = [max((v for v in s["layers"] if isinstance(v, (int, float))), default=0) for p in panels
              for s in p["series"]]
    normalise = len(labels) > 1 and min(depths, default=0) >= 0 and max(depths, default=0) > 1.5 * max(
        min(depths, default=0), 1)
    if normalise:
        layer_label = f"{layer_label} / (layers − 1): normalised depth"
    handles: dict = {}
    for ax, p in zip(axes.flat, panels):
        color = None  # a dashed companion (noise floor, control, ...) takes the colour of the line before it
        nth = 0  # companions of one line differ in their dash pattern
        for s in p["series"]:
            x = np.asarray(s["layers"], dtype=float)
            if normalise:
                x = x / max(float(np.nanmax(x)) if x.size else 1.0, 1.0)
            y = np.asarray([np.nan if v is None else v for v in s["values"]], dtype=float)
            err = s.get("errors")
            dashed = bool(s.get("dashed"))
            style = {"color": color} if dashed and color is not None else {}
            ls = COMPANION_STYLES[nth % len(COMPANION_STYLES)] if dashed else "-"
            nth = nth + 1 if dashed else 0
            if err is not None:
                e = np.asarray([np.nan if v is None else v for v in err], dtype=float)
                h = ax.errorbar(x, y, yerr=e, marker="o", ms=3, lw=1.0 if dashed else 1.2, capsize=2,
                                ls=ls, label=s["label"], **style)
                line = h.lines[0]
            elif dashed:
                (line,) = ax.plot(x, y, ls=ls, lw=1.0, label=s["label"], **({"color": "0.4"} | style))
            else:
                (line,) = ax.plot(x, y, marker="o", ms=3, lw=1.2, label=s["label"], color=palette[s["label"]])
            if not dashed:
                color = line.get_color()
            handles.setdefault(s["label"], line)
        if p.get("ref") is not None:
            ax.axhline(p["ref"], color="0.6", lw=0.8, ls="--")
        ax.set_title(p["title"], fontsize=9)
        ax.set_xlabel(layer_label, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if not normalise:
            integer_axis(ax.xaxis)
        if p["title"].startswith("p,"):
            ax.set_yscale("log")
    fig = _finish_grid(fig, axes, n, suptitle)
    if len(handles) > 1:  # one legend for the figure, below the panels: it never covers data
        rows = -(-len(handles) // 4)
        fig.subplots_adjust(bottom=min(0.45, (0.22 + 0.09 * rows) / nrow))
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)), fontsize=7,
                   frameon=False)
    return fig


def head_layer_maps(maps: list[dict], *, layer_ids: list, suptitle: str = ""):
    """Head × layer heat maps side by side: ``maps`` = ``[{"title", "values": [L, H] array (NaN =
    absent head), "cmap"}]``; layers on the vertical axis (labelled with ``layer_ids``), heads on
    the horizontal, integer ticks, a colour bar each."""
    n = len(maps)
    L = len(layer_ids)
    H = max(np.asarray(m["values"]).shape[1] for m in maps)
    w = min(6.0, max(3.2, 1.2 + 0.35 * H), max(MIN_PANEL_INCHES, PAGE_INCHES / n))  # a two-line title's room
    h = min(9.0, max(2.4, 1.4 + 0.22 * L))  # room for the two-line titles of a model with few layers
    fig, axes = new_figure(1, n, figsize=(w * n, h), squeeze=False)
    for ax, m in zip(axes[0], maps):
        a = np.asarray(m["values"], dtype=float)
        cm = _cmap(m.get("cmap", "viridis")).with_extremes(bad=(0.9, 0.9, 0.9, 1.0))
        im = ax.imshow(np.ma.masked_invalid(a), aspect="auto", cmap=cm, interpolation="nearest",
                       vmin=m.get("vmin"), vmax=m.get("vmax"))
        ax.set_title(textwrap.fill(m["title"], 30), fontsize=9)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("decoder layer (from 0)", fontsize=8)
        step = max(1, -(-L // 16))
        ax.set_yticks(range(0, L, step))
        ax.set_yticklabels([str(layer_ids[i]) for i in range(0, L, step)], fontsize=7)
        ax.set_xticks(range(0, a.shape[1], max(1, -(-a.shape[1] // 16))))  # integer head ticks, even for one head
        ax.tick_params(labelsize=7)
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return _finish_grid(fig, axes, n, suptitle)
