"""Readings of the analysis commands, each written from the numbers its summary holds
(:data:`COMMAND_READINGS`)."""

from __future__ import annotations

import math

from poslens.conventions import (ADJACENT, ADJACENT_WEAK, NORM_SHRINK, PANEL_TREND, THEORY_CLOSE)
from poslens.fmt import fmt
from poslens.reporting.readings.ablate import ablate_readings
from poslens.reporting.readings.fingerprint import fingerprint_readings
from poslens.reporting.readings.common import _decoder_layers, _series_short, _span, num
from poslens.reporting.readings.neighborhood import norm_phrase
from poslens.reporting.readings.slash import uniform_slash


# --------------------------------------------------------------------------------------------
# readings of the analysis commands, each written from the numbers its summary holds
# --------------------------------------------------------------------------------------------
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
    "ablate": ablate_readings,
    "fingerprint": fingerprint_readings,
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
