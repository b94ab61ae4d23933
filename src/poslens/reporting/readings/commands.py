"""Readings of the analysis commands (:data:`COMMAND_READINGS`), each rendered from its command's
judgement (:mod:`poslens.metrics.judge.commands`): the summary's ``judgement``, else the judge's
reading of its numbers."""

from __future__ import annotations

from poslens.conventions import ADJACENT, NORM_SHRINK
from poslens.fmt import fmt
from poslens.reporting.readings.ablate import ablate_readings
from poslens.reporting.readings.compare import compare_readings
from poslens.reporting.readings.fingerprint import fingerprint_readings
from poslens.metrics.judge.commands import command_judgement
from poslens.reporting.readings.common import _series_short, _span

#: the sentences of the codes (:mod:`poslens.metrics.judge.commands`)
ADJACENCY = {"clear": "a clear adjacency pattern", "weak": "a weak adjacency pattern", "none": "no adjacency pattern"}
MASK = {"creates": "the mask is what creates the head outputs' adjacency pattern.",
        "partial": "the mask is not the only source of the difference.",
        "little": "the mask makes little difference here."}
NORM = {"shrink": "norms shrink with position, as running means do",
        "flat": "norms do not change consistently with position", "grow": "norms grow with position"}
THEORY = {"close": " (close: attention is nearly uniform).", "far": " (attention is far from uniform)."}
TREND_WORDS = {"nearby": "favour nearby keys", "distant": "favour distant keys", "none": "show little distance trend"}
PERSISTS = {"persists": "persists", "transient": "does not persist"}
PROBE_VERDICT = {"yes": ": cosine beats the norm.", "no": ": cosine does not beat the norm.",
                 "mixed": ": the two criteria disagree."}
SWEEP_MASK = {"creates": ": the pattern comes from the mask.",
              "other": "; something other than the mask orders the vectors."}


def neighborhood_command_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens neighborhood`` run (arXiv 2501.00073) from its judgement
    (:func:`poslens.metrics.judge.commands.judge_neighborhood`)."""
    j = command_judgement("neighborhood", summary)
    if not j:
        return []
    L, a1, emb = j["layer"], j["aps"], j.get("embeddings_aps")
    out = [f"The head outputs of the first decoder layer (layer {L}) have APS {fmt(a1)} under the "
           f"causal mask: {ADJACENCY[j['adjacency']]} (0.5 = chance, 1 = every row rises towards the diagonal)"
           + (f"; the embeddings have {fmt(emb)}." if emb is not None else ".")]
    if "best_layer" in j:
        out.append(f"The head outputs' highest APS is in layer {j['best_layer']} ({fmt(j['best_aps'])}); the last "
                   f"layer ({j['last_layer']}) has {fmt(j['last_aps'])}.")
    if "mask" in j:
        diff = j["mask_drop"]
        out.append(f"Without the causal mask the APS of layer {L}'s head outputs is {fmt(j['bidirectional_aps'])}, "
                   f"{fmt(abs(diff))} "
                   f"{'lower' if diff > 0 else 'higher'} than causal: " + MASK[j["mask"]])
    if "norm" in j:
        out.append(f"Layer {L}'s norm score is {fmt(j['norm_score'])}: {NORM[j['norm']]} (≥ {NORM_SHRINK} = shrink, "
                   f"≤ {fmt(1 - NORM_SHRINK)} = grow).")
    if "theory" in j:
        out.append(f"Layer {L}'s mean cosine map differs from the uniform-attention theory "
                   f"sqrt(min(i, j) / max(i, j)) by {fmt(j['theory_gap'])} on average over the lower triangle"
                   + THEORY[j["theory"]])
    return out


def panels_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens panels`` run (arXiv 2509.21042's nine-panel Gram decomposition) from its
    judgement (:func:`poslens.metrics.judge.commands.judge_panels`)."""
    j = command_judgement("panels", summary) or {}
    out: list[str] = []
    if "panels" in j:
        hi, lo = j["strongest"], j["weakest"]
        out.append(f"{j['rising']} of {j['panels']} panels of decoder layer {j['layer']} rise towards the diagonal "
                   f"(locality > 0); strongest in ({hi['panel']}) at {fmt(hi['locality'])}, weakest in "
                   f"({lo['panel']}) at {fmt(lo['locality'])}.")
    if "non_relativity" in j:
        nr, ws = j["non_relativity"], j.get("with_sink")
        text = (f"Non-relativity (1 − relativity index, key 0 excluded) goes from {fmt(nr['a'])} in "
                f"the layer's normalised input (a) to {fmt(nr['i'])} in the next layer's scores (i)")
        if ws:
            text += f"; with key 0: {fmt(ws['a'])} → {fmt(ws['i'])}"
        out.append(text + ".")
    if "trend" in j:
        out.append(f"The layer's own attention scores (b) {TREND_WORDS[j['trend']]} (locality {fmt(j['b_locality'])}).")
    return out


