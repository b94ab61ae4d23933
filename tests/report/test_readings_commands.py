"""The readings of the analysis commands (neighbourhood, panels, score maps, slash, slash dynamics,
sweep, probes), of scans' APS and trained models, and the key findings: hand-built summaries with
numbers on both sides of each threshold. Each decision is checked on the judge's codes and numbers
(metrics/judge); one assertion per group checks that each code's sentence appears and quotes its numbers."""


from poslens.fmt import fmt

from poslens.conventions import ADJACENT, ADJACENT_WEAK, NORM_SHRINK, PANEL_TREND, SLASH_MAX_DELTA, THEORY_CLOSE
from poslens.metrics.judge.commands import COMMAND_JUDGES, judge_panels
from poslens.reporting.readings.commands import (COMMAND_READINGS, command_readings, dynamics_readings,
                                                 neighborhood_command_readings, omitted_offsets_reading,
                                                 panels_readings, probes_readings, score_maps_readings,
                                                 slash_command_readings, sweep_readings)
from poslens.reporting.readings.findings import comparison_readings, key_findings, model_readings, run_readings
from poslens.reporting.readings.neighborhood import neighborhood_readings
from poslens.metrics.judge.papers import (CLEAR_APS, FIRST_LAYER_RISE, GENERALISE_DROP, SLASH_RATIO, judge_model,
                                          judge_neighborhood, judge_slash, norm_trend)
from poslens.metrics.verdicts import uniform_slash
from poslens.reporting.readings.common import layer_aps
from poslens.reporting.readings.slash import slash_readings, slash_top


def test_thresholds():
    assert (ADJACENT, ADJACENT_WEAK, PANEL_TREND, THEORY_CLOSE) == (0.8, 0.6, 0.1, 0.05)
    assert (FIRST_LAYER_RISE, CLEAR_APS, NORM_SHRINK, GENERALISE_DROP, SLASH_RATIO) == (0.1, 0.6, 0.7, 0.3, 2.0)


# --------------------------------------------------------------------------------------------
# scans: APS. The decisions are asserted on judge_neighborhood's codes and numbers (fed the layers
# and APS neighborhood_readings feeds it); one assertion checks each code's sentence and its numbers.
# --------------------------------------------------------------------------------------------
def _jn(summary):
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict) and layer_aps(l)[0] is not None]
    return judge_neighborhood(summary, layers, [layer_aps(l)[0] for l in layers])


PER = {"embedding_aps_mean": 0.5, "layers": [{"layer": 0, "aps_mean": 0.75}, {"layer": 1, "aps_mean": 0.875},
                                             {"layer": 2}]}
WEAK = {"layers": [{"layer": 0, "aps_mean": 0.59}, {"layer": 1, "aps_mean": 0.5}]}
MEAN_MAP = {"embedding_aps": 0.25, "layers": [{"layer": i, "mean_map_aps": 0.5 + i / 10} for i in range(5)]}
BID = {**MEAN_MAP, "controls": {"bidirectional": True}}
ATTN_NORMS = {"layers": [{"layer": 0, "aps_mean": 0.9, "attn_aps_mean": 0.5, "norm_score_mean": 0.25},
                         {"layer": 1, "aps_mean": 0.9, "attn_aps": 0.75, "norm_score": 0.75},
                         {"layer": 2, "aps_mean": 0.9, "norm_score_mean": 0.875},
                         {"layer": 3, "aps_mean": 0.9, "norm_score_mean": 0.5}]}


def test_judge_neighborhood_per_sequence():
    assert _jn(PER) == {"per_seq": True, "layers": [0, 1], "aps": [0.75, 0.875], "max": 0.875, "embeddings": 0.5,
                        "control": "first", "attn": None, "norms": [], "median": None, "norm": None, "shrink": 0.7}
    # the embeddings within 0.1 of chance and the first layer more than 0.1 above them: "first"
    assert [_jn({**PER, "embedding_aps_mean": e})["control"] for e in (0.61, 0.39, 0.41, 0.65 - 1e-9)] == [
        None, None, "first", None]
    assert _jn({**PER, "embedding_aps_mean": 0.55, "layers": [{"layer": 0, "aps_mean": 0.65}]})["control"] is None
    # every per-sequence APS under 0.6: "unclear"; no embeddings APS
    assert [_jn(x)["control"] for x in (WEAK, {"layers": [{"layer": 0, "aps_mean": 0.6}]})] == ["unclear", None]
    assert _jn(WEAK)["embeddings"] is None and _jn(WEAK)["max"] == 0.59
    assert neighborhood_readings({}) == [] and neighborhood_readings({"layers": [{"layer": 0}]}) == []


