"""Plain-language readings of the numbers in run summaries: the one place prose is written.

Each function takes the numbers a command wrote and returns short sentences that say what its
figures show, quoting the numbers that support the sentence (in the one number format of
:mod:`poslens.fmt`). Thresholds are stated in the sentences' wording ("purely relative" =
relativity index >= 0.98) so a reader can check them. :func:`key_findings` writes the page's
summary, one entry per paper.

- per paper, on any run's per-layer numbers: :func:`kim_readings`, :func:`slash_readings`,
  :func:`neighborhood_readings` (scans and simulations), :func:`model_readings` (model directories);
- per analysis command, on its summary (:data:`COMMAND_READINGS`): :func:`neighborhood_command_readings`,
  :func:`panels_readings`, :func:`score_maps_readings` (kim-maps), :func:`slash_command_readings`,
  :func:`dynamics_readings` (slash-dynamics), :func:`sweep_readings`, :func:`probes_readings`; the
  commands write these into ``summary.json`` and the report uses the same functions;
- :func:`run_readings`: one run's readings for one paper, whatever command wrote it;
- :data:`PAPERS`: the papers' titles, references and introductions for the report's sections.
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
#: p-value below which a sample-group test is called significant (as :data:`poslens.capture.statistics.accumulators.NOISE_P`)
SIGNIFICANT = 0.01
#: the smallest attainable p-value of a sign-flip test (2 / 2^G with G groups) must lie this many times
#: under SIGNIFICANT for a test to call anything: else the readings say there are too few sequences
FEW_GROUPS_MARGIN = 10


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
             and num(t["score"]) >= 0 and isinstance(t.get("offset"), int) and 1 <= t["offset"] <= max_delta]
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


def _decoder_layers(layers: list) -> tuple[dict | None, list[dict]]:
    """``(embeddings entry or None, decoder-layer entries in order)`` of a summary's ``layers``."""
    layers = [l for l in layers or [] if isinstance(l, dict)]
    emb = next((l for l in layers if l.get("layer") == "embeddings"), None)
    return emb, [l for l in layers if isinstance(l.get("layer"), int) and not isinstance(l.get("layer"), bool)]


def _kim_flat(layers: list[dict], flat: list[dict], live: list[dict], noise: str) -> list[str]:
    """The sentence naming the flat layers (none when there are none)."""
    if not flat:
        return []
    within = f" within {noise}" if noise else ""
    verb = "is" if len(flat) == 1 else "are"
    if len(flat) > 6 and live and len(live) <= 3:  # many flat layers: name the few that are not
        who = (f"All {len(layers)} layers but {_layers_phrase([l.get('layer') for l in live])[7:]} "
               f"({len(flat)} of {len(layers)})") if len(live) > 1 else \
            f"All {len(layers)} layers but layer {live[0].get('layer')} ({len(flat)} of {len(layers)})"
        verb = "are"
    else:
        who = _layers_phrase([l.get("layer") for l in flat]).capitalize()
    return [f"{who} {verb} flat{within}: there the attention scores carry no information about position."]


def _kim_series(layers: list[dict], flat: list[dict], live: list[dict], noise: str) -> list[str]:
    """The per-layer relativity index and locality of the layers that are not flat."""
    ri = [num(l.get("relativity_index")) for l in live]
    loc = [num(l.get("locality")) for l in live]
    # "from layer k on" only where every flat layer comes before every live one
    first_live = layers.index(live[0])
    tail = flat and len(live) > 1 and all(num(l.get("relativity_index")) is not None for l in layers[first_live:])
    where = (f"from layer {live[0].get('layer')} on" if tail
             else f"in {_layers_phrase([l.get('layer') for l in live])}")
    # "depend on position" only where flatness could have been found: a test over too few groups
    # (smallest p not below SIGNIFICANT) calls nothing flat
    p_min = smallest_p(live)[1]
    claim = " the scores depend on position:" if noise and (p_min is None or p_min < SIGNIFICANT) else ""
    sink = any(num(l.get("relativity_index_with_sink")) is not None for l in live)
    what = "relativity index (key 0 excluded)" if sink else "relativity index"
    if all(l.get("relativity_index_noise_corrected") for l in live):
        what = "noise-corrected " + what
    out = [f"{where[0].upper()}{where[1:]}{claim} {what} {_series_short(ri)} "
           f"(1 = a function of the distance i − j alone) and locality {_series_short(loc)} "
           "(+1 = every query's scores rise as the key gets closer)."]
    if not noise:
        out.append("These maps carry no standard errors: with few sequences, small values may be sampling noise.")
    return out


def _kim_locality(live: list[dict]) -> list[str]:
    """Whether the layers favour nearby or distant keys (|locality| > TREND)."""
    loc = [num(l.get("locality")) for l in live]
    locs = [v for v in loc if v is not None]
    if not locs:
        return []
    if min(locs) > TREND:
        return ["Every such layer favours nearby keys: scores rise as the key approaches the query."]
    if max(locs) < -TREND:
        return ["Scores fall as the key approaches the query: distant keys are favoured."]
    strong = [l.get("layer") for l, v in zip(live, loc) if v is not None and abs(v) > TREND]
    if strong:
        return [f"The preference for nearby or distant keys is clear only in {_layers_phrase(strong)}."]
    return [f"No layer shows a clear trend with distance (|locality| ≤ {TREND})."]


