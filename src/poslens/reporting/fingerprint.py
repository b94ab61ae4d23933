"""The fingerprint page: models in columns, every figure on shared axes and colour scales.

:func:`render_page` draws the figures from ``fingerprint.json``'s content alone (so a written
fingerprint renders again from its json) and returns ``(html, {file name: PNG bytes})``. The page
is one self-contained file like the report's (figures as ``data:`` URIs, no scripts, the same
Content-Security-Policy).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics

from poslens.fmt import fmt
from poslens.metrics import verdicts as V
from poslens.reporting.columns import definitions, layer_type
from poslens.reporting.readings.common import few_groups
from poslens.reporting.page import CSP, template_env
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
                                  "APS (mean ± sd over sequences; 0.5 is chance). Colours mark layer types.",
    "fingerprint_frequency.png": "Top: per layer, the share of q·k energy in the high-, medium- and low-frequency "
                                 "RoPE pairs (and unrotated dims), from pre-RoPE pair norms. Bottom: each head's "
                                 "low-frequency share, head × layer, colour scale 0 … 1.",
    "fingerprint_massive.png": "Massive dimensions per layer (RMS above λ × the layer's mean, Jin et al.): pre-RoPE "
                               "queries (left bars) and keys (right bars), the low-frequency ones in green.",
    "fingerprint_slash.png": "Slash heads (SlashScore ≥ κ at some Δ in the slash range): their score on text "
                             "against random tokens; on or above the diagonal, the head does not depend on the "
                             "text. Labels: layer.head Δ.",
}


def pct(x) -> str:
    """A share as a whole percentage (``—`` when missing); a share strictly between 0 and 1 never reads
    as 0 % or 100 % (235 of 236 is ">99%", not "100%")."""
    if x is None:
        return "—"
    if 0 < x < 0.005:
        return "<1%"
    if 0.995 <= x < 1:
        return ">99%"
    return f"{100 * x:.0f}%"


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


# --------------------------------------------------------------------------------------------
# key findings: per paper, the claim, what each model shows against chance and noise, a verdict
# --------------------------------------------------------------------------------------------
REPRODUCED, NOT_REPRODUCED, CANNOT_JUDGE = "reproduced", "not reproduced", "cannot be judged here"
_VERDICT_CLASS = {REPRODUCED: "reproduced", NOT_REPRODUCED: "not-reproduced", CANNOT_JUDGE: "cannot-judge"}


_p = pct


def _uniform_slash(S: int, d: int) -> float:
    """SlashScore(d) of uniform causal attention (every query spreads its weight evenly)."""
    return sum(1.0 / (i + 1) for i in range(d, S)) / (S - d)


def _finding(verdict: str, text: str, why: str, numbers: dict, **extra) -> dict:
    return {"text": text, "why": why, **numbers, **extra, "verdict": verdict}


def _against(n: dict, share: bool = True) -> str:
    """The numbers a verdict is held to, in words: " [measured 64%; chance 62%, noise floor 67%; the verdict
    needs 10 percentage points beyond both]" (``share=False``: plain numbers, as for APS)."""
    f = _p if share else fmt
    fl = n["floor"] if n["floor"] > n["chance"] + 5e-4 else None
    need = f"{100 * n['threshold']:.0f} percentage points" if share else fmt(n["threshold"])
    return (f" [measured {f(n['value']) if n['value'] is not None else '—'}; chance {f(n['chance'])}"
            + (f", noise floor {f(fl)}" if fl is not None else "") + f"; the verdict needs {need} beyond both]")


