"""The findings of ``poslens compare`` in words, rendered from its ``summary.json``: per reading how many
heads or layers change (B − A beyond the noise floor z·SE and the reading's threshold) at each
length, the largest changed cells with their change ± SE, the loss overall and past the trained
context, the lengths past it, and a note where too few sequence groups keep the test from calling a change."""

from __future__ import annotations

from poslens.fmt import fmt
from poslens.metrics.judge.papers import num, too_few_groups

#: the per-head readings and the per-layer ones, in the order of the sentences
HEAD = ("sink", "slash", "prev_token", "entropy", "distance")
LAYER = ("relativity", "locality", "diagonal_trend", "band_high", "band_medium", "band_low", "massive_dims")
#: what each reading is, in words, and its unit after a number
WHAT = {"sink": "the sink share (weight on key 0)", "slash": "the SlashScore at A's best offset",
        "prev_token": "the previous-token SlashScore(1)", "entropy": "the attention entropy",
        "distance": "the mean attention distance", "relativity": "the relativity index",
        "locality": "locality", "diagonal_trend": "the diagonal trend",
        "band_high": "the q·k energy in the high RoPE band", "band_medium": "the q·k energy in the medium band",
        "band_low": "the q·k energy in the low band", "massive_dims": "the massive q/k dimensions",
        "loss": "the next-token loss"}
UNIT = {"entropy": " nats", "distance": " tokens", "loss": " nats per token", "massive_dims": " dimensions"}
#: changed cells quoted per reading
STRONGEST = 3


def compare_readings(summary: dict) -> list[str]:
    """Every finding of a comparison (see the module docstring)."""
    recs = [r for r in summary.get("changes") or [] if isinstance(r, dict)]
    lengths = [int(s) for s in summary.get("seq_lens") or [] if num(s) is not None]
    if not recs or not lengths:
        return []
    out = [_headline(summary, recs)]
    out += _groups_note(summary)
    for S in sorted(lengths):  # every length: what changes inside the trained context and past it
        out += [t for t in (_head_reading(summary, recs, name, S) for name in HEAD) if t]
        out += _layer_readings(summary, recs, S)
    out += _loss_readings(summary, recs, lengths)
    past = [s for s in lengths if (summary.get("beyond_context") or {}).get(str(s))]
    if past:
        out.append(f"{_list([f'{s} tokens' for s in past])} lie past the trained context of "
                   f"{summary.get('trained_context')} positions: what changes there may be the length, not the variant "
                   "alone.")
    return out


# --------------------------------------------------------------------------------------------
# phrases
# --------------------------------------------------------------------------------------------
def _subject(summary: dict) -> str:
    """Side B by name: its variants, else the other model, else "B"."""
    if summary.get("variant_label"):
        return str(summary["variant_label"])
    a, b = summary.get("model_b"), summary.get("model_a")
    return str(a) if a and a != b else "B"


def _cell(r: dict) -> str:
    return f"layer {r['layer']}, head {r['head']}" if r.get("head") is not None else f"layer {r['layer']}"


def _change(r: dict) -> str:
    """``+0.21 ± 0.02 nats (A 1.2 → B 1.4)``."""
    unit = UNIT.get(r["reading"], "")
    return f"{fmt(num(r['delta']), signed=True)} ± {fmt(num(r['se']))}{unit} (A {fmt(num(r['a']))} → B {fmt(num(r['b']))})"


def _why_unchanged(r: dict) -> str:
    """Why the largest change is no change: within its noise floor, under the threshold, or beyond both and
    not significant after the correction (too few groups, or too many cells)."""
    d, floor, th = abs(num(r.get("delta")) or 0.0), num(r.get("floor")), num(r.get("threshold"))
    if floor is None:
        return "not measured against noise (fewer than two sequence groups)"
    if d <= floor:
        return f"within its noise floor of {fmt(floor)}"
    if th is not None and d - floor < th:
        return f"beyond its noise floor of {fmt(floor)} but under the threshold of {fmt(th)}"
    return (f"beyond its noise floor of {fmt(floor)} and the threshold of {fmt(th)}, but its p-value "
            f"{fmt(num(r.get('p')))} is not significant after the Benjamini–Hochberg correction")


def _list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _changed(rs: list[dict]) -> list[dict]:
    """The changed cells, the largest |B − A| first."""
    return sorted((r for r in rs if r.get("verdict") == "changed"), key=lambda r: abs(num(r["delta"]) or 0.0),
                  reverse=True)


def _largest(rs: list[dict]) -> dict | None:
    fin = [r for r in rs if num(r.get("delta")) is not None]
    return max(fin, key=lambda r: abs(num(r["delta"]))) if fin else None


# --------------------------------------------------------------------------------------------
# sentences
# --------------------------------------------------------------------------------------------
def _headline(summary: dict, recs: list[dict]) -> str:
    a, b = summary.get("model_a") or "A", summary.get("model_b") or "B"
    label = f" under {summary['variant_label']}" if summary.get("variant_label") else ""
    n = sum(1 for r in recs if r.get("verdict") == "changed")
    return (f"A = {a}, B = {b}{label}, on the same {summary.get('num_seqs')} sequences: {n} of {len(recs)} cells "
            f"change (B − A beyond its noise floor, the z·SE of the paired difference over "
            f"{summary.get('noise_groups')} sequence groups at a false discovery rate of {fmt(num(summary.get('level')))}, "
            "and beyond the reading's threshold). Decoder layers count from 0.")