def test_judge_neighborhood_mean_map_and_controls():
    j = _jn(MEAN_MAP)
    assert (j["per_seq"], j["layers"], j["embeddings"], j["control"]) == (False, [0, 1, 2, 3, 4], 0.25, None)
    assert j["aps"] == [0.5 + i / 10 for i in range(5)] and j["max"] == 0.9
    # the mean-map APS has no chance level: neither "first" nor "unclear", where per-sequence APS would be
    low = {"embedding_aps_mean": 0.5, "layers": [{"layer": 0, "mean_map_aps": 0.55}]}
    assert _jn(low)["control"] is None
    assert _jn({**low, "layers": [{"layer": 0, "aps_mean": 0.55}]})["control"] == "unclear"
    assert _jn({**low, "layers": [{"layer": 0, "aps_mean": 0.65}]})["control"] == "first"
    assert (_jn(BID)["control"], _jn(BID)["max"]) == ("bidirectional", 0.9)
    assert _jn({**PER, "controls": {"bidirectional": True}})["control"] == "bidirectional"  # before "first"


def test_judge_neighborhood_attention_and_norms():
    j = _jn(ATTN_NORMS)
    # four norms: the median is the upper middle one, sorted [0.25, 0.5, 0.75, 0.875][2]
    assert (j["attn"], j["norms"], j["median"], j["norm"]) == (0.75, [0.25, 0.75, 0.875, 0.5], 0.75, "shrink")
    assert _jn({"layers": [{"layer": 0, "aps_mean": 0.9}]})["attn"] is None
    # the per-sequence mean is read before the mean-map value where a layer has both
    assert _jn({"layers": [{"layer": 0, "aps_mean": 0.9, "attn_aps_mean": 0.625, "attn_aps": 0.95}]})["attn"] == 0.625
    assert [norm_trend(v) for v in (0.7, 0.69, 0.5, 0.31, 0.3, 0.0)] == [
        "shrink", "steady", "steady", "steady", "grow", "grow"]
    assert _jn({"layers": [{"layer": 0, "aps_mean": 0.9, "norm_score": 0.25}]})["norm"] == "grow"


def test_neighborhood_readings_render_each_code():
    tails = [neighborhood_readings({"layers": [{"layer": i, "mean_map_aps": 0.7} for i in ids]})[0].rsplit(": ", 1)[1]
             for ids in ((0, 2, 4, 6, 8), (0, 2, 4, 6))]
    per = ("Adjacency probability score of the residual stream (the hidden states) per sequence (0.5 = chance, 1 = "
           "every token is more similar to nearer tokens): ")
    assert [neighborhood_readings(x) for x in (PER, WEAK, BID, ATTN_NORMS)] + [tails] == [[
        per + "embeddings 0.5, then 0.75 → 0.875 after layers 0 and 1.",
        "The first attention layer already creates the adjacency pattern: the residual stream's APS rises from 0.5 "
        "(embeddings, no position) to 0.75."], [
        per + "0.59 → 0.5 after layers 0 and 1.",
        "No layer's residual stream shows a clear adjacency pattern (APS < 0.6 everywhere)."], [
        "Mean-map APS of the residual stream (the hidden states; the APS of the cosine map averaged over sequences, "
        "not the paper's per-sequence APS; it approaches 1 for any consistent trend as sequences are added, so 0.5 is no chance level "
        "here): embeddings 0.25, then 0.5 → 0.6 → 0.7 → 0.8 → 0.9 after layers 0 … 4.",
        "This is the bidirectional control (no causal mask): theory predicts no adjacency pattern; measured maximum "
        "0.9."], [
        per + "0.9 → 0.9 → 0.9 → 0.9 after layers 0 … 3.",
        "The attention outputs alone (not the residual stream) reach APS 0.75; near-uniform causal attention makes them running means, whose cosine "
        "similarity rises towards the diagonal (theory: APS ≈ 1).",
        "Norm score 0.25 → 0.75 → 0.875 → 0.5 (median 0.75: norms shrink with position, as running means do; ≥ 0.7 = "
        "shrink, ≤ 0.3 = grow)."], [
        "0.7 → 0.7 → 0.7 → 0.7 → 0.7 after layers 0 … 8.", "0.7 → 0.7 → 0.7 → 0.7 after layers 0, 2, 4 and 6."]]
    assert neighborhood_readings(MEAN_MAP) == neighborhood_readings(BID)[:1]  # no control: no second sentence


