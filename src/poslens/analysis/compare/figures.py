"""The figures of ``poslens compare``, drawn from the change records of ``summary["changes"]``.

``compare_layers.png``: every per-layer reading by decoder layer (from 0) for A and B at the longest
length, A's line inside a band of ± the noise floor (z·SE of the paired difference), changed layers
ringed. ``compare_change_<reading>.png``: per-head readings as decoder layers × heads maps of B − A on a
diverging scale centred on 0, cells whose verdict is ``unchanged`` light grey. ``compare_lengths.png``
(several lengths): each reading's mean over layers (and the loss) against length. ``compare_loss.png``:
next-token loss by position bucket for both sides. :func:`compare_plot` draws one of them for
:meth:`poslens.api.result.CompareResult.plot`. Matplotlib is imported here, lazily by the callers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from poslens.analysis.compare.readings import HEAD_READINGS
from poslens.errors import PoslensError

#: the per-layer panels of ``compare_layers.png``: the per-layer readings, then the per-head ones' layer rows
LAYER_PANELS = ("relativity", "locality", "diagonal_trend", "band_low", "massive_dims", *HEAD_READINGS)
#: each reading's axis label (its unit)
UNITS = {
    "sink": "weight on key 0", "slash": "SlashScore at A's best Δ", "prev_token": "SlashScore(1)",
    "entropy": "attention entropy (nats)", "distance": "mean attention distance (tokens)",
    "relativity": "relativity index", "locality": "locality", "diagonal_trend": "diagonal trend",
    "band_high": "q·k energy share, high band", "band_medium": "q·k energy share, medium band",
    "band_low": "q·k energy share, low band", "massive_dims": "massive q/k dimensions",
    "loss": "next-token loss (nats per token)",
}
PLOT_NAMES = ("change", "layers", "lengths", "loss")
#: the two sides' colours (colour-blind safe) and the grey of unchanged cells
COLOUR_A, COLOUR_B, GREY = "#0072B2", "#D55E00", "#d9d9d9"
CHANGE_CMAP = "RdBu_r"


# --------------------------------------------------------------------------------------------
# the records
# --------------------------------------------------------------------------------------------
def _records(summary: dict, reading: str, S: int, *, heads: bool) -> list[dict]:
    return [r for r in summary.get("changes") or [] if r.get("reading") == reading and r.get("seq_len") == S
            and r.get("layer") is not None and (r.get("head") is not None) == heads]


def _loss_records(summary: dict, S: int) -> list[dict]:
    return [r for r in summary.get("changes") or [] if r.get("reading") == "loss" and r.get("seq_len") == S]


def _f(v) -> float:
    return float("nan") if v is None else float(v)


def _longest(summary: dict) -> int:
    return int(max(summary.get("seq_lens") or [summary.get("seq_len")]))


def _label(summary: dict, side: str) -> str:
    sides = summary.get("sides") or {}
    text = (sides.get(side) or {}).get("label") or summary.get(f"model_{side}") or side.upper()
    return f"{side.upper()}: {text}"


def change_matrix(summary: dict, reading: str, S: int) -> np.ma.MaskedArray:
    """``[L, H]``: B − A of a per-head reading at length ``S``, masked where the verdict is not ``changed``
    (or the cell has no number): the array :func:`draw_change` colours."""
    L, H = int(summary["num_layers"]), int(summary["num_heads"])
    layers = sorted({r["layer"] for r in _records(summary, reading, S, heads=True)})
    row = {l: i for i, l in enumerate(layers)}
    d = np.full((len(layers) or L, H), np.nan)
    changed = np.zeros(d.shape, dtype=bool)
    for r in _records(summary, reading, S, heads=True):
        i, h = row[r["layer"]], int(r["head"])
        d[i, h] = _f(r["delta"])
        changed[i, h] = r.get("verdict") == "changed"
    return np.ma.masked_array(d, mask=~changed | ~np.isfinite(d))


def draw_change(ax, summary: dict, reading: str, S: int, *, colorbar: bool = True) -> np.ma.MaskedArray:
    """The layers × heads map of B − A on ``ax``: changed cells on a diverging scale centred on 0
    (symmetric limits), the others light grey and hatched. Returns the masked array it colours."""
    from matplotlib.colors import ListedColormap

    m = change_matrix(summary, reading, S)
    layers = sorted({r["layer"] for r in _records(summary, reading, S, heads=True)}) or list(range(m.shape[0]))
    full = np.asarray(m.data, dtype=float)
    finite = np.abs(full[np.isfinite(full)])
    lim = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    grey = np.ma.masked_array(np.zeros(m.shape), mask=~m.mask)
    ax.imshow(grey, cmap=ListedColormap([GREY]), aspect="auto", interpolation="nearest")
    im = ax.imshow(m, cmap=CHANGE_CMAP, vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    for i, h in zip(*np.nonzero(m.mask)):
        ax.add_patch(_hatch(h, i))
    ax.set_xlabel("head")
    ax.set_ylabel("decoder layer (from 0)")
    _integer_ticks(ax, m.shape[1], m.shape[0], layers)
    ax.set_title(f"{reading}: B − A at {S} tokens (grey: unchanged)", fontsize=9)
    if colorbar:
        cb = ax.figure.colorbar(im, ax=ax, shrink=0.9)
        cb.set_label(f"Δ {UNITS.get(reading, reading)} (B − A)", fontsize=8)
    im.poslens_delta = m  # the coloured array, for the tests and for callers
    return m


def _hatch(h: int, i: int):
    from matplotlib.patches import Rectangle

    return Rectangle((h - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="#a0a0a0", linewidth=0)


def _integer_ticks(ax, H: int, L: int, layers: list) -> None:
    step_h, step_l = max(1, H // 16), max(1, L // 16)
    ax.set_xticks(range(0, H, step_h))
    ax.set_yticks(range(0, L, step_l))
    ax.set_yticklabels([str(layers[i]) if i < len(layers) else str(i) for i in range(0, L, step_l)])
    ax.tick_params(labelsize=7)


def draw_layers(ax, summary: dict, reading: str, S: int) -> bool:
    """A reading by layer for A and B at length ``S``: A inside ± its floor, B with markers, changed
    layers ringed. False when the run has no such per-layer rows."""
    recs = sorted(_records(summary, reading, S, heads=False), key=lambda r: r["layer"])
    if not recs:
        return False
    x = np.array([r["layer"] for r in recs])
    a, b = np.array([_f(r["a"]) for r in recs]), np.array([_f(r["b"]) for r in recs])
    floor = np.array([_f(r.get("floor")) for r in recs])
    ax.fill_between(x, a - np.nan_to_num(floor), a + np.nan_to_num(floor), color=COLOUR_A, alpha=0.18, lw=0,
                    label="A ± floor")
    ax.plot(x, a, color=COLOUR_A, lw=1.2, label="A")
    ax.plot(x, b, color=COLOUR_B, lw=1.0, ls="--", marker="o", ms=3, label="B")
    ch = np.array([r.get("verdict") == "changed" for r in recs])
    if ch.any():
        ax.scatter(x[ch], b[ch], s=60, facecolors="none", edgecolors="black", linewidths=1.0, zorder=3,
                   label="changed")
    ax.set_title(reading, fontsize=9)
    ax.set_xlabel("decoder layer (from 0)", fontsize=8)
    ax.set_ylabel(UNITS.get(reading, reading), fontsize=7)
    ax.tick_params(labelsize=7)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return True


def _length_series(summary: dict, reading: str) -> tuple[list, list, list]:
    """``(lengths, A, B)``: the loss over all positions, else the reading's mean over layers, per length."""
    xs, ya, yb = [], [], []
    for S in summary.get("seq_lens") or []:
        if reading == "loss":
            recs = _loss_records(summary, S)[:1]  # a length's first loss row: the overall loss
        else:
            recs = _records(summary, reading, S, heads=False)
        a = [_f(r["a"]) for r in recs if r.get("a") is not None]
        b = [_f(r["b"]) for r in recs if r.get("b") is not None]
        if a and b:
            xs.append(S)
            ya.append(float(np.mean(a)))
            yb.append(float(np.mean(b)))
    return xs, ya, yb


