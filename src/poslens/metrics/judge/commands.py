"""The judgements of the analysis commands (neighborhood, panels, kim-maps, slash, slash-dynamics,
sweep, probes): each reads the numbers of a command's summary and returns a dict of numbers and
short string codes (:data:`COMMAND_JUDGES`). The analyses write it into their summary under
``judgement``; :mod:`poslens.reporting.readings.commands` renders its sentences from it alone.

Codes: ``adjacency`` ``clear`` / ``weak`` / ``none`` (APS ≥ ADJACENT, ≥ ADJACENT_WEAK, below);
``mask`` ``creates`` / ``partial`` / ``little`` (the causal mask against the bidirectional control);
``norm`` ``shrink`` / ``flat`` / ``grow`` (NORM_SHRINK); ``theory`` ``close`` / ``far`` (THEORY_CLOSE);
``trend`` ``nearby`` / ``distant`` / ``none`` (PANEL_TREND); ``persistence`` ``persists`` /
``transient`` / ``untested``; ``emergence`` ``emerged`` / ``not_emerged``; a probe verdict's
``cosine_beats_norm`` ``yes`` / ``no`` / ``mixed`` (as ``poslens probes`` writes it).
"""

from __future__ import annotations

import math

from poslens.conventions import ADJACENT, ADJACENT_WEAK, MASK_MARGIN, NORM_SHRINK, PANEL_TREND, THEORY_CLOSE
from poslens.metrics.judge.papers import num
from poslens.metrics.verdicts import uniform_slash


def _decoder_layers(layers: list) -> tuple[dict | None, list[dict]]:
    """``(embeddings entry or None, decoder-layer entries in order)`` of a summary's ``layers``."""
    layers = [l for l in layers or [] if isinstance(l, dict)]
    emb = next((l for l in layers if l.get("layer") == "embeddings"), None)
    return emb, [l for l in layers if isinstance(l.get("layer"), int) and not isinstance(l.get("layer"), bool)]


#: SlashScore(d) of uniform causal attention over ``n`` tokens (:func:`poslens.metrics.slash.uniform_slash`)
uniform_slash_score = uniform_slash


def adjacency_code(aps: float) -> str:
    """``clear`` (APS ≥ ADJACENT), ``weak`` (≥ ADJACENT_WEAK) or ``none``."""
    return "clear" if aps >= ADJACENT else "weak" if aps >= ADJACENT_WEAK else "none"


def norm_code(v: float) -> str:
    """``shrink`` (norm score ≥ NORM_SHRINK), ``grow`` (≤ 1 − NORM_SHRINK) or ``flat``."""
    return "shrink" if v >= NORM_SHRINK else "flat" if v > 1 - NORM_SHRINK else "grow"


def judge_neighborhood(summary: dict) -> dict:
    """A ``poslens neighborhood`` run (arXiv 2501.00073) from its ``layers`` (the embeddings, then
    decoder layers from 0, with ``aps_mean``, ``norm_score_mean``, ``bidirectional_aps_mean``) and
    ``theory_gap_layer0``: the first decoder layer's APS and ``adjacency``, the highest and last
    layers' APS, the mask's effect, the norm score and the distance from the uniform-attention theory."""
    emb, dec = _decoder_layers(summary.get("layers"))
    dec = [l for l in dec if num(l.get("aps_mean")) is not None]
    if not dec:
        return {}
    first, last = dec[0], dec[-1]
    a1 = num(first["aps_mean"])
    out = {"layer": first["layer"], "aps": a1, "adjacency": adjacency_code(a1),
           "embeddings_aps": num(emb.get("aps_mean")) if emb else None}
    if len(dec) > 1:
        best = max(dec, key=lambda l: num(l["aps_mean"]))
        out.update(best_layer=best["layer"], best_aps=num(best["aps_mean"]), last_layer=last["layer"],
                   last_aps=num(last["aps_mean"]))
    b1 = num(first.get("bidirectional_aps_mean"))
    if b1 is not None:
        diff = a1 - b1
        out.update(bidirectional_aps=b1, mask_drop=diff,
                   mask="creates" if diff > MASK_MARGIN and abs(b1 - 0.5) < MASK_MARGIN
                   else "partial" if diff > MASK_MARGIN else "little")
    ns = num(first.get("norm_score_mean"))
    if ns is not None:
        out.update(norm_score=ns, norm=norm_code(ns))
    gap = num(summary.get("theory_gap_layer0"))
    if gap is not None:
        out.update(theory_gap=gap, theory="close" if gap < THEORY_CLOSE else "far")
    return out