def _pvalues(live: list[dict], key: str) -> list[float]:
    """The layers' p-values ``key``, where they have one."""
    return [num(l.get(key)) for l in live if num(l.get(key)) is not None]


def _tested(live: list[dict], key: str) -> tuple[int, int]:
    """``(significant, tested)``: layers whose p-value ``key`` is below SIGNIFICANT, of those with one."""
    ps = _pvalues(live, key)
    return sum(p < SIGNIFICANT for p in ps), len(ps)


def fdr_count(ps: list[float], q: float = SIGNIFICANT) -> int:
    """How many of the layers' p-values stay significant when the false discovery rate over all of them
    is held at ``q``: Benjamini–Hochberg adjusted p-values (``scipy.stats.false_discovery_control``)
    below ``q``. Each layer is its own test on the same sequences; counting layers at p < q each would
    expect ``q`` × the number of layers false calls."""
    if not ps:
        return 0
    from scipy.stats import false_discovery_control  # lazily: scipy.stats costs a fifth of a second to import

    return int((false_discovery_control([min(max(p, 0.0), 1.0) for p in ps], method="bh") < q).sum())


def _count_phrase(live: list[dict], key: str, what: str) -> str:
    """``"<what> (p < 0.01) in S of T layers, F at a false discovery rate of 0.01 over the T
    (Benjamini–Hochberg)"``: the correction only with more than one layer tested; "" with none."""
    ps = _pvalues(live, key)
    if not ps:
        return ""
    sig, n = sum(p < SIGNIFICANT for p in ps), len(ps)
    text = f"{what} (p < {SIGNIFICANT}) in {sig} of {n} layer{'s' if n > 1 else ''}"
    if len(ps) > 1:
        text += f", {fdr_count(ps)} at a false discovery rate of {SIGNIFICANT} over the {len(ps)} (Benjamini–Hochberg)"
    return text


def _kim_relativity(live: list[dict]) -> list[str]:
    """What the relativity index says: purely relative layers, and how much depends on absolute
    position; where p-values of "purely relative" exist and none is significant, that the lower
    values are not beyond sampling noise. Read from the noise-corrected grid index where every layer
    has one (a scan's full-map index is noise-corrected only where its noise grid is the whole map)."""
    grid = all(num(l.get("grid_relativity_index")) is not None for l in live)
    ri = [num(l.get("grid_relativity_index" if grid else "relativity_index")) for l in live]
    corrected = grid or all(l.get("relativity_index_noise_corrected") for l in live)
    which = "noise-corrected relativity" if corrected else "relativity"
    sig, tested = _tested(live, "nonrelative_p")
    if tested and not sig and min(ri) < RELATIVE:
        return [f"The {which} index is as low as {f2(min(ri))} (layer {live[ri.index(min(ri))].get('layer')}), but in no "
                f"layer is the departure from a purely relative map beyond sampling noise (p of \"purely "
                f"relative\" ≥ {SIGNIFICANT} in all {tested}): the data do not show a non-relative pattern."]
    if ri[0] >= RELATIVE and len(ri) > 1 and min(ri[1:]) < RELATIVE - 0.03:
        k = min(range(1, len(ri)), key=lambda i: ri[i])
        return [f"Layer {live[0].get('layer')} is purely relative ({which} {f2(ri[0])}); later layers drop "
                f"to {f2(ri[k])} (layer {live[k].get('layer')}): position matters beyond the distance i − j, "
                "a non-relative pattern that the diagonal-normalised figure makes visible."]
    if min(ri) >= RELATIVE:
        return [f"All of them are purely relative ({which} ≥ {RELATIVE}): each diagonal is constant and the "
                "diagonal-normalised maps are flat."]
    if min(ri) < 0.9:
        return [f"Up to {f2(1 - min(ri))} of the variation is not explained by the distance alone ({which} index "
                f"{f2(min(ri))}): the maps also "
                "depend on absolute position (diagonal-normalised figure: what remains after removing each "
                "diagonal's mean)."]
    return []


def _kim_diagonal_trend(live: list[dict]) -> list[str]:
    """The signed trend along the diagonals, its sign read only where it is beyond noise."""
    trend = [num(l.get("diagonal_trend")) for l in live]
    if all(t is None for t in trend):
        return []
    fin = [t for t in trend if t is not None]
    # with sample-group p-values, the sign is read only where the trend is beyond noise
    tested = [(l, num(l.get("diagonal_trend"))) for l in live if num(l.get("trend_p")) is not None
              and num(l.get("diagonal_trend")) is not None]
    where = "every diagonal"
    if tested:
        fin = [t for l, t in tested if num(l["trend_p"]) < SIGNIFICANT]
        where = (f"every diagonal in the {len(fin)} layer(s) where the trend is significant (p < {SIGNIFICANT})"
                 if len(fin) < len(tested) else where)
    sign = ("shows no significant trend in any layer" if not fin else
            f"rises to the right on {where} (left columns lower)" if min(fin) > 0 else
            f"falls to the right on {where} (left columns higher)" if max(fin) < 0 else
            "changes sign between layers")
    return [f"Signed trend along the diagonals (+1 = the entry further right on each diagonal is higher): "
            f"{_series_short(trend)}; the score {sign}."]


