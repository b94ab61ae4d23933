"""Readings of the neighbourhood measures (arXiv 2501.00073): APS and norm scores of any run."""

from __future__ import annotations


from poslens.conventions import (NORM_SHRINK)
from poslens.fmt import fmt
from poslens.reporting.readings.common import _layers_phrase, _series_short, layer_aps, num


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
