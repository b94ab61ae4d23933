"""The page's key findings (one entry per paper), a model directory's readings, and one run's readings
for one paper whatever command wrote it."""

from __future__ import annotations

import math
from typing import Iterable

from poslens.conventions import SLASH_MAX_DELTA
from poslens.fmt import fmt
from poslens.metrics.judge.papers import judge_model, kim_finding
from poslens.metrics.verdicts import uniform_slash
from poslens.reporting.readings.commands import command_readings
from poslens.reporting.readings.notes import noise_note
from poslens.reporting.readings.common import (_count_phrase, _span, _decoder_layers, _pct_span, few_phrase, layer_aps,
                                               noise_phrase)
from poslens.metrics.judge.papers import num
from poslens.reporting.readings.kim import kim_readings
from poslens.reporting.readings.neighborhood import neighborhood_readings
from poslens.reporting.readings.slash import slash_readings, slash_top


def model_readings(summary: dict, config: dict) -> list[str]:
    """Sentences on a trained model directory's summary (:func:`poslens.metrics.judge.papers.judge_model`)."""
    out: list[str] = []
    pe = summary.get("pe")
    pe_text = {"none": "no positional encoding (NoPE)", "rope": "RoPE", "learned": "learned absolute positions"}
    what = summary.get("task") and f"the {summary['task']} task" or (summary.get("data") and f"the {summary['data']} corpus")
    if pe or what:
        out.append(f"A model with {pe_text.get(pe, pe or 'unknown positional encoding')}"
                   + (f", trained on {what}" if what else "") + ".")
    j = judge_model(summary)
    if j["trained"] == "untrained":
        out.append("It is untrained (0 steps): a random-initialisation control.")
    elif j["trained"] == "trained":
        out.append(f"Training lowered the loss from {fmt(j['initial_loss'])} to {fmt(j['final_loss'])} over "
                   f"{fmt(j['steps'])} steps.")
    if j["accuracy"] is not None:
        s = f"Exact-match accuracy {fmt(j['accuracy'])} at the training lengths"
        if j["long"] is not None:
            s += f", {fmt(j['long'])} at lengths beyond them"
            if j["generalises"] is False:
                s += " (it does not generalise to longer inputs)"
        out.append(s + ".")
    return out


def comparison_readings(label: str, per_run: dict[str, list[float | None]]) -> str | None:
    """One sentence comparing a metric's mean over layers between runs."""
    parts = []
    for name, vals in per_run.items():
        v = [x for x in vals if num(x) is not None]
        parts.append(f"{name} {fmt(sum(v) / len(v))}" if v else f"{name} flat")
    return f"Mean {label} over layers: " + "; ".join(parts) + "." if parts else None


# --------------------------------------------------------------------------------------------
# key findings: the page's summary, one entry per paper
# --------------------------------------------------------------------------------------------
PAPER_KEYS = ("kim", "slash", "neighborhood")




def _kim_finding(name: str, command: str, summary: dict) -> str | None:
    """A run's relativity index, locality and trend (:func:`poslens.metrics.judge.papers.kim_finding`), led by
    the noise-corrected (grid) index and its test where a scan has one; a scan's full-map index,
    noise-corrected where its grid is the whole map and otherwise quoted with its noise floor beside it;
    the layers whose tests are significant, each at p < 0.01 and after a Benjamini–Hochberg false discovery
    rate over the layers; and a warning where too few sequence groups were scanned to call anything."""
    j = kim_finding(summary.get("layers"))
    if j is None:
        return None
    if j["missing"] and not j["live"]:
        return f"{name}: no relativity index ({noise_note(j['reason'])})."
    if not j["live"]:
        return f"{name}: every one of {j['count']} layers is flat (no positional information in the scores)."
    sink = " (key 0 excluded)" if j["sink"] else ""
    ri = _span(j["relativity"])
    test = _count_phrase(j["nonrelative"], "not purely relative")
    test = f", {test}" if test else ""
    lowest, live = j["lowest"], j["live"]
    if j["lead"] == "grid":
        text = (f"{name}: noise-corrected relativity index{sink} {_span(j['grid'])} on a {j['positions']}-position "
                f"grid over {j['grid_layers']} layer(s){test}; full-map index {ri} (not noise-corrected), "
                f"lowest in layer {lowest}")
    elif j["lead"] == "corrected":
        text = (f"{name}: noise-corrected relativity index{sink} {ri} over {live} layer(s) (full map){test}, "
                f"lowest in layer {lowest}")
    elif j["lead"] == "shares":
        text = (f"{name}: relativity index{sink} {ri} over {live} layer(s) (full map, not noise-corrected: "
                f"sampling noise alone gives {_pct_span(j['shares'])} % of the within-diagonal variation){test}, "
                f"lowest in layer {lowest}")
    else:
        text = f"{name}: relativity index{sink} {ri} over {live} layer(s){test}, lowest in layer {lowest}"
    text += f"; locality {_span(j['locality'])}"
    if j["flat"]:
        text += f"; {j['flat']} flat layer(s)"
    if j["trend"]:
        tcount = _count_phrase(j["trend_counts"], "significant")
        text += f"; diagonal trend {_span(j['trend'])}" + (f" ({tcount})" if tcount else "")
    few = few_phrase(j["groups"])
    return text + (f"; {few}." if few else ".")


