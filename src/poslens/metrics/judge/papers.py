"""The papers' readings judged on any run's per-layer numbers: numbers in, a dict of numbers and short
codes out. This module is the one home of these judges: the causal-mask/RoPE measures (arXiv 2509.21042,
:func:`judge_kim`), slash heads (arXiv 2601.08297, :func:`judge_slash`), the similarity of nearby
embeddings (arXiv 2501.00073, :func:`judge_neighborhood`) and a trained model directory
(:func:`judge_model`), with the noise floor they share (:func:`p_counts`, :func:`smallest_p`,
:func:`too_few_groups`, :func:`noise_shares`, :func:`noise_source`).

``poslens.reporting.readings`` turns these dicts into sentences and decides nothing itself; tests of
a decision assert the codes here. Thresholds come from :mod:`poslens.conventions`.
"""

from __future__ import annotations

import math
from typing import Any

from poslens.conventions import FEW_GROUPS_MARGIN, NOISE_P, NORM_SHRINK, RELATIVE, TREND
from poslens.metrics.verdicts import bh_significant, uniform_slash

#: a layer's relativity index this far under RELATIVE after a purely relative first layer is a drop
RELATIVE_DROP = 0.03
#: the lowest relativity index under which the share it leaves unexplained is quoted
PARTIAL_RELATIVE = 0.9
#: SlashScore over uniform causal attention at or above which a head is a slash pattern
SLASH_RATIO = 2.0
#: how far from 0.5 the embeddings' APS may lie (and how far above it the first layer must rise) for the
#: first attention layer to be said to create the adjacency pattern
FIRST_LAYER_RISE = 0.1
#: the largest APS under which no layer shows a clear adjacency pattern
CLEAR_APS = 0.6
#: the drop in exact-match accuracy beyond the training lengths above which a model does not generalise
GENERALISE_DROP = 0.3