def _sink_finding(m: dict, eps: float) -> dict:
    o, S = m["overall"], m["seq_len"]
    even = sum(1.0 / (i + 1) for i in range(1, S)) / (S - 1)  # weight on key 0 of a head attending evenly
    heads = m["num_layers"] * m["num_heads"]
    chance = 1.0 if even > eps else 0.0  # the share of evenly attending heads over eps
    n = V.measured(o["sink_rate"], chance, V.binomial_floor(chance, heads), V.THRESHOLDS["sink"],
                   f"share of heads whose mean weight on key 0 exceeds eps = {eps:g} (text)")
    rnd = f", {_p(o['sink_rate_random'])} on random tokens" if o.get("sink_rate_random") is not None else ""
    mean = (f"; their mean weight on it is {_p(o['sink_mean'])}" if o.get("sink_mean") is not None else "")
    text = (f"{_p(o['sink_rate'])} of its {heads} heads put more than {_p(eps)} of their "
            f"attention on the first token of running text{rnd}{mean} (a head "
            f"that spread its attention evenly would put {_p(even)} there).")
    if V.holds(n):
        return _finding(REPRODUCED, text, "Many heads use the first position as a resting place, on text and on "
                        "meaningless tokens alike.", n)
    return _finding(CANNOT_JUDGE, text, "The sequences are cut from one long stream of text, so they do not begin "
                    "with the model's start-of-text token; models such as Gemma keep their sink on that token, not on "
                    "whatever comes first.", n)


def _too_few_groups(ls: list[dict]) -> str:
    """Why the layers' sign-flip tests are too weak to find nothing ("" where they are not): with G
    sequence groups the smallest p-value is 2 / 2^G, which must lie well under the level
    (:func:`poslens.reporting.readings.common.few_groups`, the report's own rule)."""
    few = few_groups(ls)
    return few[0].upper() + few[1:] + "; scan more sequences." if few else ""


def _kim_nope_finding(m: dict) -> dict:
    """Without RoPE the paper's claim is that the causal mask alone makes scores depend on position
    (from the second layer on, favouring nearby keys): the test is whether a layer's mean score map is
    flat beyond its noise floor, not whether it is relative."""
    ls = m["layers"]
    later = ls[1:]
    tested, moved = V.layer_share(later, "flat_p")
    n = V.measured(len(moved) / len(later) if later else None, 0.0, V.binomial_floor(V.LEVEL, len(tested)),
                   V.THRESHOLDS["relativity"], "share of the layers after the first whose mean score map varies with "
                   "position beyond its noise floor (a model without position: none)")
    ps = ", ".join(f"layer {r['layer']}: p {fmt(r['flat_p'])}" for r in ls if r.get("flat_p") is not None)
    text = (f"without RoPE, in {len(moved)} of {len(later)} layers after the first the average attention score varies "
            f"with position beyond what sequence-to-sequence noise explains ({ps}; p-values held at a false discovery "
            f"rate of {V.LEVEL:g} over the layers)." + _against(n))
    if not tested:
        return _finding(CANNOT_JUDGE, text, "The scan had too few sequences for a noise floor, or the model has a "
                        "single layer.", n)
    if V.holds(n):
        return _finding(REPRODUCED, text, "The causal mask alone gives the scores a position signal after the first "
                        "layer, as the paper predicts.", n)
    return _finding(CANNOT_JUDGE, text,
                    f"The position signal the causal mask builds is carried from the second layer on by the running "
                    f"mean of earlier tokens; in a model of {m.get('num_layers', 0)} layers and small width, briefly "
                    "trained, it stays below the noise floor of this many sequences. Position-dependent scores in the "
                    "first layer come from the text itself (nearby tokens are alike), not from the mask. The "
                    "parameter-free simulator (poslens simulate) shows the mask's effect far above its noise floor.", n)