# --------------------------------------------------------------------------------------------
# trained models, comparisons, key findings: the decisions on judge_model / judge_slash and on the
# findings' structure; one assertion checks the sentences and the numbers they quote
# --------------------------------------------------------------------------------------------
COPY = {"pe": "rope", "task": "copy", "initial_loss": 4.5, "final_loss": 0.25, "steps": 200, "eval_accuracy": 0.875,
        "eval_accuracy_long": 0.5}
STDLIB = {"pe": "none", "data": "stdlib", "eval_accuracy": 0.5, "eval_accuracy_long": 0.25}


def _slash_scan():
    base = uniform_slash(10, 2)
    return base, {"seq_len": 10, "slash_heads": [{"layer": 3, "head": 1, "offset": 2, "score": 4 * base}],
                  "layers": [{"layer": 0, "q_top1_energy": [0.25, None, 0.5]}, {"layer": 1, "q_top1_energy": [0.75]},
                             {"layer": 2, "q_top1_energy": [None]}, {"layer": 3}]}


def test_judge_model():
    assert judge_model(COPY) == {"trained": "trained", "initial_loss": 4.5, "final_loss": 0.25, "steps": 200,
                                 "accuracy": 0.875, "long": 0.5, "generalises": False}  # a drop of 0.375
    j = judge_model(STDLIB)
    assert (j["trained"], j["accuracy"], j["long"], j["generalises"]) == (None, 0.5, 0.25, True)  # a drop of 0.25
    assert judge_model({"eval_accuracy": 0.5, "eval_accuracy_long": 0.1875})["generalises"] is False  # 0.3125
    assert judge_model({"eval_accuracy": 0.5})["generalises"] is None
    assert judge_model({"steps": 0, "pe": "learned"})["trained"] == "untrained"
    assert judge_model({"initial_loss": 1.0, "steps": 5})["trained"] is None  # no final loss
    assert model_readings({"initial_loss": 1.0, "steps": 5}, {}) == []


def test_judge_slash_of_a_scan():
    base, s = _slash_scan()
    j = judge_slash(s, slash_top(s))
    assert (j["head"]["layer"], j["head"]["head"], j["head"]["offset"], j["code"]) == (3, 1, 2, "slash")
    assert j["head"]["ratio"] == 4.0 and j["head"]["uniform"] == base and j["rank_one"] == {"layer": 1, "energy": 0.75}
    nolen = {**s, "seq_len": None, "layers": []}
    j = judge_slash(nolen, slash_top(nolen))
    assert (j["head"]["ratio"], j["code"], j["rank_one"]) == (None, None, None)
    assert judge_slash({**s, "seq_len": 10}, {**s["slash_heads"][0], "score": 1.5 * base})["code"] == "weak"


