"""Plain-language readings of the numbers in run summaries: the one place prose is written.

Each function takes the numbers a command wrote and returns short sentences that say what its
figures show, quoting the numbers that support the sentence (in the one number format of
:mod:`poslens.fmt`). Thresholds are stated in the sentences' wording ("purely relative" =
relativity index >= 0.98) so a reader can check them. :func:`key_findings` writes the page's
summary, one entry per paper.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from poslens.fmt import fmt

#: relativity index at or above which a map counts as a function of i - j alone
RELATIVE = 0.98
#: |locality| above which scores are said to rise (or fall) towards nearby keys
TREND = 0.3
#: slash heads are sought at offsets Δ = 1..SLASH_MAX_DELTA (as ``poslens slash``): larger offsets
#: reach the first tokens, where attention sinks put their weight (SlashScore(S − 1) = A[S − 1, 0])
SLASH_MAX_DELTA = 16
#: norm score at or above which norms shrink with position; at or below 1 − this, they grow
NORM_SHRINK = 0.7


def num(v: Any) -> float | None:
    """``v`` as a finite float, else None."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def f2(v: Any) -> str:
    """A number in the one format (:func:`poslens.fmt.fmt`); kept under its old name."""
    return fmt(num(v))


def layer_aps(l: dict) -> tuple[float | None, float | None]:
    """``(APS, std)`` of one scan layer: the per-sequence APS (arXiv 2501.00073's, mean ± std over
    sequences) where the summary has it, else ``(mean-map APS, None)``."""
    if num(l.get("aps_mean")) is not None:
        return num(l.get("aps_mean")), num(l.get("aps_std"))
    return num(l.get("mean_map_aps", l.get("aps"))), None


def layer_slash_head(l: dict, max_delta: int = SLASH_MAX_DELTA) -> dict | None:
    """The layer's strongest head at offsets 1..max_delta among its listed top heads, or None."""
    heads = [t for t in l.get("top_slash_heads") or [] if isinstance(t, dict) and num(t.get("score")) is not None
             and isinstance(t.get("offset"), int) and 1 <= t["offset"] <= max_delta]
    return max(heads, key=lambda t: num(t["score"])) if heads else None


def _layers_phrase(ids: list) -> str:
    if len(ids) > 3 and all(isinstance(i, int) for i in ids) and list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return f"layers {ids[0]} … {ids[-1]}"
    if len(ids) > 6:
        return f"{len(ids)} layers ({', '.join(str(i) for i in ids[:3])}, …, {ids[-1]})"
    ids = [str(i) for i in ids]
    if len(ids) == 1:
        return f"layer {ids[0]}"
    if len(ids) == 2:
        return f"layers {ids[0]} and {ids[1]}"
    return f"layers {', '.join(ids[:-1])} and {ids[-1]}"


def _series(vals: Iterable) -> str:
    return " → ".join(f2(v) for v in vals)


def _series_short(vals: Iterable, max_items: int = 6) -> str:
    """A per-layer series; long ones (30 layers) as first → … → last with the range."""
    vals = [num(v) for v in vals]
    if len(vals) <= max_items:
        return _series(vals)
    fin = [v for v in vals if v is not None]
    rng = f" (range {fmt(min(fin))} … {fmt(max(fin))})" if fin else ""
    return f"{f2(vals[0])} → {f2(vals[1])} → … → {f2(vals[-1])}{rng}"