def _kim_finding(m: dict) -> dict:
    ls = m["layers"]
    if not m.get("rope_layers") and not any(r.get("rope") for r in ls):
        return _kim_nope_finding(m)
    n, tested, nonrel = V.kim_numbers(ls)
    rel = m["overall"]["relativity_median"]
    text = (f"in {len(nonrel)} of {len(ls)} layers the average attention score depends on where the query sits, "
            f"not only on its distance to the key, beyond what sequence-to-sequence noise explains "
            f"(p-values held at a false discovery rate of {V.LEVEL:g} over the layers); the relativity index "
            f"(1 = distance alone) has median {fmt(rel)} over the layers that are not flat." + _against(n))
    if not tested:
        return _finding(CANNOT_JUDGE, text, "The scan had too few sequences for a noise floor.", n)
    if V.holds(n):
        return _finding(REPRODUCED, text, "With RoPE and the causal mask together, most layers are not purely "
                        "relative, as the paper finds in Llama, Phi and Qwen.", n)
    if _too_few_groups(tested):  # a test that could hardly reach the level finds nothing: no verdict
        return _finding(CANNOT_JUDGE, text, _too_few_groups(tested), n)
    if n["value"] <= n["floor"]:
        return _finding(NOT_REPRODUCED, text, "No more layers depart from a purely relative pattern than noise "
                        "alone would make depart.", n)
    return _finding(CANNOT_JUDGE, text, "Some layers depart from a purely relative pattern beyond their noise "
                    "floor, but not most; more or longer sequences would sharpen the test.", n)


def _dims_share(rope_ls: list[dict], bands: tuple[str, ...]) -> float | None:
    """The share of a head's dimensions (rotated and unrotated) that lie in ``bands``: where a head
    without a preference among dimensions puts its energy."""
    dims = [r["dims_by_band"] for r in rope_ls if r.get("dims_by_band")]
    total = sum(sum(d.values()) for d in dims)
    return sum(d.get(b, 0) for d in dims for b in bands) / total if total else None


def _fast(r: dict, h: int) -> float:
    return r["freq_heads"]["high"][h] + r["freq_heads"]["medium"][h]


def _slash_conditions(m: dict) -> list[dict]:
    """The paper's two conditions for slash heads, each against what chance gives: (1) pre-RoPE
    queries near rank one (chance: 1 / head_dim, an isotropic head), (2) RoPE energy dominated by the
    medium and high frequencies (chance: those bands' share of the dimensions; dominated: over half)."""
    sh = m["slash_heads"]
    out = []
    q1 = [s["q_top1_energy"] for s in sh if s.get("q_top1_energy") is not None]
    if q1:
        v = statistics.median(q1)
        out.append({"condition": "queries near rank one", "value": v, "chance": 1.0 / max(m.get("head_dim") or 1, 1),
                    "needs": 0.5, "met": v >= 0.5,
                    "measure": "median share of the slash heads' pre-RoPE query energy in the first singular direction"})
    by_layer = {r["layer"]: r for r in m["layers"] if r["rope"] and r.get("freq_heads")}
    fast = [_fast(by_layer[s["layer"]], s["head"]) for s in sh if s["layer"] in by_layer]
    chance = _dims_share(list(by_layer.values()), ("high", "medium"))
    if fast and chance is not None:
        v = statistics.mean(fast)
        out.append({"condition": "medium and high frequencies dominate", "value": v, "chance": chance, "needs": 0.5,
                    "met": v > 0.5, "measure": "mean share of the slash heads' q·k energy in the high and medium "
                                               "RoPE bands"})
    return out


