"""The fingerprint page: models in columns, every figure on shared axes and colour scales.

:func:`render_page` draws the figures from ``fingerprint.json``'s content alone (so a written
fingerprint renders again from its json) and returns ``(html, {file name: PNG bytes})``. The page
is one self-contained file like the report's (figures as ``data:`` URIs, no scripts, the same
Content-Security-Policy).
"""

from __future__ import annotations

import datetime as _dt
import math

from poslens.fmt import fmt
from poslens.metrics import verdicts as V
from poslens.metrics.judge.fingerprint import judge_claims
from poslens.reporting.columns import definitions, layer_type
from poslens.reporting.page import CSP, template_env
from poslens.reporting.readings.fingerprint import fingerprint_readings, pct, render_findings
from poslens.rope import BANDS

#: band colours (high -> low frequency, then the unrotated dims)
BAND_COLOURS = {"high": "#d95f02", "medium": "#e6ab02", "low": "#1b9e77", "unrotated": "#999999"}
#: marker colour per layer type (Gemma 3's two kinds; one-kind models use the first)
TYPE_COLOURS = {"rope": "#2f5fa7", "sliding_attention": "#2f5fa7", "full_attention": "#b42318",
                "no_rope": "#777777"}

FIGURE_CAPTIONS = {
    "fingerprint_sink.png": "Top: each head's mean attention weight on key 0 (queries 1 … S−1, text), head × "
                            "layer, one colour scale 0 … 1 for every model. Bottom: per layer, the share of heads "
                            "whose weight on key 0 exceeds ε, on text and on random tokens.",
    "fingerprint_positional.png": "Per layer: the relativity index of the mean score map (key 0 left out, "
                                  "noise-corrected; a cross at 0 marks a layer whose map is flat against its noise "
                                  "floor), the signed diagonal trend (± 2 standard errors), and the per-sequence "
                                  "APS of the residual stream (mean ± sd over sequences; 0.5 is chance). Colours mark layer types.",
    "fingerprint_frequency.png": "Top: per layer, the share of q·k energy in the high-, medium- and low-frequency "
                                 "RoPE pairs (and unrotated dims), from pre-RoPE pair norms. Bottom: each head's "
                                 "low-frequency share, head × layer, colour scale 0 … 1.",
    "fingerprint_massive.png": "Massive dimensions per layer (RMS above λ × the layer's mean, Jin et al.): pre-RoPE "
                               "queries (left bars) and keys (right bars), the low-frequency ones in green.",
    "fingerprint_slash.png": "Slash heads (SlashScore ≥ κ at some Δ in the slash range): their score on text "
                             "against random tokens; on or above the diagonal, the head does not depend on the "
                             "text. Labels: layer.head Δ.",
}


TRAIT_ROWS = [  # (label, function of an aggregate -> cell)
    ("layers (RoPE)", lambda o: f"{o['layers']} ({o['rope_layers']})"),
    ("sink heads, text", lambda o: pct(o["sink_rate"])),
    ("sink heads, random", lambda o: pct(o["sink_rate_random"])),
    ("slash heads (persist)", lambda o: f"{o['slash_heads']} ({o['slash_persist']})"),
    ("relativity (median)", lambda o: fmt(o["relativity_median"])),
    ("non-flat layers", lambda o: f"{o['nonflat_layers']}/{o['layers']}"),
    ("signed trend (mean)", lambda o: fmt(o["trend_mean"], signed=True)),
    ("APS min–max", lambda o: f"{fmt(o['aps_min'])}–{fmt(o['aps_max'])}"),
    ("RoPE energy hi/med/lo", lambda o: "/".join("—" if o["freq"][b] is None else f"{100 * o['freq'][b]:.0f}"
                                                  for b in BANDS) + " %"),
    ("massive Q dims (low)", lambda o: f"{o['massive_q']} ({pct(o['massive_q_low_share'])})"),
    ("massive K dims (low)", lambda o: f"{o['massive_k']} ({pct(o['massive_k_low_share'])})"),
]


def _short(name: str, width: int = 18) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def terminal_tables(summary: dict, per_table: int = 3) -> list:
    """rich Tables of the traits, models in columns (``per_table`` models each, so a table fits 80
    columns), with one block of rows per layer type where a model has several."""
    from poslens.fmt import rich_table

    tables = []
    models = summary["models"]
    for i in range(0, len(models), per_table):
        ms = models[i:i + per_table]
        rows = [[label] + [fn(m["overall"]) for m in ms] for label, fn in TRAIT_ROWS]
        types = sorted({t for m in ms for t in m["layer_types"]})
        for t in types:
            for label, fn in TRAIT_ROWS[1:5] + TRAIT_ROWS[8:9]:
                rows.append([f"{t.replace('_attention', '')}: {label}"]
                            + [fn(m["layer_types"][t]) if t in m["layer_types"] else "—" for m in ms])
        tables.append(rich_table(f"fingerprint: {summary['num_seqs']} × {summary['seq_len']} tokens "
                                 "(text; random tokens)", ["trait"] + [_short(m["name"]) for m in ms], rows))
    return tables