def test_key_findings_fallback_and_limit():
    runs = [(f"r{i}", "scan", ["kim", "other"], {"layers": [{"layer": 0, "relativity_index": 0.5, "locality": 0.1}]})
            for i in range(6)]
    out = key_findings(runs, max_per_paper=4)
    assert [f.split(":")[0] for f in out["kim"][:4]] == ["r0", "r1", "r2", "r3"]
    assert len(out["kim"]) == 5 and set(out) == {"kim"}
    assert len(key_findings(runs[:4], max_per_paper=4)["kim"]) == 4
    assert key_findings(runs[:5])["kim"][4].replace("1", "2") == out["kim"][4]  # four per paper by default
    first = key_findings([("p", "panels", ["kim"], {"readings": [3, "r1", "r2"]})])
    assert first == {"kim": ["p: r1"]}  # the first reading that is a string
    assert key_findings([("p", "panels", ["kim"], {"readings": []})]) == {}
    assert key_findings([("r", "scan", ["neighborhood"], {"layers": [{"layer": 0}]})]) == {}
    _, s = _slash_scan()
    nolen = key_findings([("r", "scan", ["slash"], {**s, "seq_len": None, "layers": []})])["slash"][0]
    assert "uniform" not in nolen and "energy" not in nolen


def test_model_comparison_and_finding_sentences():
    base, s = _slash_scan()
    per = {"layers": [{"layer": "embeddings", "aps_mean": 0.5}, {"layer": 0, "aps_mean": 0.75},
                      {"layer": 1, "aps_mean": 0.625}]}
    runs = [("r", "scan", ["neighborhood"], per), ("m", "scan", ["neighborhood"], {"layers": [
        {"layer": 0, "mean_map_aps": 0.9}]}), ("r", "scan", ["slash"], s),
            ("q", "scan", ["slash"], {"layers": [{"layer": 0, "q_top1_energy": [0.5]}]}),
            ("k", "scan", ["kim"], {"layers": [{"layer": 0, "relativity_index": 0.5, "locality": 0.1}]})]
    more = key_findings(runs[-1:] * 3, max_per_paper=1)["kim"][-1]
    models = [model_readings(x, {}) for x in (COPY, STDLIB, {"eval_accuracy": 0.5, "eval_accuracy_long": 0.1875},
                                              {"steps": 0, "pe": "learned"}, {"pe": "alibi"}, {"task": "sort"},
                                              {"eval_accuracy": 0.5})]
    assert [models, comparison_readings("APS", {"a": [0.5, None, 0.75], "b": [None]}), key_findings(runs[:4]),
            more] == [[
        ["A model with RoPE, trained on the copy task.", "Training lowered the loss from 4.5 to 0.25 over 200 steps.",
         "Exact-match accuracy 0.875 at the training lengths, 0.5 at lengths beyond them (it does not generalise to "
         "longer inputs)."],
        ["A model with no positional encoding (NoPE), trained on the stdlib corpus.",
         "Exact-match accuracy 0.5 at the training lengths, 0.25 at lengths beyond them."],
        ["Exact-match accuracy 0.5 at the training lengths, 0.188 at lengths beyond them (it does not generalise to "
         "longer inputs)."],
        ["A model with learned absolute positions.", "It is untrained (0 steps): a random-initialisation control."],
        ["A model with alibi."], ["A model with unknown positional encoding, trained on the sort task."],
        ["Exact-match accuracy 0.5 at the training lengths."]],
        "Mean APS over layers: a 0.625; b flat.", {
        "neighborhood": [
            "r: APS of the residual stream per sequence 0.625 … 0.75 over 2 decoder layers (0.5 = chance).",
            "m: mean-map APS of the residual stream 0.9 over 1 decoder layers (APS of the sequence-averaged cosine "
            "map; not the paper's per-sequence APS, no chance level)."],
        "slash": [
            f"r: strongest slash head at Δ ≤ {SLASH_MAX_DELTA}: layer 3 head 1, Δ = 2, SlashScore {fmt(4 * base)}, 4× "
            "uniform; pre-RoPE query top-1 energy (most rank-one head per layer) 0.5 … 0.75.",
            "q: pre-RoPE query top-1 energy (most rank-one head per layer) 0.5."]},
        "… and 2 more run(s) below."]
    assert comparison_readings("APS", {}) is None