def _slash_finding(name: str, command: str, summary: dict) -> str | None:
    t = slash_top(summary)
    n = int(num(summary.get("seq_len")) or 0)
    q = [max(v for v in (num(x) for x in l.get("q_top1_energy") or []) if v is not None)
         for l in summary.get("layers") or [] if isinstance(l, dict)
         and any(num(x) is not None for x in l.get("q_top1_energy") or [])]
    parts = []
    if t is not None:
        base = uniform_slash(n, int(t["offset"])) if n else float("nan")
        ratio = f", {fmt(num(t['score']) / base)}× uniform" if math.isfinite(base) and base > 0 else ""
        parts.append(f"strongest slash head at Δ ≤ {SLASH_MAX_DELTA}: layer {t.get('layer')} head {t.get('head')}, "
                     f"Δ = {t.get('offset')}, SlashScore {fmt(num(t['score']))}{ratio}")
    if q:
        parts.append(f"pre-RoPE query top-1 energy (most rank-one head per layer) {_span(q)}")
    return f"{name}: " + "; ".join(parts) + "." if parts else None


def _neighborhood_finding(name: str, command: str, summary: dict) -> str | None:
    _, dec = _decoder_layers(summary.get("layers"))
    aps = [a for a, _ in (layer_aps(l) for l in dec) if a is not None]
    if not aps:
        return None
    of = "head outputs" if command == "neighborhood" else "residual stream"  # what each command measures
    if any(num(l.get("aps_mean")) is not None for l in dec):
        return f"{name}: APS of the {of} per sequence {_span(aps)} over {len(aps)} decoder layers (0.5 = chance)."
    return (f"{name}: mean-map APS of the {of} {_span(aps)} over {len(aps)} decoder layers (APS of the sequence-averaged cosine "
            "map; not the paper's per-sequence APS, no chance level).")


def key_findings(runs: Iterable[tuple[str, str, list[str], dict]], max_per_paper: int = 4) -> dict[str, list[str]]:
    """Paper key -> short numbers-backed sentences, from ``(name, command, papers, summary)`` of each run.

    One sentence per run and paper (at most ``max_per_paper``; the rest counted); analysis runs
    without per-layer numbers contribute their first reading."""
    out: dict[str, list[str]] = {k: [] for k in PAPER_KEYS}
    extra: dict[str, int] = {k: 0 for k in PAPER_KEYS}
    makers = {"kim": _kim_finding, "slash": _slash_finding, "neighborhood": _neighborhood_finding}
    for name, command, papers, summary in runs:
        for paper in papers:
            if paper not in makers:
                continue
            text = makers[paper](name, command, summary)
            if text is None:  # no numbers this paper's finding is written from: the run's first reading
                held = summary.get("readings") or command_readings(command, summary) or []
                first = next((r for r in held if isinstance(r, str)), None)
                text = f"{name}: {first}" if first else None
            if text is None:
                continue
            if len(out[paper]) < max_per_paper:
                out[paper].append(text)
            else:
                extra[paper] += 1
    for k, n in extra.items():
        if n:
            out[k].append(f"… and {n} more run(s) below.")
    return {k: v for k, v in out.items() if v}


def run_readings(command: str, papers: list[str], summary: dict, paper: str) -> list[str]:
    """The readings of one run for one paper: the sentences the run wrote (a one-paper run), else
    its command's builder (:data:`COMMAND_READINGS`), else the paper's builder on its per-layer
    numbers. Every run is read the same way, whichever command wrote it."""
    own = [str(r) for r in summary.get("readings") or [] if isinstance(r, (str, int, float))]
    if own and len(papers) <= 1:
        return own
    made = command_readings(command, summary)
    if made:
        return made
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict)]
    if paper == "kim":
        return kim_readings(layers, noise=noise_phrase(layers)) if any("relativity_index" in l for l in layers) \
            else own
    if paper == "slash":
        return slash_readings(summary) or own
    if paper == "neighborhood":
        return neighborhood_readings(summary) or own
    return own