def _png(fig) -> bytes:
    from poslens.rundir.figures import figure_png

    return figure_png(fig, dpi=100)


def _cols(models) -> int:
    return max(1, len(models))


#: the fingerprint's figures: at most this wide (inches, at 100 dpi about a report column's width, so a
#: page shows them at their own size), one column of panels per model, each at most 4.2 inches and at
#: least 2.8 (beyond three models a figure grows wider and a page scales it down)
PAGE_INCHES, MODEL_INCHES = 10.0, (2.8, 4.2)


def _width(models, extra: float = 0.0, most: float = MODEL_INCHES[1]) -> float:
    """Figure width for one column of panels per model plus ``extra`` inches (a colour bar)."""
    n = _cols(models)
    return n * min(most, max(MODEL_INCHES[0], (PAGE_INCHES - extra) / n)) + extra


def _xlim(models):
    n = max(m["num_layers"] for m in models)
    return (-0.7, n - 0.3)


def _heat(ax, rows, title, vmax=1.0, cmap="viridis"):
    import numpy as np

    m = np.array(rows, dtype=float).T  # [H, L]
    return ax.imshow(m, aspect="auto", origin="lower", vmin=0.0, vmax=vmax, cmap=cmap, interpolation="nearest")


def sink_figure(models, eps: float):
    from poslens.rundir.figures import new_figure

    n = _cols(models)
    fig, axes = new_figure(2, n, figsize=(_width(models, 0.8), 5.6), squeeze=False)
    im = None
    for c, m in enumerate(models):
        ls = m["layers"]
        im = _heat(axes[0][c], [r["sink_heads"] for r in ls], m["name"])
        axes[0][c].set_title(m["name"], fontsize=9)
        axes[0][c].set_xlim(*_xlim(models))
        ax = axes[1][c]
        x = [r["layer"] for r in ls]
        ax.plot(x, [r["sink_share"] for r in ls], "o-", ms=3, label="text")
        ax.plot(x, [r["sink_share_random"] for r in ls], "s--", ms=3, label="random tokens")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlim(*_xlim(models))
        ax.set_xlabel("layer (from 0)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("head")
    axes[1][0].set_ylabel(f"share of heads > {eps:g}")
    axes[1][0].legend(fontsize=7)
    fig.colorbar(im, ax=[a for row in axes for a in row], label="weight on key 0 (top)", shrink=0.6)
    return fig


def positional_figure(models):
    from poslens.rundir.figures import new_figure

    n = _cols(models)
    fig, axes = new_figure(3, n, figsize=(_width(models), 7.2), squeeze=False, sharey="row")
    for c, m in enumerate(models):
        ls = m["layers"]
        for r in ls:
            col = TYPE_COLOURS.get(r["type"], "#2f5fa7")
            if r["relativity_index"] is None:
                axes[0][c].plot(r["layer"], 0.0, "x", color="#999999", ms=5)
            else:
                axes[0][c].plot(r["layer"], r["relativity_index"], "o", color=col, ms=4)
            if r["diagonal_trend"] is not None:
                se = r["diagonal_trend_se"]
                axes[1][c].errorbar(r["layer"], r["diagonal_trend"], yerr=None if se is None else 2 * se, fmt="o",
                                    color=col, ms=3, capsize=2)
            if r["aps_mean"] is not None:
                axes[2][c].errorbar(r["layer"], r["aps_mean"], yerr=r["aps_std"], fmt="o", color=col, ms=3,
                                    capsize=2)
        axes[0][c].set_title(m["name"], fontsize=9)
        axes[0][c].set_ylim(-0.05, 1.05)
        axes[1][c].axhline(0.0, color="k", lw=0.6)
        axes[2][c].axhline(0.5, color="k", lw=0.6, ls=":")
        for ax in axes[:, c] if hasattr(axes, "shape") else [a[c] for a in axes]:
            ax.set_xlim(*_xlim(models))
            ax.grid(alpha=0.3)
        axes[2][c].set_xlabel("layer (from 0)")
        types = sorted({r["type"] for r in ls})
        if len(types) > 1:
            from matplotlib.lines import Line2D

            axes[0][c].legend([Line2D([], [], marker="o", ls="", color=TYPE_COLOURS.get(t, "#2f5fa7")) for t in types],
                              [t.replace("_attention", "") for t in types], fontsize=7, loc="lower left")
    axes[0][0].set_ylabel("relativity index")
    axes[1][0].set_ylabel("signed trend")
    axes[2][0].set_ylabel("APS")
    fig.tight_layout()
    return fig


def frequency_figure(models):
    from poslens.rundir.figures import new_figure

    n = _cols(models)
    fig, axes = new_figure(2, n, figsize=(_width(models, 0.8), 5.6), squeeze=False)
    im = None
    for c, m in enumerate(models):
        ls = m["layers"]
        x = [r["layer"] for r in ls]
        bottom = [0.0] * len(ls)
        for b in (*BANDS, "unrotated"):
            v = [r["freq"].get(b) or 0.0 for r in ls]
            if b == "unrotated" and not any(v):
                continue
            axes[0][c].bar(x, v, bottom=bottom, color=BAND_COLOURS[b], width=0.85, label=b)
            bottom = [p + q for p, q in zip(bottom, v)]
        axes[0][c].set_ylim(0, 1.16)
        axes[0][c].set_xlim(*_xlim(models))
        axes[0][c].set_title(m["name"], fontsize=9)
        im = _heat(axes[1][c], [r["freq_heads"]["low"] for r in ls], m["name"])
        axes[1][c].set_xlim(*_xlim(models))
        axes[1][c].set_xlabel("layer (from 0)")
    axes[0][0].set_ylabel("share of q·k energy")
    axes[1][0].set_ylabel("head")
    axes[0][0].legend(fontsize=7, loc="upper left", ncol=4, framealpha=0.9)
    fig.colorbar(im, ax=[a for row in axes for a in row], label="low-frequency share (bottom)", shrink=0.6)
    return fig


def massive_figure(models):
    from poslens.rundir.figures import new_figure

    n = _cols(models)
    fig, axes = new_figure(1, n, figsize=(_width(models), 3.0), squeeze=False, sharey="row")
    for c, m in enumerate(models):
        ax = axes[0][c]
        ls = m["layers"]
        for off, key in ((-0.2, "q"), (0.2, "k")):
            x = [r["layer"] + off for r in ls]
            low = [r[f"massive_{key}_bands"]["low"] for r in ls]
            rest = [r[f"massive_{key}"] - lo for r, lo in zip(ls, low)]
            ax.bar(x, low, width=0.38, color=BAND_COLOURS["low"], label="low-frequency" if key == "q" else None)
            ax.bar(x, rest, width=0.38, bottom=low, color="#7570b3", label="other" if key == "q" else None)
        ax.set_title(m["name"], fontsize=9)
        ax.set_xlim(*_xlim(models))
        ax.set_xlabel("layer (from 0); left bar Q, right bar K")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("massive dims")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def slash_figure(models, kappa: float):
    from poslens.rundir.figures import new_figure

    n = _cols(models)
    fig, axes = new_figure(1, n, figsize=(_width(models, most=3.6), 3.6), squeeze=False)
    for c, m in enumerate(models):
        ax = axes[0][c]
        ax.plot([0, 1], [0, 1], color="k", lw=0.6)
        ax.axhline(kappa, color="#999999", lw=0.6, ls=":")
        ax.axvline(kappa, color="#999999", lw=0.6, ls=":")
        for s in m["slash_heads"]:
            ax.plot(s["score"], s["score_random"], "o", ms=4, color="#1b9e77" if s["persists"] else "#b42318")
            ax.annotate(f"{s['layer']}.{s['head']} Δ{s['delta']}", (s["score"], s["score_random"]), fontsize=6,
                        xytext=(2, 2), textcoords="offset points")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"{m['name']}: {len(m['slash_heads'])} heads", fontsize=9)
        ax.set_xlabel("SlashScore on text")
    axes[0][0].set_ylabel("SlashScore on random tokens")
    fig.tight_layout()
    return fig