def _slash_finding(m: dict, kappa: float) -> dict:
    sh, S = m["slash_heads"], m["seq_len"]
    uni = _uniform_slash(S, 1)
    persist = [s for s in sh if s["persists"]]
    # a head whose pattern comes from the text falls to about even attention on random tokens (SlashScore
    # ≈ 1/i, far below kappa): chance and the false-positive rate of the per-head test are 0
    n = V.measured(len(persist) / len(sh) if sh else None, 0.0, V.binomial_floor(0.0, len(sh)),
                   V.THRESHOLDS["slash"], f"share of the slash heads (SlashScore ≥ kappa = {kappa:g} at some Δ in "
                   "1 … 16) that stay ≥ kappa on uniformly random tokens")
    if not sh:
        return _finding(CANNOT_JUDGE, f"no head puts {_p(kappa)} of its attention on one fixed offset (1 … 16 tokens "
                        "back).", "Without slash heads there is nothing to test for persistence.", n, conditions=[])
    predicted = [s for s in sh if s.get("predicted_delta") is not None]
    match = sum(s["predicted_delta"] == s["delta"] for s in predicted)
    conds = _slash_conditions(m)
    head = (f"{len(sh)} heads put at least {_p(kappa)} of their attention a fixed number of tokens back (strongest: "
            f"layer.head {sh[0]['layer']}.{sh[0]['head']}, {_p(sh[0]['score'])} at {sh[0]['delta']} back, against "
            f"{_p(uni)} for even attention)")
    if any(s["persists"] is None for s in sh):
        return _finding(CANNOT_JUDGE, head + ".", "No scan of the same model on random tokens is given, so whether "
                        "these heads keep the pattern without meaningful text is not tested (scan with --data random "
                        "at the same --seq-len and report both).", n, conditions=conds)
    text = head + f"; {len(persist)} of them keep it on random tokens." + _against(n)
    for c in conds:
        if c["condition"] == "queries near rank one":
            text += (f" Condition 1, queries close to one direction: median {_p(c['value'])} of the energy in the "
                     f"first component (an isotropic head: {_p(c['chance'])}), {'met' if c['met'] else 'not met'}.")
        else:
            text += (f" Condition 2, medium and high RoPE frequencies dominate: they carry {_p(c['value'])} of these "
                     f"heads' energy, where {_p(c['chance'])} of the dimensions lie; "
                     + ("met." if c["met"] else "not met (under half), though above their share of dimensions."
                        if c["value"] > c["chance"] else "not met."))
    if predicted:
        text += f" The RoPE frequencies predict the right offset for {match} of {len(predicted)}."
    offsets = {s["delta"] for s in sh}
    if predicted and len(sh) > 1 and len(offsets) == 1:  # a predictor that always named this offset would match as often
        text += (f" All {len(sh)} sit at the same offset ({offsets.pop()}), so the prediction tells that offset apart "
                 f"from the other offsets, not one head's offset from another's.")
    if V.holds(n):
        return _finding(REPRODUCED, text, "These heads do not need meaningful text: the pattern is built into the "
                        "model, as the paper claims (the verdict is on persistence; the two conditions are stated "
                        "beside it).", n, conditions=conds)
    return _finding(NOT_REPRODUCED, text, "Most of these heads lose the pattern on random tokens, so here it depends "
                    "on the text.", n, conditions=conds)


def _zuo_finding(m: dict) -> dict:
    ls = [r for r in m["layers"] if r["aps_mean"] is not None]
    k = m.get("num_seqs") or 1
    nope = [r for r in ls if not r["rope"]]
    judged = nope or ls
    ses = [r["aps_std"] / math.sqrt(k) for r in judged if r.get("aps_std") is not None]
    n = V.measured(statistics.mean(r["aps_mean"] for r in judged) if judged else None, 0.5,
                   V.mean_floor(0.5, statistics.mean(ses) if ses else None), V.THRESHOLDS["aps"],
                   "mean over the layers " + ("without RoPE" if nope else "(all rotate q/k)") +
                   " of the per-sequence APS of the residual stream (no order: 0.5)")
    o = m["overall"]
    text = (f"nearby tokens' hidden states are more alike than distant ones: the adjacency probability score is "
            f"{fmt(n['value'])} on average over {'its ' + str(len(nope)) + ' layers without RoPE' if nope else 'its layers'}"
            f" (0.5 = no order, 1 = every token most like its nearest; range {fmt(o['aps_min'])} … {fmt(o['aps_max'])})."
            + _against(n, share=False))
    if not nope:
        return _finding(CANNOT_JUDGE, text, "The paper's claim concerns models without positional encoding; every "
                        "layer of this model rotates its queries and keys, so the number is context only.", n)
    if V.holds(n):
        return _finding(REPRODUCED, text, "The layers without RoPE show the adjacency pattern.", n)
    return _finding(NOT_REPRODUCED, text, "The order is beyond noise but small: the hidden states carry little "
                    "adjacency pattern." if n["value"] > n["floor"] else "The hidden states show no order beyond "
                    "noise.", n)