def kim_readings(layers: list[dict], *, noise: str = "") -> list[str]:
    """Sentences on per-layer relativity index and locality (arXiv 2509.21042).

    ``layers``: dicts with ``layer``, ``relativity_index`` (None = flat), ``locality``, and
    optionally ``max_stderr`` / ``theory_max_abs_diff`` (simulator runs). ``noise`` names what
    "flat" is judged against ("Monte Carlo noise").
    """
    out: list[str] = []
    layers = [l for l in layers if isinstance(l, dict)]
    if not layers:
        return out
    flat = [l for l in layers if num(l.get("relativity_index")) is None]
    live = [l for l in layers if num(l.get("relativity_index")) is not None]
    if flat:
        within = f" within {noise}" if noise else ""
        verb = "is" if len(flat) == 1 else "are"
        out.append(f"{_layers_phrase([l.get('layer') for l in flat]).capitalize()} {verb} flat{within}: "
                   "there the attention scores carry no information about position.")
    if not live:
        return out
    ri = [num(l.get("relativity_index")) for l in live]
    loc = [num(l.get("locality")) for l in live]
    where = (f"from layer {live[0].get('layer')} on" if flat and len(live) > 1
             else f"in {_layers_phrase([l.get('layer') for l in live])}")
    claim = " the scores depend on position:" if noise else ""
    sink = any(num(l.get("relativity_index_with_sink")) is not None for l in live)
    what = "relativity index (key 0 excluded)" if sink else "relativity index"
    out.append(f"{where[0].upper()}{where[1:]}{claim} {what} {_series_short(ri)} "
               f"(1 = a function of the distance i − j alone) and locality {_series_short(loc)} "
               "(+1 = every query's scores rise as the key gets closer).")
    if not noise:
        out.append("These maps carry no standard errors: with few sequences, small values may be sampling noise.")
    locs = [v for v in loc if v is not None]
    if locs and min(locs) > TREND:
        out.append("Every such layer favours nearby keys: scores rise as the key approaches the query.")
    elif locs and max(locs) < -TREND:
        out.append("Scores fall as the key approaches the query: distant keys are favoured.")
    elif locs:
        strong = [l.get("layer") for l, v in zip(live, loc) if v is not None and abs(v) > TREND]
        if strong:
            out.append(f"The preference for nearby or distant keys is clear only in {_layers_phrase(strong)}.")
        else:
            out.append(f"No layer shows a clear trend with distance (|locality| ≤ {TREND}).")
    if ri and ri[0] >= RELATIVE and len(ri) > 1 and min(ri[1:]) < RELATIVE - 0.03:
        k = min(range(1, len(ri)), key=lambda i: ri[i])
        out.append(f"Layer {live[0].get('layer')} is purely relative (relativity {f2(ri[0])}); later layers drop "
                   f"to {f2(ri[k])} (layer {live[k].get('layer')}): position matters beyond the distance i − j, "
                   "a non-relative pattern that the diagonal-normalised figure makes visible.")
    elif min(ri) >= RELATIVE:
        out.append(f"All of them are purely relative (relativity ≥ {RELATIVE}): each diagonal is constant and the "
                   "diagonal-normalised maps are flat.")
    elif min(ri) < 0.9:
        out.append(f"Up to {f2(1 - min(ri))} of the variation is not explained by the distance alone: the maps also "
                   "depend on absolute position (diagonal-normalised figure: what remains after removing each "
                   "diagonal's mean).")
    trend = [num(l.get("diagonal_trend")) for l in live]
    if any(t is not None for t in trend):
        fin = [t for t in trend if t is not None]
        sign = ("rises to the right on every diagonal (left columns lower)" if min(fin) > 0 else
                "falls to the right on every diagonal (left columns higher)" if max(fin) < 0 else
                "changes sign between layers")
        out.append(f"Signed trend along the diagonals (+1 = the entry further right on each diagonal is higher): "
                   f"{_series_short(trend)}; the score {sign}.")
    sinkw = [num(l.get("sink_weight")) for l in live if num(l.get("sink_weight")) is not None]
    if sinkw:
        out.append(f"Attention weight on key 0 (the sink), per layer: {_series_short(sinkw)}; the relativity index "
                   "leaves that column out.")
    diffs = [num(l.get("theory_max_abs_diff")) for l in layers if num(l.get("theory_max_abs_diff")) is not None]
    ses = [num(l.get("max_stderr")) for l in layers if num(l.get("max_stderr")) is not None]
    if diffs:
        se = f" (largest standard error {fmt(max(ses))})" if ses else ""
        out.append(f"The exact closed form agrees with the simulation to within {fmt(max(diffs))} in every layer{se}; "
                   "the remaining gap shrinks as the dimension grows.")
    return out


def uniform_slash(n: int, d: int) -> float:
    """SlashScore(d) of uniform causal attention over ``n`` tokens: mean over i > d of 1/i."""
    if n <= d:
        return float("nan")
    return sum(1.0 / i for i in range(d + 1, n + 1)) / (n - d)


def slash_top(summary: dict, max_delta: int = SLASH_MAX_DELTA) -> dict | None:
    """A scan's strongest slash head at offsets 1..max_delta: from the summary's Δ-limited list
    (``slash_heads``) where present, else from its listed top heads, filtered."""
    for key in ("slash_heads", "slash_top_heads_offset_ge1", "slash_top_heads"):
        heads = [t for t in summary.get(key) or [] if isinstance(t, dict) and num(t.get("score")) is not None
                 and isinstance(t.get("offset"), int) and 1 <= t["offset"] <= max_delta]
        if heads:
            return max(heads, key=lambda t: num(t["score"]))
    tops = [t for t in (layer_slash_head(l, max_delta) for l in summary.get("layers") or [] if isinstance(l, dict))
            if t]
    return max(tops, key=lambda t: num(t["score"])) if tops else None