def _kim_noise(live: list[dict]) -> list[str]:
    """The noise floor of a scan's numbers: the grid statistics the p-values belong to, the share of
    the full map's within-diagonal variation that sampling noise alone gives (a scan's full-map index
    is not noise-corrected), and whether there are enough sequence groups to call anything."""
    out: list[str] = []
    grid = [l for l in live if num(l.get("grid_diagonal_trend")) is not None]
    if grid:  # the p-values and standard errors describe the grid map's statistics, not the full map's
        n = max(int(num(l.get("noise_positions")) or 0) for l in grid)
        tcount = _count_phrase(grid, "trend_p", "the trend is significant")
        out.append(f"The p-values and standard errors come from sample groups kept on a {n}-position grid of the map; "
                   f"on that grid the trend reads {_series_short([l.get('grid_diagonal_trend') for l in grid])} and "
                   f"the noise-corrected relativity index "
                   f"{_series_short([l.get('grid_relativity_index') for l in grid])}"
                   + (f"; {tcount}." if tcount else "."))
    share = noise_shares(live)
    if share:
        out.append(f"The full-map relativity index is not noise-corrected: sampling noise alone accounts for "
                   f"{_pct_span(share)} % of the within-diagonal variation it counts against relativity "
                   "(noise floor of the diagonal-normalised map over its observed mean square).")
    few = few_groups(live)
    if few:
        out.append(few[0].upper() + few[1:] + ".")
    return out


def _kim_extras(layers: list[dict], live: list[dict]) -> list[str]:
    """The sink column's weight, and a simulation's agreement with the closed form."""
    out: list[str] = []
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


def noise_shares(layers: list[dict]) -> list[float]:
    """Per scan layer whose full-map index is computed without the noise groups (one with
    ``noise_positions`` but neither a grid index nor ``relativity_index_noise_corrected``): the share of the observed within-diagonal mean
    square that sampling noise alone gives, ``(within_diag_rms_noise / within_diag_rms)^2`` capped at 1
    (the noise estimate can exceed what is observed)."""
    out = []
    for l in layers:
        rms, noise = num(l.get("within_diag_rms")), num(l.get("within_diag_rms_noise"))
        if ("noise_positions" in l and num(l.get("grid_relativity_index")) is None
                and not l.get("relativity_index_noise_corrected") and rms and noise is not None):
            out.append(min((noise / rms) ** 2, 1.0))
    return out


def _pct_span(shares: list[float]) -> str:
    return _span([100 * s for s in shares])


def smallest_p(layers: list[dict]) -> tuple[int, float | None]:
    """``(G, 2 / 2^G)``: the layers' largest number of noise groups and the smallest p-value a sign-flip
    test over that many groups can give (every flip pattern and its mirror image tie); ``(G, None)``
    with fewer than two groups."""
    groups = [int(num(l.get("noise_groups"))) for l in layers if num(l.get("noise_groups")) is not None]
    g = max(groups, default=0)
    return g, (2.0 / 2**g if g >= 2 else None)


def few_groups(layers: list[dict]) -> str:
    """A clause saying that the layers' sign-flip tests had too few sequence groups to call a trend or a
    departure from relativity ("" where they had enough): with ``G`` groups the smallest p-value the
    test can give is 2 / 2^G, which must lie well under SIGNIFICANT (by FEW_GROUPS_MARGIN)."""
    g, p_min = smallest_p(layers)
    if p_min is None or p_min * FEW_GROUPS_MARGIN <= SIGNIFICANT:
        return ""
    where = "not below" if p_min >= SIGNIFICANT else "barely below"
    return (f"only {g} independent groups of sequences: the smallest p-value the sign-flip test can give is "
            f"{fmt(p_min)}, {where} the {SIGNIFICANT} threshold, too few sequences to call a trend or a departure "
            "from relativity")


