"""Readings of the neighbourhood measures (arXiv 2501.00073): APS and norm scores of any run."""

from __future__ import annotations

from poslens.fmt import fmt
from poslens.metrics.judge.papers import judge_neighborhood, norm_trend
from poslens.reporting.readings.common import _layers_phrase, _series_short, layer_aps

#: the words of each :func:`poslens.metrics.judge.papers.norm_trend` code
NORM_WORDS = {"shrink": "norms shrink with position, as running means do",
              "steady": "norms do not change consistently with position", "grow": "norms grow with position"}


def norm_phrase(v: float) -> str:
    """What a norm score says (the thresholds of ``poslens neighborhood``)."""
    return NORM_WORDS[norm_trend(v)]


def render_neighborhood(j: dict) -> list[str]:
    """The sentences of :func:`poslens.metrics.judge.papers.judge_neighborhood`'s dict ``j``."""
    out: list[str] = []
    ids, aps, emb = j["layers"], j["aps"], j["embeddings"]
    where = _layers_phrase(ids) if len(ids) <= 4 else f"layers {ids[0]} … {ids[-1]}"
    start = f"embeddings {fmt(emb)}, then " if emb is not None else ""
    if j["per_seq"]:
        out.append(f"Adjacency probability score of the residual stream (the hidden states) per sequence (0.5 = chance, 1 = every token is "
                   f"more similar to nearer tokens): {start}{_series_short(aps)} after {where}.")
    else:
        out.append(f"Mean-map APS of the residual stream (the hidden states; the APS of the cosine map averaged over sequences, not the "
                   f"paper's per-sequence APS; it approaches 1 for any consistent trend as sequences are added, so "
                   f"0.5 is no chance level here): {start}{_series_short(aps)} after {where}.")
    if j["control"] == "bidirectional":
        out.append("This is the bidirectional control (no causal mask): theory predicts no adjacency pattern; "
                   f"measured maximum {fmt(j['max'])}.")
    elif j["control"] == "first":
        out.append(f"The first attention layer already creates the adjacency pattern: the residual stream's APS "
                   f"rises from {fmt(emb)} "
                   f"(embeddings, no position) to {fmt(aps[0])}.")
    elif j["control"] == "unclear":
        out.append("No layer's residual stream shows a clear adjacency pattern (APS < 0.6 everywhere).")
    if j["attn"] is not None:
        out.append(f"The attention outputs alone (not the residual stream) reach APS {fmt(j['attn'])}; near-uniform causal attention makes them "
                   "running means, whose cosine similarity rises towards the diagonal (theory: APS ≈ 1).")
    if j["norms"]:
        out.append(f"Norm score {_series_short(j['norms'])} (median {fmt(j['median'])}: {NORM_WORDS[j['norm']]}; "
                   f"≥ {j['shrink']} = shrink, ≤ {fmt(1 - j['shrink'])} = grow).")
    return out


def neighborhood_readings(summary: dict) -> list[str]:
    """Sentences on a scan's adjacency probability scores (arXiv 2501.00073): :func:`render_neighborhood` of
    :func:`poslens.metrics.judge.papers.judge_neighborhood` on its layers with an APS.

    The paper's APS is per sequence (mean ± std over sequences); a scan that only has the APS of
    the cosine map averaged over sequences says so: that number rises towards 1 for any consistent
    weak trend as sequences are added, so it has no 0.5-chance reading."""
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict) and layer_aps(l)[0] is not None]
    if not layers:
        return []
    return render_neighborhood(judge_neighborhood(summary, layers, [layer_aps(l)[0] for l in layers]))