def slash_readings(summary: dict) -> list[str]:
    """Sentences on a scan's slash heads and rank-one measures (arXiv 2601.08297)."""
    out: list[str] = []
    n = int(num(summary.get("seq_len")) or 0)
    t = slash_top(summary)
    if t is not None:
        base = uniform_slash(n, int(t.get("offset", 1))) if n else float("nan")
        ratio = num(t["score"]) / base if math.isfinite(base) and base > 0 else None
        cmp = (f"; uniform causal attention would put {fmt(base)} there (ratio {fmt(ratio)})" if ratio else "")
        out.append(f"Strongest slash head at offsets Δ = 1 … {SLASH_MAX_DELTA}: layer {t.get('layer')} head "
                   f"{t.get('head')} puts {fmt(num(t['score']))} of its attention on the token {t.get('offset')} "
                   f"position(s) back{cmp}.")
        if ratio is not None and ratio < 2:
            out.append("No head is clearly slash-dominant here (less than twice the uniform baseline).")
        elif ratio is not None:
            out.append(f"That head is {fmt(ratio)}× more concentrated on its sub-diagonal than uniform attention: "
                       "a slash pattern.")
    sink = num(summary.get("sink_weight"))
    if sink is not None:
        out.append(f"Attention on key 0 (the sink) averages {fmt(sink)}: offsets beyond Δ = {SLASH_MAX_DELTA} reach "
                   "that column and are not counted as slashes.")
    top1 = []
    for l in summary.get("layers") or []:
        q = [num(v) for v in (l.get("q_top1_energy") or []) if num(v) is not None]
        if q:
            top1.append((l.get("layer"), max(q)))
    if top1:
        best = max(top1, key=lambda x: x[1])
        out.append(f"Pre-RoPE queries are closest to rank one in layer {best[0]}: the top singular direction holds "
                   f"{fmt(best[1])} of the energy in its most rank-one head (1 = rank one, the first condition for "
                   "slash-dominant heads).")
    return out


def norm_phrase(v: float) -> str:
    """What a norm score says (the thresholds of ``poslens neighborhood``)."""
    if v >= NORM_SHRINK:
        return "norms shrink with position, as running means do"
    if v > 1 - NORM_SHRINK:
        return "norms do not change consistently with position"
    return "norms grow with position"