# --------------------------------------------------------------------------------------------
# analysis commands: sentences rendered from the judgements (metrics/judge_commands), every code's
# sentence and the numbers it quotes (the decisions are checked in tests/metrics/test_judge_commands.py)
# --------------------------------------------------------------------------------------------
def _head(layer, head, delta, score, **kw):
    return {"layer": layer, "head": head, "best_delta": delta, "best_score": score, **kw}


def test_neighborhood_command_readings():
    s = {"layers": [{"layer": "embeddings", "aps_mean": 0.5},
                    {"layer": 0, "aps_mean": 0.75, "bidirectional_aps_mean": 0.5, "norm_score_mean": 0.25},
                    {"layer": 1, "aps_mean": 0.875}, {"layer": 2, "aps_mean": 0.625}], "theory_gap_layer0": 0.04}
    clear = {"layers": [{"layer": 3, "aps_mean": 0.8, "bidirectional_aps_mean": 0.62, "norm_score_mean": 0.7}],
             "theory_gap_layer0": 0.05}
    held = {"judgement": {"layer": 1, "aps": 0.59, "adjacency": "none", "embeddings_aps": None,
                          "bidirectional_aps": 0.9, "mask_drop": -0.31, "mask": "little", "norm_score": 0.5,
                          "norm": "flat"}}
    assert [neighborhood_command_readings(x) for x in (s, clear, held)] == [[
        "The head outputs of the first decoder layer (layer 0) have APS 0.75 under the causal mask: a weak adjacency "
        "pattern (0.5 = chance, 1 = every row rises towards the diagonal); the embeddings have 0.5.",
        "The head outputs' highest APS is in layer 1 (0.875); the last layer (2) has 0.625.",
        "Without the causal mask the APS of layer 0's head outputs is 0.5, 0.25 lower than causal: the mask is what "
        "creates the head outputs' adjacency pattern.",
        "Layer 0's norm score is 0.25: norms grow with position (≥ 0.7 = shrink, ≤ 0.3 = grow).",
        "Layer 0's mean cosine map differs from the uniform-attention theory sqrt(min(i, j) / max(i, j)) by 0.04 on "
        "average over the lower triangle (close: attention is nearly uniform)."], [
        "The head outputs of the first decoder layer (layer 3) have APS 0.8 under the causal mask: a clear adjacency "
        "pattern (0.5 = chance, 1 = every row rises towards the diagonal).",
        "Without the causal mask the APS of layer 3's head outputs is 0.62, 0.18 lower than causal: the mask is not "
        "the only source of the difference.",
        "Layer 3's norm score is 0.7: norms shrink with position, as running means do (≥ 0.7 = shrink, ≤ 0.3 = grow).",
        "Layer 3's mean cosine map differs from the uniform-attention theory sqrt(min(i, j) / max(i, j)) by 0.05 on "
        "average over the lower triangle (attention is far from uniform)."], [
        "The head outputs of the first decoder layer (layer 1) have APS 0.59 under the causal mask: no adjacency "
        "pattern (0.5 = chance, 1 = every row rises towards the diagonal).",
        "Without the causal mask the APS of layer 1's head outputs is 0.9, 0.31 higher than causal: the mask makes "
        "little difference here.",
        "Layer 1's norm score is 0.5: norms do not change consistently with position (≥ 0.7 = shrink, ≤ 0.3 = grow)."]]
    assert neighborhood_command_readings({"layers": [{"layer": 0}]}) == [] and neighborhood_command_readings({}) == []