def judge_panels(summary: dict) -> dict:
    """A ``poslens panels`` run (arXiv 2509.21042's nine panels of decoder layer ``summary["layer"]``)
    from ``panels`` (per panel ``panel``, ``locality``, ``non_relativity``, ``non_relativity_with_sink``):
    how many panels rise towards the diagonal, the strongest and weakest, non-relativity from panel (a)
    to (i), and panel (b)'s ``trend``."""
    rows = [r for r in summary.get("panels") or [] if isinstance(r, dict)]
    out: dict = {"layer": summary.get("layer")}
    loc = [(r["panel"], num(r.get("locality"))) for r in rows if num(r.get("locality")) is not None]
    if loc:
        hi = max(loc, key=lambda t: t[1])
        lo = min(loc, key=lambda t: t[1])
        out.update(rising=sum(1 for _, v in loc if v > 0), panels=len(loc),
                   strongest={"panel": hi[0], "locality": hi[1]}, weakest={"panel": lo[0], "locality": lo[1]})
    byk = {r.get("panel"): r for r in rows}
    a, i = byk.get("a"), byk.get("i")
    if a and i and num(a.get("non_relativity")) is not None and num(i.get("non_relativity")) is not None:
        out["non_relativity"] = {"a": num(a["non_relativity"]), "i": num(i["non_relativity"])}
        ws = [num(r.get("non_relativity_with_sink")) for r in (a, i)]
        if all(w is not None for w in ws):
            out["with_sink"] = {"a": ws[0], "i": ws[1]}
    b = byk.get("b")
    if b and num(b.get("locality")) is not None:
        v = num(b["locality"])
        out.update(b_locality=v, trend="nearby" if v > PANEL_TREND else "distant" if v < -PANEL_TREND else "none")
    return out


def judge_score_maps(summary: dict) -> dict:
    """A ``poslens kim-maps`` run from its decoder layers' ``non_relativity`` (key 0 excluded;
    ``non_relativity_with_sink`` beside it), ``locality`` and ``sink_weight``: the lowest and highest
    non-relativity with their layers, the share of variation the diagonals explain, how many layers'
    scores rise towards the query, and the sink's weight per layer."""
    _, dec = _decoder_layers(summary.get("layers"))
    out: dict = {}
    nr = [(l["layer"], num(l.get("non_relativity"))) for l in dec if num(l.get("non_relativity")) is not None]
    if nr:
        worst = max(nr, key=lambda t: t[1])
        best = min(nr, key=lambda t: t[1])
        out.update(lowest={"layer": best[0], "non_relativity": best[1]},
                   highest={"layer": worst[0], "non_relativity": worst[1]},
                   explained_pct=[100 * (1 - worst[1]), 100 * (1 - best[1])])
        ws = [num(l.get("non_relativity_with_sink")) for l in dec
              if num(l.get("non_relativity_with_sink")) is not None]
        if ws:
            out["with_sink"] = ws
    loc = [num(l.get("locality")) for l in dec if num(l.get("locality")) is not None]
    if loc:
        out.update(rising=sum(v > 0 for v in loc), layers=len(loc), mean_locality=sum(loc) / len(loc))
    sinkw = [num(l.get("sink_weight")) for l in dec if num(l.get("sink_weight")) is not None]
    if sinkw:
        out["sink_weight"] = sinkw
    return out


