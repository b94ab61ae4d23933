"""Readings of the slash measures (arXiv 2601.08297) on any run's slash heads."""

from __future__ import annotations

from poslens.conventions import SLASH_MAX_DELTA
from poslens.fmt import fmt
from poslens.metrics.judge.papers import judge_slash
from poslens.metrics.judge.papers import num
from poslens.reporting.readings.common import layer_slash_head


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


def render_slash(j: dict) -> list[str]:
    """The sentences of :func:`poslens.metrics.judge.papers.judge_slash`'s dict ``j``."""
    out: list[str] = []
    h = j["head"]
    if h is not None:
        ratio = h["ratio"]
        cmp = (f"; uniform causal attention would put {fmt(h['uniform'])} there (ratio {fmt(ratio)})" if ratio else "")
        out.append(f"Strongest slash head at offsets Δ = 1 … {SLASH_MAX_DELTA}: layer {h['layer']} head "
                   f"{h['head']} puts {fmt(h['score'])} of its attention on the token {h['offset']} "
                   f"position(s) back{cmp}.")
        if j["code"] == "weak":
            out.append("No head is clearly slash-dominant here (less than twice the uniform baseline).")
        elif j["code"] == "slash":
            out.append(f"That head is {fmt(ratio)}× more concentrated on its sub-diagonal than uniform attention: "
                       "a slash pattern.")
    if j["sink"] is not None:
        out.append(f"Attention on key 0 (the sink) averages {fmt(j['sink'])}: offsets beyond Δ = {SLASH_MAX_DELTA} "
                   "reach that column and are not counted as slashes.")
    if j["rank_one"] is not None:
        r = j["rank_one"]
        out.append(f"Pre-RoPE queries are closest to rank one in layer {r['layer']}: the top singular direction holds "
                   f"{fmt(r['energy'])} of the energy in its most rank-one head (1 = rank one, the first condition "
                   "for slash-dominant heads).")
    return out


def slash_readings(summary: dict) -> list[str]:
    """Sentences on a scan's slash heads and rank-one measures (arXiv 2601.08297): :func:`render_slash` of
    :func:`poslens.metrics.judge.papers.judge_slash` with its strongest head (:func:`slash_top`)."""
    return render_slash(judge_slash(summary, slash_top(summary)))