def neighborhood_readings(summary: dict) -> list[str]:
    """Sentences on a scan's adjacency probability scores (arXiv 2501.00073).

    The paper's APS is per sequence (mean ± std over sequences); a scan that only has the APS of
    the cosine map averaged over sequences says so: that number rises towards 1 for any consistent
    weak trend as sequences are added, so it has no 0.5-chance reading."""
    out: list[str] = []
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict) and layer_aps(l)[0] is not None]
    if not layers:
        return out
    per_seq = any(num(l.get("aps_mean")) is not None for l in layers)
    aps = [layer_aps(l)[0] for l in layers]
    emb = num(summary.get("embedding_aps_mean", summary.get("embedding_aps")))
    where = _layers_phrase([l.get("layer") for l in layers]) if len(layers) <= 4 else \
        f"layers {layers[0].get('layer')} … {layers[-1].get('layer')}"
    start = f"embeddings {fmt(emb)}, then " if emb is not None else ""
    if per_seq:
        out.append(f"Adjacency probability score of the hidden states per sequence (0.5 = chance, 1 = every token is "
                   f"more similar to nearer tokens): {start}{_series_short(aps)} after {where}.")
    else:
        out.append(f"Mean-map APS of the hidden states (the APS of the cosine map averaged over sequences, not the "
                   f"paper's per-sequence APS; it approaches 1 for any consistent trend as sequences are added, so "
                   f"0.5 is no chance level here): {start}{_series_short(aps)} after {where}.")
    controls = summary.get("controls") or {}
    if controls.get("bidirectional"):
        out.append("This is the bidirectional control (no causal mask): theory predicts no adjacency pattern; "
                   f"measured maximum {fmt(max(aps))}.")
    elif per_seq and emb is not None and abs(emb - 0.5) < 0.1 and aps[0] > emb + 0.1:
        out.append(f"The first attention layer already creates the adjacency pattern: APS rises from {fmt(emb)} "
                   f"(embeddings, no position) to {fmt(aps[0])}.")
    elif per_seq and max(aps) < 0.6:
        out.append("No layer shows a clear adjacency pattern (APS < 0.6 everywhere).")
    attn = [num(l.get("attn_aps_mean", l.get("attn_aps"))) for l in layers]
    attn = [a for a in attn if a is not None]
    if attn:
        out.append(f"Attention outputs alone reach APS {fmt(max(attn))}; near-uniform causal attention makes them "
                   "running means, whose cosine similarity rises towards the diagonal (theory: APS ≈ 1).")
    norms = [num(l.get("norm_score_mean", l.get("norm_score"))) for l in layers]
    norms = [v for v in norms if v is not None]
    if norms:
        med = sorted(norms)[len(norms) // 2]
        out.append(f"Norm score {_series_short(norms)} (median {fmt(med)}: {norm_phrase(med)}; ≥ {NORM_SHRINK} = "
                   f"shrink, ≤ {fmt(1 - NORM_SHRINK)} = grow).")
    return out


def model_readings(summary: dict, config: dict) -> list[str]:
    """Sentences on a trained model directory's summary."""
    out: list[str] = []
    pe = summary.get("pe")
    pe_text = {"none": "no positional encoding (NoPE)", "rope": "RoPE", "learned": "learned absolute positions"}
    what = summary.get("task") and f"the {summary['task']} task" or (summary.get("data") and f"the {summary['data']} corpus")
    if pe or what:
        out.append(f"A model with {pe_text.get(pe, pe or 'unknown positional encoding')}"
                   + (f", trained on {what}" if what else "") + ".")
    il, fl, steps = num(summary.get("initial_loss")), num(summary.get("final_loss")), summary.get("steps")
    if steps == 0:
        out.append("It is untrained (0 steps): a random-initialisation control.")
    elif il is not None and fl is not None:
        out.append(f"Training lowered the loss from {fmt(il)} to {fmt(fl)} over {fmt(steps)} steps.")
    acc, acc_long = num(summary.get("eval_accuracy")), num(summary.get("eval_accuracy_long"))
    if acc is not None:
        s = f"Exact-match accuracy {fmt(acc)} at the training lengths"
        if acc_long is not None:
            s += f", {fmt(acc_long)} at lengths beyond them"
            if acc - acc_long > 0.3:
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


def _span(vals: list) -> str:
    fin = [v for v in (num(x) for x in vals) if v is not None]
    if not fin:
        return "–"
    return fmt(fin[0]) if len(fin) == 1 else f"{fmt(min(fin))} … {fmt(max(fin))}"


def _kim_finding(name: str, command: str, summary: dict) -> str | None:
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict) and "relativity_index" in l]
    if not layers:
        return None
    live = [l for l in layers if num(l.get("relativity_index")) is not None]
    flat = len(layers) - len(live)
    if not live:
        return f"{name}: every one of {len(layers)} layers is flat (no positional information in the scores)."
    lo = min(live, key=lambda l: num(l["relativity_index"]))
    sink = " (key 0 excluded)" if any("relativity_index_with_sink" in l for l in live) else ""
    text = (f"{name}: relativity index{sink} {_span([l['relativity_index'] for l in live])} over {len(live)} layer(s), "
            f"lowest in layer {lo.get('layer')}; locality {_span([l.get('locality') for l in live])}")
    if flat:
        text += f"; {flat} flat layer(s)"
    trend = [num(l.get("diagonal_trend")) for l in live if num(l.get("diagonal_trend")) is not None]
    if trend:
        text += f"; diagonal trend {_span(trend)}"
    return text + "."


def _slash_finding(name: str, command: str, summary: dict) -> str | None:
    if command != "scan":
        return None
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
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict)]
    if command == "scan":
        vals = [layer_aps(l) for l in layers]
        aps = [a for a, _ in vals if a is not None]
        if not aps:
            return None
        if any(num(l.get("aps_mean")) is not None for l in layers):
            return f"{name}: APS per sequence {_span(aps)} over {len(aps)} layers (0.5 = chance)."
        return (f"{name}: mean-map APS {_span(aps)} over {len(aps)} layers (APS of the sequence-averaged cosine map; "
                "not the paper's per-sequence APS, no chance level).")
    aps = [l.get("aps_mean") for l in layers if num(l.get("aps_mean")) is not None]
    if aps:
        return f"{name}: APS per sequence {_span(aps)} over {len(aps)} entries (0.5 = chance)."
    return None


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
            if text is None and command not in ("scan", "simulate"):
                first = next((r for r in summary.get("readings") or [] if isinstance(r, str)), None)
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
