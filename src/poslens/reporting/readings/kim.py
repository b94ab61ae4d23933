"""Readings of the causal-mask/RoPE measures (arXiv 2509.21042): relativity, locality, diagonal trends,
the noise floor, on any run's per-layer numbers."""

from __future__ import annotations


from poslens.conventions import NOISE_P
from poslens.fmt import fmt
from poslens.metrics.judge.papers import judge_kim
from poslens.reporting.readings.notes import noise_note
from poslens.reporting.readings.common import _count_phrase, _layers_phrase, _pct_span, _series_short, f2, few_phrase


def _kim_flat(j: dict, noise: str) -> list[str]:
    """The sentence naming the flat layers (none when there are none)."""
    flat, live = j["flat"], j["live"]
    if not flat:
        return []
    within = f" within {noise}" if noise else ""
    verb = "is" if len(flat) == 1 else "are"
    if len(flat) > 6 and live and len(live) <= 3:  # many flat layers: name the few that are not
        who = (f"All {j['count']} layers but {_layers_phrase(live)[7:]} ({len(flat)} of {j['count']})"
               if len(live) > 1 else f"All {j['count']} layers but layer {live[0]} ({len(flat)} of {j['count']})")
        verb = "are"
    else:
        who = _layers_phrase(flat).capitalize()
    return [f"{who} {verb} flat{within}: there the attention scores carry no information about position."]


def _kim_series(j: dict, noise: str) -> list[str]:
    """The per-layer relativity index and locality of the layers that are not flat."""
    s, live = j["series"], j["live"]
    where = f"from layer {live[0]} on" if s["tail"] else f"in {_layers_phrase(live)}"
    # "depend on position" only where flatness could have been found
    claim = " the scores depend on position:" if noise and s["testable"] else ""
    what = "relativity index (key 0 excluded)" if s["sink"] else "relativity index"
    if s["corrected"]:
        what = "noise-corrected " + what
    out = [f"{where[0].upper()}{where[1:]}{claim} {what} {_series_short(s['relativity'])} "
           f"(1 = a function of the distance i − j alone) and locality {_series_short(s['locality'])} "
           "(+1 = every query's scores rise as the key gets closer)."]
    if not noise:
        out.append("These maps carry no standard errors: with few sequences, small values may be sampling noise.")
    return out


def _kim_locality(loc: dict) -> list[str]:
    """Whether the layers favour nearby or distant keys."""
    if loc["code"] == "near":
        return ["Every such layer favours nearby keys: scores rise as the key approaches the query."]
    if loc["code"] == "far":
        return ["Scores fall as the key approaches the query: distant keys are favoured."]
    if loc["code"] == "some":
        strong, every = loc["strong"], loc.get("layers") or []
        rest = [l for l in every if l not in strong]
        if rest and len(strong) > max(len(rest), 6):  # a list too long to write out: name the exceptions
            return [(f"The preference for nearby or distant keys is clear in {len(strong)} of {len(every)} layers, "
                     f"all but {_layers_phrase(rest)}.")]
        return [f"The preference for nearby or distant keys is clear only in {_layers_phrase(strong)}."]
    if loc["code"] == "none":
        return [f"No layer shows a clear trend with distance (|locality| ≤ {loc['threshold']})."]
    return []


def _kim_relativity(r: dict) -> list[str]:
    """What the relativity index says: purely relative layers, how much depends on absolute position, or
    that the lower values are not beyond sampling noise."""
    which = "noise-corrected relativity" if r["corrected"] else "relativity"
    if r["code"] == "noise":
        return [f"The {which} index is as low as {f2(r['low'])} (layer {r['low_layer']}), but in no "
                f"layer is the departure from a purely relative map beyond sampling noise (p of \"purely "
                f"relative\" ≥ {NOISE_P} in all {r['tested']}): the data do not show a non-relative pattern."]
    if r["code"] == "drop":
        return [f"Layer {r['first_layer']} is purely relative ({which} {f2(r['first'])}); later layers drop "
                f"to {f2(r['drop'])} (layer {r['drop_layer']}): position matters beyond the distance i − j, "
                "a non-relative pattern that the diagonal-normalised figure makes visible."]
    if r["code"] == "relative":
        return [f"All of them are purely relative ({which} ≥ {r['threshold']}): each diagonal is constant and the "
                "diagonal-normalised maps are flat."]
    if r["code"] == "partial":
        return [f"Up to {f2(r['unexplained'])} of the variation is not explained by the distance alone ({which} index "
                f"{f2(r['low'])}): the maps also "
                "depend on absolute position (diagonal-normalised figure: what remains after removing each "
                "diagonal's mean)."]
    return []