def figures(summary: dict) -> dict[str, bytes]:
    """Every figure of the page as PNG bytes, by file name."""
    ms, th = summary["models"], summary["thresholds"]
    return {
        "fingerprint_sink.png": _png(sink_figure(ms, th["sink_eps"])),
        "fingerprint_positional.png": _png(positional_figure(ms)),
        "fingerprint_frequency.png": _png(frequency_figure(ms)),
        "fingerprint_massive.png": _png(massive_figure(ms)),
        "fingerprint_slash.png": _png(slash_figure(ms, th["slash_kappa"])),
    }


def overview_table(summary: dict) -> dict:
    """The traits of every model, models in columns (the page's and ``summary.json``'s table)."""
    ms = summary["models"]
    rows = [[label] + [fn(m["overall"]) for m in ms] for label, fn in TRAIT_ROWS]
    # the trait column's definition: poslens.reporting.columns; a model's column: its own
    defs = {m["name"]: f"the traits of the model {m['name']}, over all its layers" for m in ms}
    return {"title": f"positional fingerprint ({summary['num_seqs']} × {summary['seq_len']} tokens, text and random "
                     "tokens; layers from 0)", "columns": ["trait"] + [m["name"] for m in ms], "rows": rows,
            "definitions": defs}


def _by_type(summary: dict) -> list[dict]:
    out = []
    for m in summary["models"]:
        if not m["layer_types"]:
            continue
        types = list(m["layer_types"])
        rows = [[label] + [fn(m["layer_types"][t]) for t in types] for label, fn in TRAIT_ROWS]
        out.append({"title": f"{m['name']}: traits per layer type", "columns": ["trait"] + types, "rows": rows,
                    "definitions": {t: layer_type(t) for t in types}})
    return out


