"""Readings of the slash measures (arXiv 2601.08297) on any run's slash heads."""

from __future__ import annotations

import math

from poslens.conventions import (SLASH_MAX_DELTA)
from poslens.fmt import fmt
from poslens.reporting.readings.common import layer_slash_head, num


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
                 and num(t["score"]) >= 0 and isinstance(t.get("offset"), int) and 1 <= t["offset"] <= max_delta]
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
    layers = summary.get("layers")
    for l in layers if isinstance(layers, list) else []:
        if not isinstance(l, dict) or not isinstance(l.get("q_top1_energy"), list):
            continue  # an entry of the wrong shape is skipped, like every odd entry
        q = [num(v) for v in l["q_top1_energy"] if num(v) is not None]
        if q:
            top1.append((l.get("layer"), max(q)))
    if top1:
        best = max(top1, key=lambda x: x[1])
        out.append(f"Pre-RoPE queries are closest to rank one in layer {best[0]}: the top singular direction holds "
                   f"{fmt(best[1])} of the energy in its most rank-one head (1 = rank one, the first condition for "
                   "slash-dominant heads).")
    return out