def _trained_line(ax, summary: dict, reach: float) -> None:
    """A vertical line at the trained context where the plotted positions reach it."""
    T = summary.get("trained_context")
    if T is not None and float(T) <= reach:
        ax.axvline(float(T), color="black", lw=0.8, ls=":")
        ax.text(float(T), 1.0, " trained context", transform=ax.get_xaxis_transform(), fontsize=6, va="top")


def draw_lengths(ax, summary: dict, reading: str) -> bool:
    xs, ya, yb = _length_series(summary, reading)
    if not xs:
        return False
    ax.plot(xs, ya, color=COLOUR_A, marker="o", ms=3, lw=1.2, label="A")
    ax.plot(xs, yb, color=COLOUR_B, marker="s", ms=3, lw=1.0, ls="--", label="B")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(s) for s in xs], fontsize=7)
    ax.minorticks_off()
    _trained_line(ax, summary, max(xs))
    ax.set_title(reading, fontsize=9)
    ax.set_xlabel("sequence length (tokens)", fontsize=8)
    ax.set_ylabel(UNITS.get(reading, reading), fontsize=7)
    ax.tick_params(labelsize=7)
    return True


def draw_loss(ax, summary: dict, lengths: list | None = None) -> bool:
    """Next-token loss by position bucket (its middle, log scale), one line per side per length."""
    import matplotlib

    lengths = list(lengths or summary.get("seq_lens") or [])
    colours = matplotlib.colormaps["viridis"](np.linspace(0.0, 0.8, max(1, len(lengths))))
    drawn = False
    for c, S in zip(colours, lengths):
        recs = [r for r in _loss_records(summary, S)[1:] if r.get("positions")]
        if not recs:
            continue
        x = [(r["positions"][0] + r["positions"][1]) / 2 for r in recs]
        ax.plot(x, [_f(r["a"]) for r in recs], color=c, lw=1.2, marker="o", ms=3, label=f"A, {S} tokens")
        ax.plot(x, [_f(r["b"]) for r in recs], color=c, lw=1.0, ls="--", marker="s", ms=3, label=f"B, {S} tokens")
        drawn = True
    if not drawn:
        return False
    ax.set_xscale("log", base=2)
    _trained_line(ax, summary, max(lengths) - 1)
    ax.set_xlabel("position of the predicted token (bucket middle)", fontsize=8)
    ax.set_ylabel(UNITS["loss"], fontsize=8)
    ax.set_title("next-token loss by position (solid: A, dashed: B)", fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.tick_params(labelsize=7)
    return True


# --------------------------------------------------------------------------------------------
# the run's figures
# --------------------------------------------------------------------------------------------
def _grid(n: int, columns: int = 5, inches=(2.6, 2.2)):
    from poslens.rundir.figures import new_figure

    ncol = max(1, min(columns, n))
    nrow = -(-n // ncol)
    return new_figure(nrow, ncol, figsize=(inches[0] * ncol, inches[1] * nrow), squeeze=False)


def _finish(fig, axes, drawn: int, title: str):
    for ax in list(axes.flat)[drawn:]:
        ax.set_visible(False)
    seen = {}
    for ax in list(axes.flat)[:drawn]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen.keys()), loc="lower center", ncol=len(seen), fontsize=7,
                   frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    return fig


def layers_figure(summary: dict, S: int | None = None):
    S = _longest(summary) if S is None else S
    panels = [p for p in LAYER_PANELS if _records(summary, p, S, heads=False)]
    if not panels:
        return None
    fig, axes = _grid(len(panels))
    for ax, p in zip(axes.flat, panels):
        draw_layers(ax, summary, p, S)
    return _finish(fig, axes, len(panels), f"each reading by decoder layer (from 0) at {S} tokens: "
                                           f"{_label(summary, 'a')} against {_label(summary, 'b')}")


def lengths_figure(summary: dict):
    if len(summary.get("seq_lens") or []) < 2:
        return None
    panels = [p for p in (*LAYER_PANELS, "loss") if _length_series(summary, p)[0]]
    if not panels:
        return None
    fig, axes = _grid(len(panels), columns=4)
    for ax, p in zip(axes.flat, panels):
        draw_lengths(ax, summary, p)
    return _finish(fig, axes, len(panels), "each reading's mean over decoder layers (loss: over all positions) against "
                                           "length, A solid, B dashed")


def compare_figures(summary: dict, tensors: dict, out_dir) -> list[str]:
    """Write the comparison's figures (the module docstring) into ``out_dir``; returns the file names.
    ``tensors``: the run's ``compare.safetensors`` (the figures read the summary's records)."""
    from poslens.rundir.figures import new_figure, save_figure

    out_dir = Path(out_dir)
    S = _longest(summary)
    written = []
    fig = layers_figure(summary, S)
    if fig is not None:
        save_figure(fig, out_dir / "compare_layers.png")
        written.append("compare_layers.png")
    for reading in HEAD_READINGS:
        if not _records(summary, reading, S, heads=True):
            continue
        L = int(summary["num_layers"])
        fig, ax = new_figure(figsize=(max(3.6, 1.6 + 0.3 * int(summary["num_heads"])), max(2.4, 1.2 + 0.22 * L)))
        draw_change(ax, summary, reading, S)
        fig.tight_layout()
        save_figure(fig, out_dir / f"compare_change_{reading}.png")
        written.append(f"compare_change_{reading}.png")
    fig = lengths_figure(summary)
    if fig is not None:
        save_figure(fig, out_dir / "compare_lengths.png")
        written.append("compare_lengths.png")
    fig, ax = new_figure(figsize=(7.0, 3.4))
    if draw_loss(ax, summary):
        fig.tight_layout()
        save_figure(fig, out_dir / "compare_loss.png")
        written.append("compare_loss.png")
    return written


# --------------------------------------------------------------------------------------------
# CompareResult.plot
# --------------------------------------------------------------------------------------------
def compare_plot(result, name: str = "change", reading: str = "sink", *, seq_len: int | None = None, ax=None):
    """One figure of a comparison (:meth:`poslens.api.result.CompareResult.plot`): ``change`` (the layers ×
    heads map of ``reading``), ``layers`` (``reading`` by layer), ``lengths`` (``reading`` or ``loss`` against
    length), ``loss`` (by position); a :class:`poslens.figures.NotebookFigure` unless ``ax`` is given."""
    from poslens.figures import notebook_figure

    summary = result.summary
    if name not in PLOT_NAMES:
        raise PoslensError(f"plot({name!r}): a comparison draws {', '.join(PLOT_NAMES)}.")
    lengths = [int(s) for s in summary.get("seq_lens") or []]
    S = _longest(summary) if seq_len is None else seq_len
    if S not in lengths:
        raise PoslensError(f"plot({name!r}, seq_len={seq_len!r}): the comparison has lengths "
                           f"{', '.join(map(str, lengths))}.")
    have = {r.get("reading") for r in summary.get("changes") or []}
    if name == "change":
        valid = [r for r in HEAD_READINGS if _records(summary, r, S, heads=True)]
    elif name == "layers":
        valid = [r for r in (*LAYER_PANELS, "band_high", "band_medium") if _records(summary, r, S, heads=False)]
    elif name == "lengths":
        valid = [r for r in (*LAYER_PANELS, "band_high", "band_medium", "loss") if r in have]
    else:
        valid = None
    if valid is not None and reading not in valid:
        raise PoslensError(f"plot({name!r}, reading={reading!r}): the comparison's {name} figure draws "
                           f"{', '.join(valid) or 'nothing'}.")
    fig, ax = (ax.figure, ax) if ax is not None else notebook_figure(figsize=(6.4, 4.0))
    if name == "change":
        draw_change(ax, summary, reading, S)
    elif name == "layers":
        draw_layers(ax, summary, reading, S)
        ax.legend(fontsize=7)
    elif name == "lengths":
        draw_lengths(ax, summary, reading)
        ax.legend(fontsize=7)
    else:
        draw_loss(ax, summary, lengths if seq_len is None else [S])
    fig.tight_layout()
    return fig