def _slash_table(m: dict) -> dict:
    rows = [[f"{s['layer']}.{s['head']}", s["delta"], fmt(s["score"]), fmt(s["score_random"]),
             "yes" if s["persists"] else "no", fmt(s["q_top1_energy"]), fmt(s["k_top1_energy"]),
             s["predicted_delta"] if s["predicted_delta"] is not None else "—"] for s in m["slash_heads"]]
    return {"title": f"{m['name']}: slash heads", "rows": rows,
            "columns": ["layer.head", "Δ", "text", "random", "persists", "q σ1²/Σσ²", "k σ1²/Σσ²", "RoPE Δ"]}


def _massive_table(m: dict, top: int = 8) -> dict:
    rows = []
    for key in ("q", "k"):
        for d in m["massive"][key][:top]:
            rows.append([key.upper(), f"{d['layer']}.{d['head']}", d["dim"], "—" if d["pair"] is None else d["pair"],
                         d["band"], fmt(d["ratio"])])
    return {"title": f"{m['name']}: strongest massive dims (of {len(m['massive']['q'])} Q, {len(m['massive']['k'])} K)",
            "columns": ["Q/K", "layer.head", "dim", "pair", "band", "RMS / mean"], "rows": rows}


def page_tables(summary: dict) -> dict[str, list[dict]]:
    """The page's tables by section (``overview``, ``by_type``, ``slash``, ``massive``), each with
    ``defs``: its columns' definitions, shown under it (the table's own first, then
    :mod:`poslens.reporting.columns`, as in the report)."""
    def defined(t: dict) -> dict:
        return {**t, "defs": definitions(t["columns"], t.get("definitions"))}

    ms = summary["models"]
    return {"overview": [defined(overview_table(summary))], "by_type": [defined(t) for t in _by_type(summary)],
            "slash": [defined(_slash_table(m)) for m in ms], "massive": [defined(_massive_table(m)) for m in ms]}


def _uri(png: bytes) -> str:
    from poslens.reporting.elements import embed_bytes

    return embed_bytes(png)  # with a palette: a quarter of the weight


def render_page(summary: dict, *, figures: bool = True) -> tuple[str, dict]:
    """``(html, {file: png})`` of a fingerprint summary (``figures=False``: a page without figures); the key
    findings rendered from the summary's verdict records (judged here where it holds none)."""
    from poslens import __version__ as version

    figs = globals()["figures"](summary) if figures else {}
    tables = page_tables(summary)
    blocks = summary.get("findings") or judge_claims(summary["models"], summary["thresholds"])
    ctx = {
        "title": summary["title"], "csp": CSP, "version": version,
        "generated": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "summary": summary, "lines": fingerprint_readings(summary), "overview": tables["overview"][0],
        "by_type": tables["by_type"],
        "figures": [{"file": k, "uri": _uri(v), "caption": FIGURE_CAPTIONS[k]} for k, v in figs.items()],
        "slash_tables": tables["slash"], "massive_tables": tables["massive"],
        "definitions": summary["definitions"], "findings": render_findings(blocks),
        "isfinite": lambda x: isinstance(x, (int, float)) and math.isfinite(x), "level": V.LEVEL,
    }
    return template_env().get_template("fingerprint.html.j2").render(**ctx), figs


def fingerprint_page(summary: dict, *, figures: bool = True) -> dict:
    """What the page adds to a fingerprint's run directory (:data:`poslens.analysis.fingerprint.Page`): the
    html, the figures as PNG bytes and their captions, and the traits table of its ``summary.json``."""
    html, figs = render_page(summary, figures=figures)
    return {"html": html, "figures": figs, "captions": {f: FIGURE_CAPTIONS[f] for f in figs},
            "tables": [overview_table(summary)]}