def _groups_note(summary: dict) -> list[str]:
    """Too few sequence groups for the test to call a change, alone or after the correction over the heads."""
    G, p_min, level = num(summary.get("noise_groups")), num(summary.get("min_p")), num(summary.get("level"))
    if G is None or p_min is None or level is None:
        return []
    cells = int(num(summary.get("num_layers")) or 1) * int(num(summary.get("num_heads")) or 1)
    few = too_few_groups([{"noise_groups": G}])["few"]
    more = "more sequences are needed (one group per sequence, up to 16 groups)"
    if few == "not_below" or p_min >= level:
        return [f"With {int(G)} sequence groups the smallest p-value the sign-flip test can give is {fmt(p_min)}, not "
                f"below the level {fmt(level)}: no change can be called, however large; {more}."]
    if p_min > level / cells:
        return [f"With {int(G)} sequence groups the smallest p-value is {fmt(p_min)}, above {fmt(level / cells)} (the "
                f"level after the Benjamini–Hochberg correction over {cells} heads for a change in one head alone): a "
                f"head that changes alone cannot be called, only changes shared by many heads; {more}."]
    return []


def _head_reading(summary: dict, recs: list[dict], name: str, S: int) -> str | None:
    cells = [r for r in recs if r.get("reading") == name and r.get("seq_len") == S and r.get("head") is not None]
    if not cells:
        return None
    if name == "slash" and all(r.get("offset_a") == 1 for r in cells):
        return None  # every head's best offset is Δ = 1: the previous-token sentence says it
    layer_rows = [r for r in recs if r.get("reading") == name and r.get("seq_len") == S and r.get("head") is None
                  and r.get("layer") is not None]
    who, what = _subject(summary), WHAT[name]
    if name == "prev_token" and all(r.get("offset_a") == 1 for r in recs if r.get("reading") == "slash"
                                    and r.get("seq_len") == S and r.get("head") is not None):
        what += " (every head's best SlashScore offset, Δ = 1 in each)"
    ch = _changed(cells)
    if not ch:
        big = _largest(cells)
        tail = f"; the largest change, {_change(big)} at {_cell(big)}, is {_why_unchanged(big)}" if big else ""
        return f"{who} keeps {what} in every head at {S} tokens (no change of {len(cells)} heads){tail}."
    ch_layers = _changed(layer_rows)
    means = f" and the mean over heads in {len(ch_layers)} of {len(layer_rows)} layers" if layer_rows else ""
    strongest = "; ".join(f"{_cell(r)}: {_change(r)}" for r in ch[:STRONGEST])
    return (f"{who} changes {what} in {len(ch)} of {len(cells)} heads{means} at {S} tokens; the largest: "
            f"{strongest}.")


def _layer_readings(summary: dict, recs: list[dict], S: int) -> list[str]:
    """A sentence per per-layer reading that changes; one for those that do not, each with its largest change."""
    who, out, kept = _subject(summary), [], []
    for name in LAYER:
        rows = [r for r in recs if r.get("reading") == name and r.get("seq_len") == S and r.get("layer") is not None]
        if not rows:
            continue
        ch = _changed(rows)
        if ch:
            strongest = "; ".join(f"{_cell(r)}: {_change(r)}" for r in ch[:STRONGEST])
            out.append(f"{who} changes {WHAT[name]} in {len(ch)} of {len(rows)} layers at {S} tokens; the largest: "
                       f"{strongest}.")
        else:
            big = _largest(rows)
            kept.append(f"{name} (largest {fmt(num(big['delta']), signed=True)} at {_cell(big)}, floor "
                        f"{fmt(num(big.get('floor')))})" if big else name)
    if kept:
        out.append(f"No layer changes at {S} tokens in {_list(kept)}.")
    return out


def _loss_readings(summary: dict, recs: list[dict], lengths: list[int]) -> list[str]:
    """The loss over all positions at each length, and past the trained context."""
    out, overall = [], []
    for S in lengths:
        rows = [r for r in recs if r.get("reading") == "loss" and r.get("seq_len") == S]
        if rows and num(rows[0].get("delta")) is not None:
            overall.append(f"{_change(rows[0])} at {S} tokens ({rows[0].get('verdict')})")
    if overall:
        out.append(f"The next-token loss over all positions moves by {'; '.join(overall)}.")
    T = num(summary.get("trained_context"))
    past = []
    for S in lengths:
        if T is None or S <= T:
            continue
        rows = [r for r in recs if r.get("reading") == "loss" and r.get("seq_len") == S][1:]
        beyond = [r for r in rows if isinstance(r.get("positions"), list) and r["positions"][1] >= T]
        if beyond:
            r = max(beyond, key=lambda r: r["positions"][0])
            past.append(f"{_change(r)} on positions {r['positions'][0]}–{r['positions'][1]} at {S} tokens "
                        f"({r.get('verdict')})")
    if past:
        out.append(f"Past the trained context of {int(T)} positions the loss moves by {'; '.join(past)}.")
    return out