def test_panels_and_score_maps_readings():
    pn = {"layer": 4, "panels": [{"panel": "a", "locality": 0.25, "non_relativity": 0.125,
                                  "non_relativity_with_sink": 0.5},
                                 {"panel": "b", "locality": -0.5}, {"panel": "c", "locality": 0.0},
                                 {"panel": "i", "locality": 0.75, "non_relativity": 0.375,
                                  "non_relativity_with_sink": 0.625}, "x"]}
    no_sink = {"layer": 2, "panels": [{"panel": "a", "non_relativity": 0.125}, {"panel": "i", "non_relativity": 0.375}]}
    trends = [panels_readings({"panels": [{"panel": "b", "locality": v}]})[-1] for v in (0.11, 0.1)]
    sm = {"layers": [{"layer": "embeddings", "non_relativity": 0.99},
                     {"layer": 0, "non_relativity": 0.25, "non_relativity_with_sink": 0.5, "locality": 0.5,
                      "sink_weight": 0.125},
                     {"layer": 1, "non_relativity": 0.125, "locality": -0.25, "sink_weight": 0.5},
                     {"layer": 2, "non_relativity": 0.5, "non_relativity_with_sink": 0.75, "locality": 0.25}]}
    assert [panels_readings(pn), panels_readings(no_sink), trends, score_maps_readings(sm)] == [[
        "2 of 4 panels of decoder layer 4 rise towards the diagonal (locality > 0); strongest in (i) at 0.75, weakest "
        "in (b) at -0.5.",
        "Non-relativity (1 − relativity index, key 0 excluded) goes from 0.125 in the layer's normalised input (a) to "
        "0.375 in the next layer's scores (i); with key 0: 0.5 → 0.625.",
        "The layer's own attention scores (b) favour distant keys (locality -0.5)."], [
        "Non-relativity (1 − relativity index, key 0 excluded) goes from 0.125 in the layer's normalised input (a) to "
        "0.375 in the next layer's scores (i)."], [
        "The layer's own attention scores (b) favour nearby keys (locality 0.11).",
        "The layer's own attention scores (b) show little distance trend (locality 0.1)."], [
        "Non-relativity (key 0 excluded) ranges from 0.125 (layer 1) to 0.5 (layer 2): the diagonals explain 50 … "
        "87.5 % of the score maps' variation.",
        "With key 0 (the attention sink column) included, non-relativity reads 0.5 … 0.75.",
        "2 of 3 layers' mean scores rise as keys approach the query (mean locality 0.167).",
        "Attention weight on key 0 (the sink), per layer: 0.125 → 0.5."]]
    assert panels_readings({}) == [] and score_maps_readings({}) == []


def test_slash_command_readings():
    heads = [_head(i, 0, 1 + (i == 0), s, predicted_peak=1, peak_match=m, q_top1_energy=q,
                   band_usage={"high": h, "low": 1 - h})
             for i, (s, m, q, h) in enumerate([(0.9, True, 0.75, 0.5), (0.5, False, 0.25, 0.25),
                                               (0.4, True, 0.5, 0.0)] + [(0.1, False, 0.125, 0.0)] * 17)]
    pers = [{"layer": 0, "head": 0, "delta": 2, "persists": True, "ratio": 0.5, "score_in": 0.9, "score_random": 0.4},
            {"layer": 1, "head": 3, "delta": 1, "persists": False, "ratio": 0.25},
            {"layer": 2, "head": 5, "delta": 1, "persists": True, "ratio": 1.0, "score_in": 0.875,
             "score_random": 0.75}]
    full = {"heads": heads, "kappas": [0.2, 0.4, 0.6], "delta_range": [1, 8], "seq_len": 10, "persistence": pers,
            "persist_kappa": 0.7}
    bare = {"heads": [_head(1, 2, 3, 0.75)], "kappas": [0.9], "delta_range": [2, 8], "persistence": [],
            "persist_kappa": 0.7}
    assert [slash_command_readings(full), slash_command_readings(bare)] == [[
        f"The head that puts the most weight on one sub-diagonal (offset ≥ 1 back) is layer 0, head 0, with "
        f"SlashScore(2) = 0.9 (uniform causal attention would give about {fmt(uniform_slash(10, 2))}).",
        "1 of 20 heads put a mean weight of at least 0.6 on one offset back, for every query, at some offset in the "
        "range; 0.6 is the highest threshold of the grid that any head reaches (at the lowest, 0.2: 3 heads).",
        "2 of the 3 heads with a SlashScore of at least 0.7 in distribution keep it on random-token prompts (median "
        "ratio random / in-distribution 0.5).",
        "Previous-token head: layer 2 head 5, SlashScore(1) 0.875 in distribution, 0.75 on random tokens.",
        "For the top 2 slash heads the rank-one RoPE decomposition predicts the observed peak offset in 1 of 2; their "
        "pre-RoPE queries put 0.5 of the energy in the top singular direction (other heads: 0.146).",
        "Band usage (share of Σ A_l) of the top slash heads: high 0.375, low 0.625."], [
        "The head that puts the most weight on one sub-diagonal (offset ≥ 2 back) is layer 1, head 2, with "
        "SlashScore(3) = 0.75.",
        "No head puts a mean weight of 0.9 on any one offset in the range.",
        "No head reaches a SlashScore of 0.7 in distribution, so persistence is untested.",
        "The scanned layers apply no RoPE, so there is no RoPE decomposition."]]
    assert slash_command_readings({"heads": [], "kappas": [0.5]}) == []
    assert omitted_offsets_reading([3, 4]).replace("3–4", "6") == omitted_offsets_reading([6]) == (
        "Δ 6: no slash-dominant head at any κ of the grid (not listed in the first table).")


