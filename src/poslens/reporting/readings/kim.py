"""Readings of the causal-mask/RoPE measures (arXiv 2509.21042): relativity, locality, diagonal trends,
the noise floor, on any run's per-layer numbers."""

from __future__ import annotations


from poslens.conventions import (NOISE_P, RELATIVE,
                                 TREND)
from poslens.fmt import fmt
from poslens.reporting.readings.common import (_count_phrase, _layers_phrase, _pct_span, _series_short, _tested, f2,
                                               few_groups, noise_shares, num, smallest_p)


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
    # (smallest p not below NOISE_P) calls nothing flat
    p_min = smallest_p(live)[1]
    claim = " the scores depend on position:" if noise and (p_min is None or p_min < NOISE_P) else ""
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
                f"relative\" ≥ {NOISE_P} in all {tested}): the data do not show a non-relative pattern."]
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
        fin = [t for l, t in tested if num(l["trend_p"]) < NOISE_P]
        where = (f"every diagonal in the {len(fin)} layer(s) where the trend is significant (p < {NOISE_P})"
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