def _barbero_finding(m: dict) -> dict:
    rope_ls = [r for r in m["layers"] if r["rope"] and r.get("freq_heads")]
    chance = _dims_share(rope_ls, ("low",))
    if not rope_ls or chance is None:
        n = V.measured(None, 0.0, 0.0, V.THRESHOLDS["frequency"], "share of q·k energy in the low RoPE band")
        return _finding(CANNOT_JUDGE, "the model has no RoPE layer.", "Nothing rotates.", n)
    H = m["num_heads"]
    lows = [r["freq_heads"]["low"][h] for r in rope_ls for h in range(H)]
    se = statistics.stdev(lows) / math.sqrt(len(lows)) if len(lows) > 1 else None
    n = V.measured(statistics.mean(lows), chance, V.mean_floor(chance, se), V.THRESHOLDS["frequency"],
                   f"mean over heads of the share of q·k energy in the low RoPE band (pairs turning less than once "
                   f"over {m['seq_len']} tokens); chance: that band's share of the dimensions")
    f = m["overall"]["freq"]
    text = (f"{_p(n['value'])} of the query-key energy sits in the slowest-turning RoPE pairs (those that turn less "
            f"than once over {m['seq_len']} tokens), where {_p(chance)} of the dimensions lie; {_p(f['high'] or 0)} "
            f"in the fastest." + _against(n))
    by_layer = {r["layer"]: r for r in rope_ls}
    sh = [s for s in m["slash_heads"] if s["layer"] in by_layer]
    pos_fast = None
    if sh:
        sh_fast = statistics.mean(_fast(by_layer[s["layer"]], s["head"]) for s in sh)
        all_fast = statistics.mean(_fast(r, h) for r in rope_ls for h in range(H))
        pos_fast = sh_fast > all_fast
        text += f" Its slash heads put {_p(sh_fast)} in the faster pairs, against {_p(all_fast)} for all heads."
    else:
        text += " It has no slash head, so the claim's second half (positional heads on the fast pairs) is not tested."
    low_first = V.holds(n)
    if low_first and pos_fast is not False:
        why = "The slow pairs carry more energy than their share of dimensions" + (
            " and the positional heads lean on the fast ones" if pos_fast else "") + ", as the paper describes."
        return _finding(REPRODUCED, text, why + " The bands are measured against the scanned length: over a longer "
                        "scan more pairs complete a turn and leave the slow band.", n)
    return _finding(NOT_REPRODUCED, text, "The slow pairs carry about their share of the dimensions, no more."
                    if not low_first else "The positional heads do not lean on the fast pairs.", n)


def _jin_finding(m: dict) -> dict:
    o = m["overall"]
    rope_ls = [r for r in m["layers"] if r["rope"]]
    # where massive dims would fall by chance: the share of a head's dims that lie in low-frequency pairs
    chance = _dims_share(rope_ls, ("low",))
    mq, mk = o["massive_q"], o["massive_k"]
    total = mq + mk
    value = (o["massive_q_low"] + o["massive_k_low"]) / total if total else None
    n = V.measured(value, chance or 0.0, V.binomial_floor(chance or 0.0, total), V.THRESHOLDS["massive"],
                   "share of the massive query and key dimensions in the low RoPE band; chance: that band's share of "
                   "the dimensions")
    text = (f"{mq} query and {mk} key dimensions are more than {m['massive_lambda']:g} times as large as their "
            f"layer's average; {_p(o['massive_q_low_share'] or 0)} of the query ones and "
            f"{_p(o['massive_k_low_share'] or 0)} of the key ones sit in slowly turning RoPE pairs"
            + (f", where {_p(chance)} of all dimensions lie." if chance is not None else "."))
    if total == 0 or chance is None:
        return _finding(CANNOT_JUDGE, text, "No massive dimension, or no RoPE, to place.", n)
    text += _against(n)
    if V.holds(n):
        return _finding(REPRODUCED, text, "The very large values concentrate where RoPE turns slowly, as the paper "
                        "finds.", n)
    return _finding(NOT_REPRODUCED, text, "The very large values are not concentrated in the slowly turning pairs "
                    "beyond their share of the dimensions.", n)