def test_dynamics_readings():
    steps = [{"step": 0, "accuracy": 0.1, "best": {"slash_in": 0.125, "q_top1": 0.25, "k_top1": 0.5, "layer": 0,
                                                  "head": 1}},
             {"step": 100, "accuracy": 0.5, "best": {"slash_in": 0.5, "layer": 1, "head": 0}},
             {"step": 200, "accuracy": 0.875, "best": {"slash_in": 0.75, "slash_random": 0.5, "q_top1": 0.875,
                                                      "k_top1": 0.625, "layer": 1, "head": 2, "predicted_peak": 3,
                                                      "band_usage": {"high": 0.25, "medium": 0.625, "low": None}}}]
    s = {"steps": steps, "config": {"delta": 2, "kappa": 0.5}}
    untested = {"steps": [steps[0], {"step": 9, "best": {"slash_in": 0.2, "layer": 1, "head": 2}}],
                "config": {"delta": 2, "kappa": 0.5}}
    assert [dynamics_readings(s), dynamics_readings({**s, "config": {"delta": 2, "kappa": 0.8}})[1:3],
            dynamics_readings(untested)[1:3]] == [[
        "SlashScore(2) of the best head rises from 0.125 at step 0 to 0.75 at step 200 (task accuracy 0.875).",
        "A head with SlashScore(2) ≥ 0.5 first appears at step 100.",
        "On random-token prompts the final head (layer 1 head 2) scores 0.5 at Δ = 2: the SDH persists out of "
        "distribution (κ = 0.5).",
        "Its pre-RoPE queries' top singular direction holds 0.25 of the energy at step 0 and 0.875 at the end (keys: "
        "0.5 → 0.625).",
        "At the end the rank-one RoPE decomposition puts most amplitude in the medium-frequency band (high 0.25, "
        "medium 0.625, low 0) and predicts a peak at Δ = 3."], [
        "No head reaches SlashScore(2) ≥ 0.8 within 200 steps.",
        "On random-token prompts the final head (layer 1 head 2) scores 0.5 at Δ = 2: the SDH does not persist out of "
        "distribution (κ = 0.8)."], [
        "No head reaches SlashScore(2) ≥ 0.5 within 9 steps.",
        "The final head (layer 1 head 2) has no random-token score: persistence out of distribution is untested."]]
    assert len(dynamics_readings({**s, "config": {"delta": 2}})) == 3 and dynamics_readings({}) == []