def _kim_diagonal_trend(t: dict | None) -> list[str]:
    """The signed trend along the diagonals, its sign read only where it is beyond noise."""
    if t is None:
        return []
    where = (f"every diagonal in the {t['significant']} layer(s) where the trend is significant (p < {NOISE_P})"
             if t["subset"] else "every diagonal")
    sign = {"none": "shows no significant trend in any layer",
            "rises": f"rises to the right on {where} (left columns lower)",
            "falls": f"falls to the right on {where} (left columns higher)",
            "mixed": "changes sign between layers"}[t["code"]]
    return [f"Signed trend along the diagonals (+1 = the entry further right on each diagonal is higher): "
            f"{_series_short(t['values'])}; the score {sign}."]


def _kim_noise(n: dict) -> list[str]:
    """The noise floor of a scan's numbers: the grid statistics the p-values belong to, the share of
    the full map's within-diagonal variation that sampling noise alone gives (a scan's full-map index
    is not noise-corrected), and whether there are enough sequence groups to call anything."""
    out: list[str] = []
    grid = n["grid"]
    if grid:  # the p-values and standard errors describe the grid map's statistics, not the full map's
        tcount = _count_phrase(grid["counts"], "the trend is significant")
        out.append(f"The p-values and standard errors come from sample groups kept on a {grid['positions']}-position "
                   f"grid of the map; on that grid the trend reads {_series_short(grid['trend'])} and "
                   f"the noise-corrected relativity index {_series_short(grid['relativity'])}"
                   + (f"; {tcount}." if tcount else "."))
    if n["shares"]:
        out.append(f"The full-map relativity index is not noise-corrected: sampling noise alone accounts for "
                   f"{_pct_span(n['shares'])} % of the within-diagonal variation it counts against relativity "
                   "(noise floor of the diagonal-normalised map over its observed mean square).")
    few = few_phrase(n["groups"])
    if few:
        out.append(few[0].upper() + few[1:] + ".")
    return out


def _kim_extras(e: dict) -> list[str]:
    """The sink column's weight, and a simulation's agreement with the closed form."""
    out: list[str] = []
    if e["sink_weight"]:
        out.append(f"Attention weight on key 0 (the sink), per layer: {_series_short(e['sink_weight'])}; the "
                   "relativity index leaves that column out.")
    if e["theory_diff"] is not None:
        se = f" (largest standard error {fmt(e['stderr'])})" if e["stderr"] is not None else ""
        out.append(f"The exact closed form agrees with the simulation to within {fmt(e['theory_diff'])} in every "
                   f"layer{se}; the remaining gap shrinks as the dimension grows.")
    return out


def render_kim(j: dict, *, noise: str = "") -> list[str]:
    """The sentences of :func:`poslens.metrics.judge.papers.judge_kim`'s dict ``j``; ``noise`` names what
    "flat" is judged against ("Monte Carlo noise")."""
    out = []
    if j["missing"]:
        out = [f"No relativity index for {_layers_phrase(j['missing'])}: {noise_note(j['reason'])}."]
        if not j["count"]:
            return out
    out += _kim_flat(j, noise)
    if not j["live"]:
        return out
    return (out + _kim_series(j, noise) + _kim_locality(j["locality"]) + _kim_relativity(j["relativity"])
            + _kim_diagonal_trend(j["trend"]) + _kim_noise(j["noise"]) + _kim_extras(j["extras"]))


def kim_readings(layers: list[dict], *, noise: str = "") -> list[str]:
    """Sentences on per-layer relativity index and locality (arXiv 2509.21042): :func:`render_kim` of
    :func:`poslens.metrics.judge.papers.judge_kim` on ``layers``."""
    return render_kim(judge_kim(layers), noise=noise)