#: per claim: the paper and its claim in plain words (the fingerprint page's and the report's key findings)
CLAIMS = {
    "sink": ("Gu et al., ICLR 2025: attention sinks", "Language models put a large share of their attention on the "
             "first token, in many heads, whatever that token is."),
    "kim": ("Kim et al., arXiv 2509.21042: the causal mask and RoPE", "The causal mask alone makes attention depend "
            "on position, and together with RoPE it bends RoPE's purely distance-based pattern into one that also "
            "depends on where the query sits."),
    "slash": ("Cheng et al., arXiv 2601.08297: slash heads", "Some heads attend to a fixed offset back; they keep "
              "doing so on random tokens, and arise when queries and keys point in nearly one direction before RoPE "
              "and RoPE's medium and high frequencies dominate."),
    "zuo": ("Zuo et al., COLING 2025: position without positional encoding", "Without any positional encoding, the "
            "causal mask makes nearby tokens' hidden states more alike than distant ones."),
    "barbero": ("Barbero et al., ICLR 2025: which RoPE frequencies are used", "Models put most query-key energy in "
                "the slowly turning RoPE pairs (meaning), and build positional heads from the fast ones."),
    "jin": ("Jin et al., ICML 2025: massive values in Q and K", "Queries and keys carry a few very large dimensions, "
            "concentrated in the slowly turning RoPE pairs."),
}


def findings(summary: dict) -> list[dict]:
    """The key findings block: one entry per paper with its claim and, per model, the measured
    sentence, the verdict and why."""
    th = summary["thresholds"]
    fns = {"sink": lambda m: _sink_finding(m, th["sink_eps"]), "kim": _kim_finding,
           "slash": lambda m: _slash_finding(m, th["slash_kappa"]), "zuo": _zuo_finding, "barbero": _barbero_finding,
           "jin": _jin_finding}
    papers = [(title, claim, fns[key]) for key, (title, claim) in CLAIMS.items()]
    out = []
    for title, claim, fn in papers:
        models = []
        for m in summary["models"]:
            f = fn(m)
            models.append({"name": m["name"], **f, "verdict_class": _VERDICT_CLASS[f["verdict"]]})
        out.append({"paper": title, "claim": claim, "models": models})
    return out


def _uri(png: bytes) -> str:
    from poslens.reporting.elements import embed_bytes

    return embed_bytes(png)  # with a palette: a quarter of the weight


def render_page(summary: dict, *, figures: bool = True, findings: list[dict] | None = None) -> tuple[str, dict]:
    """``(html, {file: png})`` of a fingerprint summary (``figures=False``: a page without figures)."""
    from poslens import __version__ as version

    figs = globals()["figures"](summary) if figures else {}
    tables = page_tables(summary)
    ctx = {
        "title": summary["title"], "csp": CSP, "version": version,
        "generated": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "summary": summary, "lines": summary["lines"], "overview": tables["overview"][0], "by_type": tables["by_type"],
        "figures": [{"file": k, "uri": _uri(v), "caption": FIGURE_CAPTIONS[k]} for k, v in figs.items()],
        "slash_tables": tables["slash"], "massive_tables": tables["massive"],
        "definitions": summary["definitions"], "findings": findings if findings is not None else globals()["findings"](summary),
        "isfinite": lambda x: isinstance(x, (int, float)) and math.isfinite(x), "level": V.LEVEL,
    }
    return template_env().get_template("fingerprint.html.j2").render(**ctx), figs