def score_maps_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens kim-maps`` run (per-layer score maps of a scan) from its judgement
    (:func:`poslens.metrics.judge.commands.judge_score_maps`)."""
    j = command_judgement("kim-maps", summary) or {}
    out: list[str] = []
    if "lowest" in j:
        lo, hi, pct = j["lowest"], j["highest"], j["explained_pct"]
        out.append(f"Non-relativity (key 0 excluded) ranges from {fmt(lo['non_relativity'])} (layer {lo['layer']}) to "
                   f"{fmt(hi['non_relativity'])} (layer {hi['layer']}): the diagonals explain {fmt(pct[0])} … "
                   f"{fmt(pct[1])} % of the score maps' variation.")
        if j.get("with_sink"):
            out.append(f"With key 0 (the attention sink column) included, non-relativity reads "
                       f"{_span(j['with_sink'])}.")
    if "layers" in j:
        out.append(f"{j['rising']} of {j['layers']} layers' mean scores rise as keys approach the query "
                   f"(mean locality {fmt(j['mean_locality'])}).")
    if j.get("sink_weight"):
        out.append(f"Attention weight on key 0 (the sink), per layer: {_series_short(j['sink_weight'])}.")
    return out


def slash_command_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens slash`` run (arXiv 2601.08297) from its judgement
    (:func:`poslens.metrics.judge.commands.judge_slash`)."""
    j = command_judgement("slash", summary)
    if not j:
        return []
    b = j["best"]
    out = [f"The head that puts the most weight on one sub-diagonal (offset ≥ {j['min_delta']} back) is layer "
           f"{b['layer']}, head {b['head']}, with "
           f"SlashScore({b['delta']}) = {fmt(b['score'])}"
           + (f" (uniform causal attention would give about {fmt(b['uniform'])})." if b.get("uniform") is not None
              else ".")]
    if "kappas" in j:
        reached = j["kappas"]["reached"]
        if reached:
            k, n = reached[-1]["kappa"], reached[-1]["heads"]
            low, n0 = reached[0]["kappa"], reached[0]["heads"]
            out.append(f"{n} of {j['heads']} heads put a mean weight of at least {fmt(k)} on one offset back, for "
                       f"every query, at some offset in the range; {fmt(k)} is the highest threshold of the grid "
                       "that any head reaches" + (f" (at the lowest, {fmt(low)}: {n0} heads)." if low != k else "."))
        else:
            out.append(f"No head puts a mean weight of {fmt(j['kappas']['first'])} on any one offset in the range.")
    p = j.get("persistence")
    if p is not None:
        if p["tested"]:
            out.append(f"{p['persist']} of the {p['tested']} heads with a SlashScore of at least {fmt(p['kappa'])} in "
                       f"distribution keep it on random-token prompts (median ratio random / in-distribution "
                       f"{fmt(p['median_ratio'])}).")
            t = p.get("previous_token")
            if t:
                out.append(f"Previous-token head: layer {t['layer']} head {t['head']}, SlashScore(1) "
                           f"{fmt(t['score_in'])} in distribution, {fmt(t['score_random'])} on random tokens.")
        else:
            out.append(f"No head reaches a SlashScore of {fmt(p['kappa'])} in distribution, so persistence is "
                       "untested.")
    d = j.get("decomposition")
    if d:
        out.append(f"For the top {d['top']} slash heads the rank-one RoPE decomposition predicts the observed peak "
                   f"offset in {d['peak_matches']} of {d['tested']}; their pre-RoPE queries put {fmt(d['q_top1'])} of "
                   f"the energy in the top singular direction (other heads: {fmt(d['q_top1_other'])}).")
        if d.get("band_usage"):
            out.append("Band usage (share of Σ A_l) of the top slash heads: "
                       + ", ".join(f"{k} {fmt(v)}" for k, v in d["band_usage"].items()) + ".")
    elif not j.get("rope"):
        out.append("The scanned layers apply no RoPE, so there is no RoPE decomposition.")
    return out