def test_sweep_and_probes_readings():
    res = [{"shape": "tiny", "sigma": 0.5, "aps_causal_mean": [0.5, 0.75, 0.875], "aps_bidirectional_mean": [0.5, 0.55]},
           {"shape": "tiny", "sigma": 2.0, "aps_causal_mean": [0.5, 0.875, 0.625]},
           {"shape": "wide", "sigma": 1.0, "aps_causal_mean": [0.5, 0.5], "aps_bidirectional_mean": [0.5, 0.375]}]
    v = {"model": "m", "pe": "none", "state": "trained", "cosine_beats_norm": "yes", "cosine_best_r": 0.875,
         "cosine_best_layer": 2, "norm_best_r": 0.5, "norm_best_layer": 1, "cosine_lower_mse_layers": 3, "layers": 4}
    recs = [{"model": "m", "state": "trained", "feature": "vector", "probe": "linear", "layer": 3, "r": 0.75}]
    ends = [probes_readings({"verdicts": [{**v, "cosine_beats_norm": c}]})[0].rsplit(")", 1)[1]
            for c in ("no", "mixed", None)]
    assert [sweep_readings({"results": res[:2]}), sweep_readings({"results": res[2:]}),
            probes_readings({"verdicts": [v], "records": recs}), ends] == [[
        "tiny: APS of decoder layer 0's head outputs (causal) ranges from 0.75 (σ = 0.5) to 0.875 (σ = 2); a clear "
        "adjacency pattern (APS ≥ 0.8) at σ ∈ {2}.",
        "tiny: in the last decoder layer (1) the head outputs' APS is 0.875, 0.625 for σ = 0.5, 2.",
        "Without the causal mask no decoder layer of any model departs from chance (0.5) by more than 0.05 in the head "
        "outputs' mean APS: the pattern comes from the mask."], [
        "wide: APS of decoder layer 0's head outputs (causal) ranges from 0.5 (σ = 1) to 0.5 (σ = 1); no σ gives a "
        "clear adjacency pattern (APS ≥ 0.8).",
        "Without the causal mask no decoder layer of any model departs from chance (0.5) by more than 0.125 in the "
        "head outputs' mean APS; something other than the mask orders the vectors."], [
        "m (none PE, trained): cos(h_i, h_T) predicts T − i with r up to 0.875 (layer 2), the norm with r up to 0.5 "
        "(layer 1); the cosine has the lower test MSE in 3 of 4 decoder layers (MLP probes, held-out characters): "
        "cosine beats the norm.",
        "m (trained): a linear probe on the vector h_i recovers the absolute position with r = 0.75 at layer 3 on "
        "unseen characters."], [": cosine does not beat the norm.", ": the two criteria disagree.", "."]]
    assert sweep_readings({}) == [] and probes_readings({}) == []


def test_command_readings_dispatch():
    # every judged command has its readings; ablate, compare and the fingerprint render their own records
    assert set(COMMAND_READINGS) == set(COMMAND_JUDGES) | {"ablate", "compare", "fingerprint"}
    s = {"panels": [{"panel": "b", "locality": 0.5}]}
    assert command_readings("panels", s) == panels_readings(s) and command_readings("scan", s) is None
    # a summary that holds its judgement is read from it, not from its numbers
    assert command_readings("panels", {**s, "judgement": judge_panels({"panels": [{"panel": "b", "locality": 0.0}]})
                                       }) != command_readings("panels", s)
    for command, judge in COMMAND_JUDGES.items():
        assert command_readings(command, {}) == command_readings(command, {"judgement": judge({})}) == []
    assert run_readings("panels", ["kim", "slash"], s, "kim") == panels_readings(s)
    # a run without per-layer numbers and without sentences of its own: its first reading is its key finding
    assert key_findings([("p", "panels", ["kim"], {**s, "readings": []})]) == {"kim": [f"p: {panels_readings(s)[0]}"]}
    assert run_readings("panels", ["kim"], {**s, "readings": []}, "kim") == panels_readings(s)  # none held
    assert run_readings("scan", ["slash", "kim"], {"readings": ["own"]}, "slash") == ["own"]
    assert run_readings("scan", ["slash", "kim"], {"readings": ["own"]}, "neighborhood") == ["own"]
    assert run_readings("scan", ["slash", "kim"], {"readings": ["own"]}, "other") == ["own"]
    sl = {"seq_len": 10, "slash_heads": [{"layer": 1, "head": 0, "offset": 1, "score": 0.5}], "readings": ["own"]}
    assert run_readings("scan", ["kim", "slash"], sl, "slash") == slash_readings(sl) != ["own"]
    nb = {"layers": [{"layer": 0, "aps_mean": 0.9}]}
    assert run_readings("scan", ["kim", "neighborhood"], nb, "neighborhood") == neighborhood_readings(nb)