def judge_slash(summary: dict) -> dict:
    """A ``poslens slash`` run (arXiv 2601.08297) from ``heads`` (per head ``layer``, ``head``,
    ``best_delta``, ``best_score``, rank measures, decomposition), ``kappas``, ``delta_range``,
    ``persistence``, ``persist_kappa`` and ``seq_len``: the most slash-dominant head beside uniform
    attention, the heads reaching each κ, persistence on random tokens, and the rank-one RoPE
    decomposition of the top tenth of heads (``rope`` False where no scanned layer applies RoPE)."""
    heads = [h for h in summary.get("heads") or [] if isinstance(h, dict) and num(h.get("best_score")) is not None]
    kappas = [k for k in summary.get("kappas") or [] if num(k) is not None]
    if not heads:
        return {}
    S = int(num(summary.get("seq_len")) or 0)
    best = max(heads, key=lambda r: r["best_score"])
    base = uniform_slash_score(S, int(best["best_delta"])) if S else float("nan")
    out: dict = {"min_delta": (summary.get("delta_range") or [1])[0], "heads": len(heads),
                 "best": {"layer": best["layer"], "head": best["head"], "delta": best["best_delta"],
                          "score": best["best_score"], "uniform": base if math.isfinite(base) else None}}
    if kappas:
        reached = [(k, sum(1 for r in heads if r["best_score"] >= k)) for k in kappas]
        out["kappas"] = {"first": kappas[0], "reached": [{"kappa": k, "heads": n} for k, n in reached if n]}
    pers = summary.get("persistence")
    if isinstance(pers, list):
        p_out: dict = {"kappa": summary.get("persist_kappa"), "tested": len(pers)}
        if pers:
            ratios = sorted(num(p.get("ratio")) or 0.0 for p in pers)
            d1 = [p for p in pers if p.get("delta") == 1 and p.get("persists")]
            p_out.update(persist=sum(bool(p.get("persists")) for p in pers), median_ratio=ratios[len(ratios) // 2],
                         previous_token={"layer": d1[0]["layer"], "head": d1[0]["head"],
                                         "score_in": num(d1[0].get("score_in")),
                                         "score_random": num(d1[0].get("score_random"))} if d1 else None)
        out["persistence"] = p_out
    top = sorted(heads, key=lambda r: -r["best_score"])[: max(1, len(heads) // 10)]
    top_dec = [r for r in top if "predicted_peak" in r]
    if top_dec:
        rest = [r for r in heads if r not in top]
        bands = [b for b in (top_dec[0].get("band_usage") or {})]
        out["decomposition"] = {
            "top": len(top), "tested": len(top_dec), "peak_matches": sum(bool(r.get("peak_match")) for r in top_dec),
            "q_top1": sum(num(r.get("q_top1_energy")) or 0.0 for r in top) / len(top),
            "q_top1_other": sum(num(r.get("q_top1_energy")) or 0.0 for r in rest) / len(rest) if rest else None,
            "band_usage": {b: sum(num((r.get("band_usage") or {}).get(b)) or 0.0 for r in top_dec) / len(top_dec)
                           for b in bands}}
    out["rope"] = any("predicted_peak" in r for r in heads)
    return out


def judge_dynamics(summary: dict) -> dict:
    """A ``poslens slash-dynamics`` run from ``steps`` (per snapshot ``step``, ``accuracy`` and
    ``best``: the most slash-dominant head with ``slash_in``, ``slash_random``, ``q_top1``, ``k_top1``,
    ``band_usage``, ``predicted_peak``) and ``config`` (``delta``, ``kappa``): the best head's
    SlashScore at the first and last step, the step a (κ, Δ)-slash-dominant head appears
    (``emergence``), its ``persistence`` on random tokens, its rank-one-ness and its RoPE bands."""
    recs = [r for r in summary.get("steps") or [] if isinstance(r, dict) and isinstance(r.get("best"), dict)]
    if not recs:
        return {}
    cfg = summary.get("config") or {}
    kappa = num(cfg.get("kappa"))
    first, last = recs[0], recs[-1]
    b0, b1 = first["best"], last["best"]
    out: dict = {"delta": cfg.get("delta"), "kappa": kappa, "first_step": first["step"], "last_step": last["step"],
                 "slash_first": num(b0["slash_in"]), "slash_last": num(b1["slash_in"]),
                 "accuracy": num(last.get("accuracy")), "head": {"layer": b1.get("layer"), "head": b1.get("head")},
                 "q_top1": [num(b0.get("q_top1")), num(b1.get("q_top1"))],
                 "k_top1": [num(b0.get("k_top1")), num(b1.get("k_top1"))]}
    if kappa is not None:
        emerge = next((r["step"] for r in recs if (num(r["best"].get("slash_in")) or 0.0) >= kappa), None)
        rand = num(b1.get("slash_random"))
        out.update(emergence="emerged" if emerge is not None else "not_emerged", emerged_at=emerge,
                   slash_random=rand, persistence="untested" if rand is None
                   else "persists" if rand >= kappa else "transient")
    bu = {k: num(v) or 0.0 for k, v in (b1.get("band_usage") or {}).items()}
    if bu:
        out.update(band_usage=bu, top_band=max(bu, key=bu.get), predicted_peak=b1.get("predicted_peak"))
    return out


def judge_sweep(summary: dict) -> dict:
    """A ``poslens sweep`` run (random-init NoPE models against the init σ) from ``results`` (per
    shape and σ, ``aps_causal_mean`` and ``aps_bidirectional_mean``, one value per entry of
    ``layer_index``: the embeddings, then decoder layers from 0): per shape, decoder layer 0's lowest
    and highest APS over σ, the σ with a clear adjacency pattern (``adjacency``), the last decoder
    layer's APS per σ; without the mask, the largest departure from chance (``mask``)."""
    by_shape: dict[str, list[dict]] = {}
    for r in summary.get("results") or []:
        if isinstance(r, dict) and isinstance(r.get("aps_causal_mean"), list) and len(r["aps_causal_mean"]) > 1:
            by_shape.setdefault(str(r.get("shape")), []).append(r)
    shapes = []
    for shape, recs in by_shape.items():
        sig = [r.get("sigma") for r in recs]
        fin = [(s, a) for s, a in zip(sig, [num(r["aps_causal_mean"][1]) for r in recs]) if a is not None]
        if not fin:
            continue
        lo, hi = min(fin, key=lambda t: t[1]), max(fin, key=lambda t: t[1])
        clear = [s for s, a in fin if a >= ADJACENT]
        rec = {"shape": shape, "lowest": {"sigma": lo[0], "aps": lo[1]}, "highest": {"sigma": hi[0], "aps": hi[1]},
               "clear_sigmas": clear, "adjacency": "clear" if clear else "none"}
        if len(recs[0]["aps_causal_mean"]) > 2:
            rec["last_layer"] = {"layer": len(recs[0]["aps_causal_mean"]) - 2, "sigmas": sig,
                                 "aps": [num(r["aps_causal_mean"][-1]) for r in recs]}
        shapes.append(rec)
    out: dict = {"shapes": shapes}
    bid = [num(v) for recs in by_shape.values() for r in recs for v in (r.get("aps_bidirectional_mean") or [])[1:]]
    bid = [v for v in bid if v is not None]
    if bid:
        dev = max(abs(v - 0.5) for v in bid)
        out.update(bidirectional_dev=dev, mask="creates" if dev < MASK_MARGIN else "other")
    return out


def judge_probes(summary: dict) -> dict:
    """A ``poslens probes`` run from ``verdicts`` (per model and state: best test r of the cosine and
    norm probes, their layers, how many decoder layers the cosine wins on MSE, ``cosine_beats_norm``)
    and ``records`` (per layer, feature and probe: test ``r``): per verdict its numbers and code, and
    the best linear probe on the vector h_i (``vector``: ``r`` and ``layer``, or None)."""
    recs = [r for r in summary.get("records") or [] if isinstance(r, dict)]
    out = []
    for v in summary.get("verdicts") or []:
        if not isinstance(v, dict):
            continue
        model, state = v.get("model"), v.get("state")
        vec = [x for x in recs if x.get("model") == model and x.get("state") == state and x.get("feature") == "vector"
               and x.get("probe") == "linear" and isinstance(x.get("layer"), int) and num(x.get("r")) is not None]
        bv = max(vec, key=lambda x: num(x["r"])) if vec else None
        out.append({"model": model, "pe": v.get("pe"), "state": state, "cosine_beats_norm": v.get("cosine_beats_norm"),
                    "cosine_best_r": num(v.get("cosine_best_r")), "cosine_best_layer": v.get("cosine_best_layer"),
                    "norm_best_r": num(v.get("norm_best_r")), "norm_best_layer": v.get("norm_best_layer"),
                    "cosine_lower_mse_layers": v.get("cosine_lower_mse_layers"), "layers": v.get("layers"),
                    "vector": {"r": num(bv["r"]), "layer": bv["layer"]} if bv else None})
    return {"verdicts": out}


#: the judge of each analysis command, from its summary (the analyses and the readings share them)
COMMAND_JUDGES = {
    "neighborhood": judge_neighborhood,
    "panels": judge_panels,
    "kim-maps": judge_score_maps,
    "slash": judge_slash,
    "slash-dynamics": judge_dynamics,
    "sweep": judge_sweep,
    "probes": judge_probes,
}


def command_judgement(command: str, summary: dict) -> dict | None:
    """The judgement of an analysis command's summary: the one it holds (``judgement``), else judged
    from its numbers now; None for a command without a judge."""
    judge = COMMAND_JUDGES.get(command)
    if judge is None:
        return None
    held = summary.get("judgement")
    return held if isinstance(held, dict) else judge(summary)