def kim_readings(layers: list[dict], *, noise: str = "") -> list[str]:
    """Sentences on per-layer relativity index and locality (arXiv 2509.21042).

    ``layers``: dicts with ``layer``, ``relativity_index`` (None = flat), ``locality``, and
    optionally ``max_stderr`` / ``theory_max_abs_diff`` (simulator runs) and a scan's noise floor
    (``nonrelative_p``, ``trend_p``, ``noise_groups``, ``noise_positions``, ``within_diag_rms_noise``,
    ``grid_*``). ``noise`` names what "flat" is judged against ("Monte Carlo noise").
    """
    layers = [l for l in layers if isinstance(l, dict)]
    # no noise floor (too few sample groups): no verdict, flat or not
    missing = [l for l in layers if isinstance(l.get("missing"), dict) and "relativity_index" in l["missing"]]
    if missing:
        out = [f"No relativity index for {_layers_phrase([l.get('layer') for l in missing])}: "
               f"{missing[0]['missing']['relativity_index']}."]
        rest = [l for l in layers if l not in missing]
        return out + (kim_readings(rest, noise=noise) if rest else [])
    flat = [l for l in layers if num(l.get("relativity_index")) is None]
    live = [l for l in layers if num(l.get("relativity_index")) is not None]
    out = _kim_flat(layers, flat, live, noise)
    if not live:
        return out
    return (out + _kim_series(layers, flat, live, noise) + _kim_locality(live) + _kim_relativity(live)
            + _kim_diagonal_trend(live) + _kim_noise(live) + _kim_extras(layers, live))


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
    """A run's relativity index, locality and trend, led by the noise-corrected (grid) index and its
    test where a scan has one; a scan's full-map index, noise-corrected where its grid is the whole map
    and otherwise quoted with its noise floor beside it; the layers whose tests are significant, each at
    p < 0.01 and after a Benjamini–Hochberg false discovery rate over the layers; and a warning where
    too few sequence groups were scanned to call anything."""
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict) and "relativity_index" in l]
    if not layers:
        return None
    live = [l for l in layers if num(l.get("relativity_index")) is not None]
    missing = [l for l in layers if isinstance(l.get("missing"), dict) and "relativity_index" in l["missing"]]
    flat = len(layers) - len(live) - len(missing)
    if missing and not live:
        return f"{name}: no relativity index ({missing[0]['missing']['relativity_index']})."
    if not live:
        return f"{name}: every one of {len(layers)} layers is flat (no positional information in the scores)."
    lo = min(live, key=lambda l: num(l["relativity_index"]))
    sink = " (key 0 excluded)" if any("relativity_index_with_sink" in l for l in live) else ""
    ri = _span([l["relativity_index"] for l in live])
    test = _count_phrase(live, "nonrelative_p", "not purely relative")
    test = f", {test}" if test else ""
    grid = [l for l in live if num(l.get("grid_relativity_index")) is not None]
    share = noise_shares(live)
    if grid:
        n = max(int(num(l.get("noise_positions")) or 0) for l in grid)
        text = (f"{name}: noise-corrected relativity index{sink} {_span([l['grid_relativity_index'] for l in grid])} "
                f"on a {n}-position grid over {len(grid)} layer(s){test}; full-map index {ri} (not noise-corrected), "
                f"lowest in layer {lo.get('layer')}")
    elif all(l.get("relativity_index_noise_corrected") for l in live):
        text = (f"{name}: noise-corrected relativity index{sink} {ri} over {len(live)} layer(s) (full map){test}, "
                f"lowest in layer {lo.get('layer')}")
    elif share:
        text = (f"{name}: relativity index{sink} {ri} over {len(live)} layer(s) (full map, not noise-corrected: "
                f"sampling noise alone gives {_pct_span(share)} % of the within-diagonal variation){test}, "
                f"lowest in layer {lo.get('layer')}")
    else:
        text = (f"{name}: relativity index{sink} {ri} over {len(live)} layer(s){test}, "
                f"lowest in layer {lo.get('layer')}")
    text += f"; locality {_span([l.get('locality') for l in live])}"
    if flat:
        text += f"; {flat} flat layer(s)"
    trend = [num(l.get("diagonal_trend")) for l in live if num(l.get("diagonal_trend")) is not None]
    if trend:
        tcount = _count_phrase(live, "trend_p", "significant")
        text += f"; diagonal trend {_span(trend)}" + (f" ({tcount})" if tcount else "")
    few = few_groups(live)
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
    if any(num(l.get("aps_mean")) is not None for l in dec):
        return f"{name}: APS per sequence {_span(aps)} over {len(aps)} decoder layers (0.5 = chance)."
    return (f"{name}: mean-map APS {_span(aps)} over {len(aps)} decoder layers (APS of the sequence-averaged cosine "
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


# --------------------------------------------------------------------------------------------
# readings of the analysis commands, each written from the numbers its summary holds
# --------------------------------------------------------------------------------------------
#: APS at or above which an adjacency pattern is "clear" (and at or above ADJACENT_WEAK "weak")
ADJACENT, ADJACENT_WEAK = 0.8, 0.6
#: |locality| of a panel above which it is said to favour nearby (or distant) keys
PANEL_TREND = 0.1
#: a neighbourhood map's mean |cosine − theory| below which attention is called nearly uniform
THEORY_CLOSE = 0.05


def neighborhood_command_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens neighborhood`` run (arXiv 2501.00073) from its per-layer numbers:
    ``layers`` = the embeddings (``"layer": "embeddings"``) then decoder layers from 0, each with
    ``aps_mean``, ``norm_score_mean`` and, for the control, ``bidirectional_aps_mean``;
    ``theory_gap_layer0``: mean |cosine − theory| of the first decoder layer's mean map."""
    out: list[str] = []
    emb, dec = _decoder_layers(summary.get("layers"))
    dec = [l for l in dec if num(l.get("aps_mean")) is not None]
    if not dec:
        return out
    first, last = dec[0], dec[-1]
    a1 = num(first["aps_mean"])
    verdict = ("a clear adjacency pattern" if a1 >= ADJACENT else "a weak adjacency pattern" if a1 >= ADJACENT_WEAK
               else "no adjacency pattern")
    emb_aps = num(emb.get("aps_mean")) if emb else None
    out.append(f"The head outputs of the first decoder layer (layer {first['layer']}) have APS {fmt(a1)} under the "
               f"causal mask: {verdict} (0.5 = chance, 1 = every row rises towards the diagonal)"
               + (f"; the embeddings have {fmt(emb_aps)}." if emb_aps is not None else "."))
    if len(dec) > 1:
        best = max(dec, key=lambda l: num(l["aps_mean"]))
        out.append(f"The highest APS is in layer {best['layer']} ({fmt(num(best['aps_mean']))}); the last layer "
                   f"({last['layer']}) has {fmt(num(last['aps_mean']))}.")
    b1 = num(first.get("bidirectional_aps_mean"))
    if b1 is not None:
        diff = a1 - b1
        out.append(f"Without the causal mask layer {first['layer']}'s APS is {fmt(b1)}, {fmt(abs(diff))} "
                   f"{'lower' if diff > 0 else 'higher'} than causal: "
                   + ("the mask is what creates the adjacency pattern." if diff > 0.1 and abs(b1 - 0.5) < 0.1
                      else "the mask is not the only source of the difference." if diff > 0.1
                      else "the mask makes little difference here."))
    ns = num(first.get("norm_score_mean"))
    if ns is not None:
        out.append(f"Layer {first['layer']}'s norm score is {fmt(ns)}: {norm_phrase(ns)} (≥ {NORM_SHRINK} = shrink, "
                   f"≤ {fmt(1 - NORM_SHRINK)} = grow).")
    gap = num(summary.get("theory_gap_layer0"))
    if gap is not None:
        out.append(f"Layer {first['layer']}'s mean cosine map differs from the uniform-attention theory "
                   f"sqrt(min(i, j) / max(i, j)) by {fmt(gap)} on average over the lower triangle"
                   + (" (close: attention is nearly uniform)." if gap < THEORY_CLOSE
                      else " (attention is far from uniform)."))
    return out


def panels_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens panels`` run (arXiv 2509.21042's nine-panel Gram decomposition of
    decoder layer ``summary["layer"]``) from ``summary["panels"]``: per panel ``panel``,
    ``locality`` and ``non_relativity`` (key 0 excluded; ``non_relativity_with_sink`` beside it)."""
    out: list[str] = []
    rows = [r for r in summary.get("panels") or [] if isinstance(r, dict)]
    layer = summary.get("layer")
    loc = [(r["panel"], num(r.get("locality"))) for r in rows if num(r.get("locality")) is not None]
    if loc:
        hi = max(loc, key=lambda t: t[1])
        lo = min(loc, key=lambda t: t[1])
        n_pos = sum(1 for _, v in loc if v > 0)
        out.append(f"{n_pos} of {len(loc)} panels of decoder layer {layer} rise towards the diagonal (locality > 0); "
                   f"strongest in ({hi[0]}) at {fmt(hi[1])}, weakest in ({lo[0]}) at {fmt(lo[1])}.")
    byk = {r.get("panel"): r for r in rows}
    a, i = byk.get("a"), byk.get("i")
    if a and i and num(a.get("non_relativity")) is not None and num(i.get("non_relativity")) is not None:
        text = (f"Non-relativity (1 − relativity index, key 0 excluded) goes from {fmt(num(a['non_relativity']))} in "
                f"the layer's normalised input (a) to {fmt(num(i['non_relativity']))} in the next layer's scores (i)")
        ws = [num(r.get("non_relativity_with_sink")) for r in (a, i)]
        if all(w is not None for w in ws):
            text += f"; with key 0: {fmt(ws[0])} → {fmt(ws[1])}"
        out.append(text + ".")
    b = byk.get("b")
    if b and num(b.get("locality")) is not None:
        v = num(b["locality"])
        word = ("favour nearby keys" if v > PANEL_TREND else "favour distant keys" if v < -PANEL_TREND
                else "show little distance trend")
        out.append(f"The layer's own attention scores (b) {word} (locality {fmt(v)}).")
    return out


def score_maps_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens kim-maps`` run (per-layer score maps of a scan) from its layers'
    ``non_relativity`` and ``locality`` (key 0 excluded; ``non_relativity_with_sink`` beside it)."""
    out: list[str] = []
    _, dec = _decoder_layers(summary.get("layers"))
    nr = [(l["layer"], num(l.get("non_relativity"))) for l in dec if num(l.get("non_relativity")) is not None]
    if nr:
        worst = max(nr, key=lambda t: t[1])
        best = min(nr, key=lambda t: t[1])
        out.append(f"Non-relativity (key 0 excluded) ranges from {fmt(best[1])} (layer {best[0]}) to {fmt(worst[1])} "
                   f"(layer {worst[0]}): the diagonals explain {fmt(100 * (1 - worst[1]))} … "
                   f"{fmt(100 * (1 - best[1]))} % of the score maps' variation.")
        ws = [num(l.get("non_relativity_with_sink")) for l in dec if num(l.get("non_relativity_with_sink")) is not None]
        if ws:
            out.append(f"With key 0 (the attention sink column) included, non-relativity reads {_span(ws)}.")
    loc = [num(l.get("locality")) for l in dec if num(l.get("locality")) is not None]
    if loc:
        out.append(f"{sum(v > 0 for v in loc)} of {len(loc)} layers' mean scores rise as keys approach the query "
                   f"(mean locality {fmt(sum(loc) / len(loc))}).")
    sinkw = [num(l.get("sink_weight")) for l in dec if num(l.get("sink_weight")) is not None]
    if sinkw:
        out.append(f"Attention weight on key 0 (the sink), per layer: {_series_short(sinkw)}.")
    return out


def slash_command_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens slash`` run (arXiv 2601.08297) from its summary: ``heads`` (per
    head ``layer``, ``head``, ``best_delta``, ``best_score``, rank measures, decomposition),
    ``kappas``, ``delta_range``, ``persistence``, ``persist_kappa``, ``seq_len``."""
    out: list[str] = []
    heads = [h for h in summary.get("heads") or [] if isinstance(h, dict) and num(h.get("best_score")) is not None]
    kappas = [k for k in summary.get("kappas") or [] if num(k) is not None]
    if not heads:
        return out
    lo = (summary.get("delta_range") or [1])[0]
    S = int(num(summary.get("seq_len")) or 0)
    best = max(heads, key=lambda r: r["best_score"])
    base = uniform_slash(S, int(best["best_delta"])) if S else float("nan")
    out.append(f"The most slash-dominant head (Δ ≥ {lo}) is layer {best['layer']} head {best['head']} with "
               f"SlashScore({best['best_delta']}) = {fmt(best['best_score'])}"
               + (f" (uniform causal attention would give about {fmt(base)})." if math.isfinite(base) else "."))
    if kappas:
        reached = [(k, sum(1 for r in heads if r["best_score"] >= k)) for k in kappas]
        reached = [(k, n) for k, n in reached if n]
        if reached:
            k, n = reached[-1]
            out.append(f"{n} of {len(heads)} heads are ({fmt(k)}, Δ)-slash-dominant for some Δ in the range (the "
                       f"largest κ of the grid that any head reaches); at κ = {fmt(reached[0][0])}: {reached[0][1]}.")
        else:
            out.append(f"No head reaches κ = {fmt(kappas[0])} at any Δ in the range.")
    pers = summary.get("persistence")
    pk = summary.get("persist_kappa")
    if isinstance(pers, list):
        if pers:
            kept = sum(bool(p.get("persists")) for p in pers)
            ratios = sorted(num(p.get("ratio")) or 0.0 for p in pers)
            out.append(f"{kept} of {len(pers)} in-distribution ({fmt(pk)}, Δ)-SDHs persist on random-token prompts "
                       f"(median ratio random / in-distribution {fmt(ratios[len(ratios) // 2])}).")
            d1 = [p for p in pers if p.get("delta") == 1 and p.get("persists")]
            if d1:
                p = d1[0]
                out.append(f"Previous-token head: layer {p['layer']} head {p['head']}, SlashScore(1) "
                           f"{fmt(num(p['score_in']))} in distribution, {fmt(num(p['score_random']))} on random tokens.")
        else:
            out.append(f"No head reaches κ = {fmt(pk)} in distribution, so persistence is untested.")
    top = sorted(heads, key=lambda r: -r["best_score"])[: max(1, len(heads) // 10)]
    top_dec = [r for r in top if "predicted_peak" in r]
    if top_dec:
        m = sum(bool(r.get("peak_match")) for r in top_dec)
        q1 = sum(num(r.get("q_top1_energy")) or 0.0 for r in top) / len(top)
        rest = [r for r in heads if r not in top]
        q1r = sum(num(r.get("q_top1_energy")) or 0.0 for r in rest) / len(rest) if rest else None
        out.append(f"For the top {len(top)} slash heads the rank-one RoPE decomposition predicts the observed peak "
                   f"offset in {m} of {len(top_dec)}; their pre-RoPE queries put {fmt(q1)} of the energy in the top "
                   f"singular direction (other heads: {fmt(q1r)}).")
        bands = [b for b in (top_dec[0].get("band_usage") or {})]
        if bands:
            use = {b: sum(num((r.get("band_usage") or {}).get(b)) or 0.0 for r in top_dec) / len(top_dec)
                   for b in bands}
            out.append("Band usage (share of Σ A_l) of the top slash heads: "
                       + ", ".join(f"{b} {fmt(v)}" for b, v in use.items()) + ".")
    elif not any("predicted_peak" in r for r in heads):
        out.append("The scanned layers apply no RoPE, so there is no RoPE decomposition.")
    return out


def dynamics_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens slash-dynamics`` run from ``steps`` (per snapshot ``step``,
    ``accuracy`` and ``best``: the most slash-dominant head with ``slash_in``, ``slash_random``,
    ``q_top1``, ``k_top1``, ``band_usage``, ``predicted_peak``) and ``config`` (``delta``, ``kappa``)."""
    recs = [r for r in summary.get("steps") or [] if isinstance(r, dict) and isinstance(r.get("best"), dict)]
    if not recs:
        return []
    cfg = summary.get("config") or {}
    delta, kappa = cfg.get("delta"), num(cfg.get("kappa"))
    first, last = recs[0], recs[-1]
    b0, b1 = first["best"], last["best"]
    out = [f"SlashScore({delta}) of the best head rises from {fmt(num(b0['slash_in']))} at step {first['step']} to "
           f"{fmt(num(b1['slash_in']))} at step {last['step']} (task accuracy {fmt(num(last.get('accuracy')))})."]
    if kappa is not None:
        emerge = next((r["step"] for r in recs if (num(r["best"].get("slash_in")) or 0.0) >= kappa), None)
        out.append(f"A ({fmt(kappa)}, {delta})-slash-dominant head first appears at step {emerge}."
                   if emerge is not None else f"No head reaches SlashScore({delta}) ≥ {fmt(kappa)} within "
                   f"{last['step']} steps.")
        rand = num(b1.get("slash_random"))
        if rand is None:
            out.append(f"The final head (layer {b1['layer']} head {b1['head']}) has no random-token score: "
                       "persistence out of distribution is untested.")
        else:
            verdict = "persists" if rand >= kappa else "does not persist"
            out.append(f"On random-token prompts the final head (layer {b1['layer']} head {b1['head']}) scores "
                       f"{fmt(rand)} at Δ = {delta}: the SDH {verdict} out of distribution (κ = {fmt(kappa)}).")
    out.append(f"Its pre-RoPE queries' top singular direction holds {fmt(num(b0.get('q_top1')))} of the energy at step "
               f"{first['step']} and {fmt(num(b1.get('q_top1')))} at the end (keys: {fmt(num(b0.get('k_top1')))} → "
               f"{fmt(num(b1.get('k_top1')))}).")
    bu = {k: num(v) or 0.0 for k, v in (b1.get("band_usage") or {}).items()}
    if bu:
        top_band = max(bu, key=bu.get)
        out.append(f"At the end the rank-one RoPE decomposition puts most amplitude in the {top_band}-frequency band "
                   f"({', '.join(f'{b} {fmt(v)}' for b, v in bu.items())}) and predicts a peak at "
                   f"Δ = {b1.get('predicted_peak')}.")
    return out


def sweep_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens sweep`` run (random-init NoPE models against the init σ) from
    ``results``: per shape and σ, ``aps_causal_mean`` (and ``aps_bidirectional_mean``), one value
    per entry of ``layer_index`` (the embeddings, then decoder layers from 0)."""
    out: list[str] = []
    by_shape: dict[str, list[dict]] = {}
    for r in summary.get("results") or []:
        if isinstance(r, dict) and isinstance(r.get("aps_causal_mean"), list) and len(r["aps_causal_mean"]) > 1:
            by_shape.setdefault(str(r.get("shape")), []).append(r)
    for shape, recs in by_shape.items():
        sig = [r.get("sigma") for r in recs]
        a1 = [num(r["aps_causal_mean"][1]) for r in recs]
        fin = [(s, a) for s, a in zip(sig, a1) if a is not None]
        if not fin:
            continue
        lo, hi = min(fin, key=lambda t: t[1]), max(fin, key=lambda t: t[1])
        strong = [fmt(s) for s, a in fin if a >= ADJACENT]
        text = (f"{shape}: APS of decoder layer 0 (causal) ranges from {fmt(lo[1])} (σ = {fmt(lo[0])}) to "
                f"{fmt(hi[1])} (σ = {fmt(hi[0])}); ")
        text += (f"a clear adjacency pattern (APS ≥ {ADJACENT}) at σ ∈ {{{', '.join(strong)}}}." if strong
                 else f"no σ gives a clear adjacency pattern (APS ≥ {ADJACENT}).")
        out.append(text)
        if len(recs[0]["aps_causal_mean"]) > 2:
            deep = [num(r["aps_causal_mean"][-1]) for r in recs]
            out.append(f"{shape}: in the last decoder layer ({len(recs[0]['aps_causal_mean']) - 2}) APS is "
                       f"{', '.join(fmt(v) for v in deep)} for σ = {', '.join(fmt(s) for s in sig)}.")
    bid = [num(v) for recs in by_shape.values() for r in recs for v in (r.get("aps_bidirectional_mean") or [])[1:]]
    bid = [v for v in bid if v is not None]
    if bid:
        dev = max(abs(v - 0.5) for v in bid)
        out.append(f"Without the causal mask no decoder layer of any model departs from chance (0.5) by more than "
                   f"{fmt(dev)} in mean APS" + (": the pattern comes from the mask." if dev < 0.1 else
                                                 "; something other than the mask orders the vectors."))
    return out


def probes_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens probes`` run from ``verdicts`` (per model and state: best test r of
    the cosine and norm probes, their layers, how many decoder layers the cosine wins on MSE) and
    ``records`` (per layer, feature and probe: test ``r``)."""
    out: list[str] = []
    recs = [r for r in summary.get("records") or [] if isinstance(r, dict)]
    for v in summary.get("verdicts") or []:
        if not isinstance(v, dict):
            continue
        model, state, verdict = v.get("model"), v.get("state"), v.get("cosine_beats_norm")
        out.append(f"{model} ({v.get('pe')} PE, {state}): cos(h_i, h_T) predicts T − i with r up to "
                   f"{fmt(num(v.get('cosine_best_r')))} (layer {v.get('cosine_best_layer')}), the norm with r up to "
                   f"{fmt(num(v.get('norm_best_r')))} (layer {v.get('norm_best_layer')}); the cosine has the lower "
                   f"test MSE in {v.get('cosine_lower_mse_layers')} of {v.get('layers')} decoder layers (MLP probes, "
                   "held-out characters)"
                   + {"yes": ": cosine beats the norm.", "no": ": cosine does not beat the norm.",
                      "mixed": ": the two criteria disagree."}.get(verdict, "."))
        vec = [x for x in recs if x.get("model") == model and x.get("state") == state and x.get("feature") == "vector"
               and x.get("probe") == "linear" and isinstance(x.get("layer"), int) and num(x.get("r")) is not None]
        if vec:
            bv = max(vec, key=lambda x: num(x["r"]))
            out.append(f"{model} ({state}): a linear probe on the vector h_i recovers the absolute position with "
                       f"r = {fmt(num(bv['r']))} at layer {bv['layer']} on unseen characters.")
    return out


#: the readings of each analysis command, from its summary (the report and the commands share them)
COMMAND_READINGS = {
    "neighborhood": neighborhood_command_readings,
    "panels": panels_readings,
    "kim-maps": score_maps_readings,
    "slash": slash_command_readings,
    "slash-dynamics": dynamics_readings,
    "sweep": sweep_readings,
    "probes": probes_readings,
}


def command_readings(command: str, summary: dict) -> list[str] | None:
    """The readings of an analysis command's summary, or None for a command without its own."""
    maker = COMMAND_READINGS.get(command)
    return None if maker is None else maker(summary)


# --------------------------------------------------------------------------------------------
# one run's readings for one paper, whatever command wrote it
# --------------------------------------------------------------------------------------------
def noise_phrase(layers: list[dict]) -> str:
    """What "flat" was judged against in these layers ("" where they carry no noise estimate)."""
    layers = [l for l in layers if isinstance(l, dict)]
    groups = [int(num(l.get("noise_groups"))) for l in layers if num(l.get("noise_groups")) is not None]
    base = "Monte Carlo noise" if any(num(l.get("max_stderr")) is not None for l in layers) else ""
    pos = [int(num(l.get("noise_positions"))) for l in layers if num(l.get("noise_positions")) is not None]
    on = f", on a {max(pos)}-position grid" if pos and any(str(k).startswith("grid_") for l in layers for k in l) \
        else ""
    if groups and max(groups) >= 2:
        return f"{base or 'sampling noise'} (the noise floor of {max(groups)} independent groups of samples{on})"
    return base


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


# --------------------------------------------------------------------------------------------
# the papers, in a sentence or three each (the report's section introductions)
# --------------------------------------------------------------------------------------------
PAPERS: dict[str, dict[str, str]] = {
    "kim": {
        "title": "Causal mask and RoPE: where attention scores get position",
        "short": "Causal mask and RoPE",
        "ref": "arXiv 2509.21042",
        "intro": (
            "The causal mask alone, with no parameters and inputs that carry no order, makes attention scores "
            "depend on position from the second layer on, favouring nearby keys; combined with RoPE it turns "
            "RoPE's purely relative pattern (a function of the distance i − j) into a non-relative one. Heat "
            "maps have query positions as rows and key positions as columns; the blank upper triangle is "
            "masked. Numbers: the relativity index (1 = the map depends on i − j alone; 'flat' = no "
            "positional variation beyond noise; key 0, the attention sink, left out, the value with it beside), "
            "the signed trend along the diagonals (+1 = the entry further right is higher) and the locality "
            "(+1 = every query's scores rise as the key gets closer, 0 = no trend). Decoder layers count from 0."
        ),
    },
    "slash": {
        "title": "Slash-dominant heads and RoPE",
        "short": "Slash-dominant heads",
        "ref": "arXiv 2601.08297",
        "intro": (
            "Slash-dominant heads put most of their attention on one sub-diagonal: the token Δ positions back, "
            "for every query. SlashScore(Δ) is the mean attention weight on that sub-diagonal; heads are sought "
            f"at Δ = 1 … {SLASH_MAX_DELTA} (larger offsets reach the first tokens, where attention sinks put their "
            "weight). The paper explains them by nearly rank-one pre-RoPE queries and keys combined with RoPE's "
            "medium and high frequencies; the top-1 energy of the queries' singular values measures the first "
            "condition (1 = rank one). Heads are named by decoder layer (from 0) and head index."
        ),
    },
    "neighborhood": {
        "title": "Position without positional encoding: similarity of nearby embeddings",
        "short": "Similarity of nearby embeddings",
        "ref": "arXiv 2501.00073",
        "intro": (
            "In causal transformers without positional encoding, hidden vectors of nearby tokens are more "
            "cosine-similar than distant ones, already after the first attention layer and even at random "
            "initialisation. The adjacency probability score (APS) is the fraction of position triples "
            "j < k < i where token i is more similar to the nearer token k, computed per sequence and "
            "averaged (0.5 = chance, 1 = similarity rises monotonically towards each token). A scan's "
            "'mean-map APS' is the same count on the cosine map averaged over sequences: it tends to 1 for "
            "any consistent trend as sequences are added and has no chance level. Layers: the embeddings by "
            "name, then decoder layers from 0."
        ),
    },
}