def num(v: Any) -> float | None:
    """``v`` as a finite float, else None: a number read from a summary."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _ids(layers: list[dict]) -> list:
    return [l.get("layer") for l in layers]


# --------------------------------------------------------------------------------------------
# the noise floor every paper's reading is judged against
# --------------------------------------------------------------------------------------------
def p_counts(layers: list[dict], key: str) -> dict | None:
    """``{"significant", "tested", "fdr"}`` of the layers' p-values ``key``: how many lie below NOISE_P,
    how many layers have one, and how many stay significant when the false discovery rate over all of
    them is held at NOISE_P (Benjamini–Hochberg); None where no layer has one. Each layer is its own
    test on the same sequences: counting layers at p < NOISE_P each expects NOISE_P × the number of
    layers false calls."""
    ps = [num(l.get(key)) for l in layers if num(l.get(key)) is not None]
    if not ps:
        return None
    return {"significant": sum(p < NOISE_P for p in ps), "tested": len(ps), "fdr": sum(bh_significant(ps, NOISE_P))}


def smallest_p(layers: list[dict]) -> tuple[int, float | None]:
    """``(G, 2 / 2^G)``: the layers' largest number of noise groups and the smallest p-value a sign-flip
    test over that many groups can give (every flip pattern and its mirror image tie); ``(G, None)``
    with fewer than two groups."""
    groups = [int(num(l.get("noise_groups"))) for l in layers if num(l.get("noise_groups")) is not None]
    g = max(groups, default=0)
    return g, (2.0 / 2**g if g >= 2 else None)


def too_few_groups(layers: list[dict]) -> dict:
    """``{"groups", "p_min", "few"}``: whether the layers' sign-flip tests had too few sequence groups to
    call a trend or a departure from relativity. With ``G`` groups the smallest p-value the test can give
    is 2 / 2^G, which must lie well under NOISE_P (by FEW_GROUPS_MARGIN); ``few`` is ``"not_below"``
    (the smallest p is not below NOISE_P), ``"barely_below"`` (below, not by the margin) or None (enough
    groups, or fewer than two)."""
    g, p_min = smallest_p(layers)
    few = None
    if p_min is not None and p_min * FEW_GROUPS_MARGIN > NOISE_P:
        few = "not_below" if p_min >= NOISE_P else "barely_below"
    return {"groups": g, "p_min": p_min, "few": few}


def noise_shares(layers: list[dict]) -> list[float]:
    """Per scan layer whose full-map index is computed without the noise groups (one with
    ``noise_positions`` but neither a grid index nor ``relativity_index_noise_corrected``): the share of the
    observed within-diagonal mean square that sampling noise alone gives, ``(within_diag_rms_noise /
    within_diag_rms)^2`` capped at 1 (the noise estimate can exceed what is observed)."""
    out = []
    for l in layers:
        rms, noise = num(l.get("within_diag_rms")), num(l.get("within_diag_rms_noise"))
        if ("noise_positions" in l and num(l.get("grid_relativity_index")) is None
                and not l.get("relativity_index_noise_corrected") and rms and noise is not None):
            out.append(min((noise / rms) ** 2, 1.0))
    return out


def noise_source(layers: list[dict]) -> dict:
    """What "flat" is judged against in these layers: ``source`` ``"monte_carlo"`` (a simulation's
    standard errors), ``"sampling"`` (sample groups only) or None; ``groups`` (the largest number of
    independent groups, None under two) and ``grid`` (the largest noise grid, where a layer has grid
    statistics; else None)."""
    layers = [l for l in layers if isinstance(l, dict)]
    groups = [int(num(l.get("noise_groups"))) for l in layers if num(l.get("noise_groups")) is not None]
    mc = any(num(l.get("max_stderr")) is not None for l in layers)
    pos = [int(num(l.get("noise_positions"))) for l in layers if num(l.get("noise_positions")) is not None]
    grid = max(pos) if pos and any(str(k).startswith("grid_") for l in layers for k in l) else None
    g = max(groups) if groups and max(groups) >= 2 else None
    return {"source": "monte_carlo" if mc else ("sampling" if g else None), "groups": g, "grid": grid}


# --------------------------------------------------------------------------------------------
# the causal mask and RoPE (arXiv 2509.21042)
# --------------------------------------------------------------------------------------------
def _kim_locality(live: list[dict]) -> dict:
    """``code``: ``"near"`` (every layer's |locality| > TREND, rising towards the query), ``"far"``
    (every one falling), ``"some"`` (only the ``strong`` layers beyond TREND), ``"none"`` (no layer
    beyond TREND), None (no locality); ``layers``: every layer read."""
    loc = [num(l.get("locality")) for l in live]
    locs = [v for v in loc if v is not None]
    strong = [l.get("layer") for l, v in zip(live, loc) if v is not None and abs(v) > TREND]
    if not locs:
        code = None
    elif min(locs) > TREND:
        code = "near"
    elif max(locs) < -TREND:
        code = "far"
    else:
        code = "some" if strong else "none"
    return {"code": code, "strong": strong, "layers": _ids(live), "threshold": TREND}


def _kim_relativity(live: list[dict]) -> dict:
    """Read from the noise-corrected grid index where every layer has one (``index`` ``"grid"``, else
    ``"full"``). ``code``: ``"noise"`` (p-values of "purely relative" exist, none significant, and some
    index is under RELATIVE), ``"drop"`` (the first layer purely relative, a later one more than
    RELATIVE_DROP under RELATIVE), ``"relative"`` (every layer ≥ RELATIVE), ``"partial"`` (the lowest under
    PARTIAL_RELATIVE: ``unexplained`` = 1 − lowest), None (none of these)."""
    grid = all(num(l.get("grid_relativity_index")) is not None for l in live)
    ri = [num(l.get("grid_relativity_index" if grid else "relativity_index")) for l in live]
    counts = p_counts(live, "nonrelative_p")
    sig, tested = (counts["significant"], counts["tested"]) if counts else (0, 0)
    low = min(ri)
    out = {"index": "grid" if grid else "full",
           "corrected": bool(grid or all(l.get("relativity_index_noise_corrected") for l in live)),
           "values": ri, "low": low, "low_layer": live[ri.index(low)].get("layer"), "tested": tested,
           "significant": sig, "threshold": RELATIVE}
    if tested and not sig and low < RELATIVE:
        return {**out, "code": "noise"}
    if ri[0] >= RELATIVE and len(ri) > 1 and min(ri[1:]) < RELATIVE - RELATIVE_DROP:
        k = min(range(1, len(ri)), key=lambda i: ri[i])
        return {**out, "code": "drop", "first": ri[0], "first_layer": live[0].get("layer"), "drop": ri[k],
                "drop_layer": live[k].get("layer")}
    if low >= RELATIVE:
        return {**out, "code": "relative"}
    if low < PARTIAL_RELATIVE:
        return {**out, "code": "partial", "unexplained": 1 - low}
    return {**out, "code": None}


def _kim_trend(live: list[dict]) -> dict | None:
    """The signed trend along the diagonals, its sign read only where it is beyond noise (layers with
    ``trend_p`` below NOISE_P, where any has one). ``code``: ``"none"`` (no significant trend),
    ``"rises"``, ``"falls"``, ``"mixed"`` (changes sign); ``subset``: the sign is that of the
    ``significant`` layers only. None where no layer has a trend."""
    trend = [num(l.get("diagonal_trend")) for l in live]
    if all(t is None for t in trend):
        return None
    fin = [t for t in trend if t is not None]
    tested = [(l, num(l.get("diagonal_trend"))) for l in live if num(l.get("trend_p")) is not None
              and num(l.get("diagonal_trend")) is not None]
    subset = False
    if tested:
        fin = [t for l, t in tested if num(l["trend_p"]) < NOISE_P]
        subset = len(fin) < len(tested)
    code = ("none" if not fin else "rises" if min(fin) > 0 else "falls" if max(fin) < 0 else "mixed")
    return {"code": code, "values": trend, "significant": len(fin), "subset": subset}


def _kim_noise(live: list[dict]) -> dict:
    """The noise floor of a scan's numbers: the grid statistics the p-values belong to (``grid``: its
    positions, trend and noise-corrected index per layer, the trend's ``p_counts``), the shares of the
    full map's within-diagonal variation that sampling noise alone gives, and :func:`too_few_groups`."""
    grid = [l for l in live if num(l.get("grid_diagonal_trend")) is not None]
    g = None
    if grid:
        g = {"positions": max(int(num(l.get("noise_positions")) or 0) for l in grid),
             "trend": [num(l.get("grid_diagonal_trend")) for l in grid],
             "relativity": [num(l.get("grid_relativity_index")) for l in grid], "counts": p_counts(grid, "trend_p")}
    return {"grid": g, "shares": noise_shares(live), "groups": too_few_groups(live)}


def judge_kim(layers: list[dict]) -> dict:
    """Kim et al.'s readings on per-layer numbers (``layer``, ``relativity_index`` (None = flat),
    ``locality``, optionally a simulation's ``max_stderr`` / ``theory_max_abs_diff`` and a scan's noise
    floor: ``nonrelative_p``, ``trend_p``, ``noise_groups``, ``noise_positions``, ``within_diag_rms_noise``,
    ``grid_*``).

    ``missing``: layers without a noise floor (no verdict, flat or not) and the ``reason``; the rest are
    judged: ``count``, ``flat`` and ``live`` (layer ids); where some are live, ``series`` (relativity index
    and locality per live layer; ``tail``: every flat layer before every live one; ``testable``: the
    sign-flip test can reach NOISE_P, so flatness could have been found; ``sink``: key 0 excluded;
    ``corrected``), ``locality``, ``relativity``, ``trend``, ``noise`` and ``extras`` (sink weights, the
    largest gap to the closed form and standard error)."""
    layers = [l for l in layers if isinstance(l, dict)]
    missing = [l for l in layers if isinstance(l.get("missing"), dict) and "relativity_index" in l["missing"]]
    rest = [l for l in layers if l not in missing]
    flat = [l for l in rest if num(l.get("relativity_index")) is None]
    live = [l for l in rest if num(l.get("relativity_index")) is not None]
    out: dict = {"missing": _ids(missing), "reason": missing[0]["missing"]["relativity_index"] if missing else None,
                 "count": len(rest), "flat": _ids(flat), "live": _ids(live)}
    if not live:
        return out
    first_live = rest.index(live[0])
    p_min = smallest_p(live)[1]
    out["series"] = {
        "relativity": [num(l.get("relativity_index")) for l in live], "locality": [num(l.get("locality")) for l in live],
        "tail": bool(flat and len(live) > 1 and all(num(l.get("relativity_index")) is not None
                                                    for l in rest[first_live:])),
        "testable": p_min is None or p_min < NOISE_P,
        "sink": any(num(l.get("relativity_index_with_sink")) is not None for l in live),
        "corrected": all(l.get("relativity_index_noise_corrected") for l in live)}
    out["locality"] = _kim_locality(live)
    out["relativity"] = _kim_relativity(live)
    out["trend"] = _kim_trend(live)
    out["noise"] = _kim_noise(live)
    diffs = [num(l.get("theory_max_abs_diff")) for l in rest if num(l.get("theory_max_abs_diff")) is not None]
    ses = [num(l.get("max_stderr")) for l in rest if num(l.get("max_stderr")) is not None]
    out["extras"] = {"sink_weight": [num(l.get("sink_weight")) for l in live if num(l.get("sink_weight")) is not None],
                     "theory_diff": max(diffs) if diffs else None, "stderr": max(ses) if ses else None}
    return out


def kim_finding(layers: list[dict]) -> dict | None:
    """The numbers of a run's key finding for Kim et al.: of the layers with a ``relativity_index``,
    ``lead`` ``"grid"`` (some layer has a noise-corrected grid index: its ``grid`` values, ``positions``
    and layer count), ``"corrected"`` (every full-map index noise-corrected), ``"shares"`` (a scan's
    full-map index quoted with the share of noise in it) or ``"plain"``; the full-map index, locality
    and trend of the live layers, the ``lowest`` layer, the p-value counts of "purely relative" and of
    the trend, and :func:`too_few_groups`. None where no layer has a relativity index."""
    layers = [l for l in layers or [] if isinstance(l, dict) and "relativity_index" in l]
    if not layers:
        return None
    j = judge_kim(layers)
    live = [l for l in layers if num(l.get("relativity_index")) is not None]
    out = {"missing": j["missing"], "reason": j["reason"], "count": len(layers), "live": len(live),
           "flat": len(layers) - len(live) - len(j["missing"])}
    if not live:
        return out
    grid = [l for l in live if num(l.get("grid_relativity_index")) is not None]
    shares = noise_shares(live)
    lead = ("grid" if grid else "corrected" if all(l.get("relativity_index_noise_corrected") for l in live)
            else "shares" if shares else "plain")
    return {**out, "lead": lead, "sink": any("relativity_index_with_sink" in l for l in live),
            "relativity": [l["relativity_index"] for l in live],
            "lowest": min(live, key=lambda l: num(l["relativity_index"])).get("layer"),
            "grid": [l["grid_relativity_index"] for l in grid], "grid_layers": len(grid),
            "positions": max(int(num(l.get("noise_positions")) or 0) for l in grid) if grid else None,
            "shares": shares, "nonrelative": p_counts(live, "nonrelative_p"),
            "locality": [l.get("locality") for l in live],
            "trend": [num(l.get("diagonal_trend")) for l in live if num(l.get("diagonal_trend")) is not None],
            "trend_counts": p_counts(live, "trend_p"), "groups": too_few_groups(live)}


# --------------------------------------------------------------------------------------------
# slash-dominant heads (arXiv 2601.08297)
# --------------------------------------------------------------------------------------------
def judge_slash(summary: dict, top: dict | None) -> dict:
    """A scan's slash readings, given its strongest slash head ``top`` (``layer``, ``head``, ``offset``,
    ``score``; None where it has none): ``head`` (that head with its ``score``, the ``uniform`` SlashScore
    of uniform causal attention at its offset over ``seq_len`` tokens and their ``ratio``, None without a
    sequence length), ``code`` ``"slash"`` (ratio ≥ SLASH_RATIO), ``"weak"`` (under it) or None (no ratio);
    ``sink`` (the summary's mean weight on key 0) and ``rank_one`` (the layer whose most rank-one head has
    the largest pre-RoPE query top-1 energy, and that energy)."""
    out: dict = {"head": None, "code": None, "sink": num(summary.get("sink_weight")), "rank_one": None}
    n = int(num(summary.get("seq_len")) or 0)
    if top is not None:
        base = uniform_slash(n, int(top.get("offset", 1))) if n else float("nan")
        ratio = num(top["score"]) / base if math.isfinite(base) and base > 0 else None
        out["head"] = {"layer": top.get("layer"), "head": top.get("head"), "offset": top.get("offset"),
                       "score": num(top["score"]), "uniform": base, "ratio": ratio}
        if ratio is not None:
            out["code"] = "weak" if ratio < SLASH_RATIO else "slash"
    top1 = []
    layers = summary.get("layers")
    for l in layers if isinstance(layers, list) else []:
        if not isinstance(l, dict) or not isinstance(l.get("q_top1_energy"), list):
            continue  # an entry of the wrong shape is skipped, like every odd entry
        q = [num(v) for v in l["q_top1_energy"] if num(v) is not None]
        if q:
            top1.append((l.get("layer"), max(q)))
    if top1:
        best = max(top1, key=lambda x: x[1])
        out["rank_one"] = {"layer": best[0], "energy": best[1]}
    return out


# --------------------------------------------------------------------------------------------
# similarity of nearby embeddings (arXiv 2501.00073)
# --------------------------------------------------------------------------------------------
def norm_trend(v: float) -> str:
    """``"shrink"`` (norm score ≥ NORM_SHRINK: norms shrink with position), ``"grow"`` (≤ 1 − NORM_SHRINK)
    or ``"steady"`` (no consistent change)."""
    if v >= NORM_SHRINK:
        return "shrink"
    if v > 1 - NORM_SHRINK:
        return "steady"
    return "grow"


def judge_neighborhood(summary: dict, layers: list[dict], aps: list[float]) -> dict:
    """A scan's neighbourhood readings on its ``layers`` with an APS and their ``aps`` (the per-sequence
    APS where the summary has it: ``per_seq``; else the mean-map APS, which has no chance level).
    ``control``: ``"bidirectional"`` (the no-mask control), ``"first"`` (the embeddings near chance and the
    first layer more than FIRST_LAYER_RISE above them: the first attention layer creates the pattern),
    ``"unclear"`` (every per-sequence APS under CLEAR_APS) or None; ``attn`` (the largest APS of the
    attention outputs alone), ``norms`` with their ``median`` and its :func:`norm_trend`."""
    per_seq = any(num(l.get("aps_mean")) is not None for l in layers)
    emb = num(summary.get("embedding_aps_mean", summary.get("embedding_aps")))
    controls = summary.get("controls") or {}
    if controls.get("bidirectional"):
        control = "bidirectional"
    elif per_seq and emb is not None and abs(emb - 0.5) < FIRST_LAYER_RISE and aps[0] > emb + FIRST_LAYER_RISE:
        control = "first"
    elif per_seq and max(aps) < CLEAR_APS:
        control = "unclear"
    else:
        control = None
    attn = [num(l.get("attn_aps_mean", l.get("attn_aps"))) for l in layers]
    attn = [a for a in attn if a is not None]
    norms = [num(l.get("norm_score_mean", l.get("norm_score"))) for l in layers]
    norms = [v for v in norms if v is not None]
    med = sorted(norms)[len(norms) // 2] if norms else None
    return {"per_seq": per_seq, "layers": _ids(layers), "aps": aps, "max": max(aps), "embeddings": emb,
            "control": control, "attn": max(attn) if attn else None, "norms": norms, "median": med,
            "norm": norm_trend(med) if med is not None else None, "shrink": NORM_SHRINK}


# --------------------------------------------------------------------------------------------
# a trained model directory
# --------------------------------------------------------------------------------------------
def judge_model(summary: dict) -> dict:
    """A trained model's summary: ``trained`` ``"untrained"`` (0 steps), ``"trained"`` (both losses known)
    or None; the losses and steps; exact-match ``accuracy`` at the training lengths and ``long`` beyond
    them, and ``generalises`` False where the accuracy drops by more than GENERALISE_DROP beyond them
    (None without both)."""
    il, fl, steps = num(summary.get("initial_loss")), num(summary.get("final_loss")), summary.get("steps")
    trained = "untrained" if steps == 0 else ("trained" if il is not None and fl is not None else None)
    acc, acc_long = num(summary.get("eval_accuracy")), num(summary.get("eval_accuracy_long"))
    gen = None if acc is None or acc_long is None else not (acc - acc_long > GENERALISE_DROP)
    return {"trained": trained, "initial_loss": il, "final_loss": fl, "steps": steps, "accuracy": acc,
            "long": acc_long, "generalises": gen}