def dynamics_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens slash-dynamics`` run from its judgement
    (:func:`poslens.metrics.judge.commands.judge_dynamics`)."""
    j = command_judgement("slash-dynamics", summary)
    if not j:
        return []
    delta, kappa, h = j["delta"], j["kappa"], j["head"]
    out = [f"SlashScore({delta}) of the best head rises from {fmt(j['slash_first'])} at step {j['first_step']} to "
           f"{fmt(j['slash_last'])} at step {j['last_step']} (task accuracy {fmt(j['accuracy'])})."]
    if "emergence" in j:
        out.append(f"A head with SlashScore({delta}) ≥ {fmt(kappa)} first appears at step {j['emerged_at']}."
                   if j["emergence"] == "emerged" else f"No head reaches SlashScore({delta}) ≥ {fmt(kappa)} within "
                   f"{j['last_step']} steps.")
        if j["persistence"] == "untested":
            out.append(f"The final head (layer {h['layer']} head {h['head']}) has no random-token score: "
                       "persistence out of distribution is untested.")
        else:
            out.append(f"On random-token prompts the final head (layer {h['layer']} head {h['head']}) scores "
                       f"{fmt(j['slash_random'])} at Δ = {delta}: the SDH {PERSISTS[j['persistence']]} out of "
                       f"distribution (κ = {fmt(kappa)}).")
    q, k = j["q_top1"], j["k_top1"]
    out.append(f"Its pre-RoPE queries' top singular direction holds {fmt(q[0])} of the energy at step "
               f"{j['first_step']} and {fmt(q[1])} at the end (keys: {fmt(k[0])} → {fmt(k[1])}).")
    if j.get("band_usage"):
        out.append(f"At the end the rank-one RoPE decomposition puts most amplitude in the {j['top_band']}-frequency "
                   f"band ({', '.join(f'{b} {fmt(v)}' for b, v in j['band_usage'].items())}) and predicts a peak at "
                   f"Δ = {j['predicted_peak']}.")
    return out


def sweep_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens sweep`` run (random-init NoPE models against the init σ) from its
    judgement (:func:`poslens.metrics.judge.commands.judge_sweep`)."""
    j = command_judgement("sweep", summary) or {}
    out: list[str] = []
    for r in j.get("shapes") or []:
        lo, hi, shape = r["lowest"], r["highest"], r["shape"]
        text = (f"{shape}: APS of decoder layer 0's head outputs (causal) ranges from {fmt(lo['aps'])} (σ = {fmt(lo['sigma'])}) to "
                f"{fmt(hi['aps'])} (σ = {fmt(hi['sigma'])}); ")
        text += (f"a clear adjacency pattern (APS ≥ {ADJACENT}) at σ ∈ "
                 f"{{{', '.join(fmt(s) for s in r['clear_sigmas'])}}}." if r["adjacency"] == "clear"
                 else f"no σ gives a clear adjacency pattern (APS ≥ {ADJACENT}).")
        out.append(text)
        deep = r.get("last_layer")
        if deep:
            out.append(f"{shape}: in the last decoder layer ({deep['layer']}) the head outputs' APS is "
                       f"{', '.join(fmt(v) for v in deep['aps'])} for "
                       f"σ = {', '.join(fmt(s) for s in deep['sigmas'])}.")
    if "mask" in j:
        out.append(f"Without the causal mask no decoder layer of any model departs from chance (0.5) by more than "
                   f"{fmt(j['bidirectional_dev'])} in the head outputs' mean APS" + SWEEP_MASK[j["mask"]])
    return out


def probes_readings(summary: dict) -> list[str]:
    """Sentences on a ``poslens probes`` run from its judgement
    (:func:`poslens.metrics.judge.commands.judge_probes`)."""
    j = command_judgement("probes", summary) or {}
    out: list[str] = []
    for v in j.get("verdicts") or []:
        model, state = v["model"], v["state"]
        out.append(f"{model} ({v['pe']} PE, {state}): cos(h_i, h_T) predicts T − i with r up to "
                   f"{fmt(v['cosine_best_r'])} (layer {v['cosine_best_layer']}), the norm with r up to "
                   f"{fmt(v['norm_best_r'])} (layer {v['norm_best_layer']}); the cosine has the lower "
                   f"test MSE in {v['cosine_lower_mse_layers']} of {v['layers']} decoder layers (MLP probes, "
                   "held-out characters)" + PROBE_VERDICT.get(v["cosine_beats_norm"], "."))
        if v.get("vector"):
            out.append(f"{model} ({state}): a linear probe on the vector h_i recovers the absolute position with "
                       f"r = {fmt(v['vector']['r'])} at layer {v['vector']['layer']} on unseen characters.")
    return out


def omitted_offsets_reading(deltas: list) -> str:
    """The terminal's note on the offsets ``deltas`` (in order) that end the slash run's first table
    where no head is slash-dominant at any κ of the grid, and that the terminal leaves out."""
    gone = f"Δ {deltas[0]}–{deltas[-1]}" if len(deltas) > 1 else f"Δ {deltas[-1]}"
    return f"{gone}: no slash-dominant head at any κ of the grid (not listed in the first table)."


#: the readings of each analysis command, from its judgement (the report and the commands share them)
COMMAND_READINGS = {
    "ablate": ablate_readings,
    "compare": compare_readings,
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
