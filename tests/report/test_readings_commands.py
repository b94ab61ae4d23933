"""The readings of the analysis commands (neighbourhood, panels, score maps, slash, slash dynamics,
sweep, probes), of scans' APS and trained models, and the key findings: hand-built summaries with
numbers on both sides of each threshold; the numbers and the words that carry each claim are checked."""

import pytest

from poslens.fmt import fmt

from poslens.conventions import ADJACENT, ADJACENT_WEAK, PANEL_TREND, THEORY_CLOSE
from poslens.reporting.readings.commands import (COMMAND_READINGS, command_readings, dynamics_readings,
                                                 neighborhood_command_readings, panels_readings, probes_readings,
                                                 score_maps_readings, slash_command_readings, sweep_readings)
from poslens.reporting.readings.findings import comparison_readings, key_findings, model_readings, run_readings
from poslens.reporting.readings.neighborhood import neighborhood_readings
from poslens.reporting.readings.slash import slash_readings, uniform_slash


def J(out):
    return " ".join(out)


def test_thresholds():
    assert (ADJACENT, ADJACENT_WEAK, PANEL_TREND, THEORY_CLOSE) == (0.8, 0.6, 0.1, 0.05)


# --------------------------------------------------------------------------------------------
# scans: APS
# --------------------------------------------------------------------------------------------
def test_neighborhood_readings_per_sequence():
    s = {"embedding_aps_mean": 0.5, "layers": [{"layer": 0, "aps_mean": 0.75}, {"layer": 1, "aps_mean": 0.875},
                                               {"layer": 2}]}
    out = neighborhood_readings(s)
    assert "per sequence" in out[0] and "embeddings 0.5, then 0.75 → 0.875 after layers 0 and 1" in out[0]
    assert "already creates the adjacency pattern: APS rises from 0.5" in out[1] and "to 0.75" in out[1]
    assert len(out) == 2
    # the embeddings already far from chance, or the first layer not 0.1 above them: no such sentence
    assert "already creates" not in J(neighborhood_readings({**s, "embedding_aps_mean": 0.61}))
    assert "already creates" not in J(neighborhood_readings({**s, "embedding_aps_mean": 0.39}))
    assert "already creates" in J(neighborhood_readings({**s, "embedding_aps_mean": 0.41}))
    assert "already creates" not in J(neighborhood_readings({**s, "embedding_aps_mean": 0.65 - 1e-9}))
    assert "already creates" not in J(neighborhood_readings({**s, "embedding_aps_mean": 0.55, "layers": [
        {"layer": 0, "aps_mean": 0.65}]}))
    weak = neighborhood_readings({"layers": [{"layer": 0, "aps_mean": 0.59}, {"layer": 1, "aps_mean": 0.5}]})
    assert "No layer shows a clear adjacency pattern (APS < 0.6" in J(weak) and "embeddings" not in weak[0]
    assert "No layer shows" not in J(neighborhood_readings({"layers": [{"layer": 0, "aps_mean": 0.6}]}))
    assert neighborhood_readings({}) == [] and neighborhood_readings({"layers": [{"layer": 0}]}) == []


def test_neighborhood_readings_mean_map_and_controls():
    s = {"embedding_aps": 0.25, "layers": [{"layer": i, "mean_map_aps": 0.5 + i / 10} for i in range(5)]}
    out = neighborhood_readings(s)
    assert out[0].startswith("Mean-map APS") and "no chance level" in out[0]
    assert "embeddings 0.25, then 0.5 → 0.6 → 0.7 → 0.8 → 0.9 after layers 0 … 4" in out[0]
    assert len(out) == 1  # no per-sequence APS: neither the chance sentences
    bid = neighborhood_readings({**s, "controls": {"bidirectional": True}})
    assert "bidirectional control" in bid[1] and "measured maximum 0.9" in bid[1]
    sparse = neighborhood_readings({"layers": [{"layer": i, "mean_map_aps": 0.7} for i in (0, 2, 4, 6, 8)]})
    assert "after layers 0 … 8" in sparse[0]
    four = neighborhood_readings({"layers": [{"layer": i, "mean_map_aps": 0.7} for i in (0, 2, 4, 6)]})
    assert "after layers 0, 2, 4 and 6" in four[0]


def test_neighborhood_readings_attention_and_norms():
    s = {"layers": [{"layer": 0, "aps_mean": 0.9, "attn_aps_mean": 0.5, "norm_score_mean": 0.25},
                    {"layer": 1, "aps_mean": 0.9, "attn_aps": 0.75, "norm_score": 0.75},
                    {"layer": 2, "aps_mean": 0.9, "norm_score_mean": 0.875},
                    {"layer": 3, "aps_mean": 0.9, "norm_score_mean": 0.5}]}
    t = J(neighborhood_readings(s))
    assert "Attention outputs alone reach APS 0.75" in t
    # four norms: the median is the upper middle one, sorted [0.25, 0.5, 0.75, 0.875][2]
    assert "Norm score 0.25 → 0.75 → 0.875 → 0.5 (median 0.75: norms shrink" in t and "≤ 0.3 = grow" in t
    assert "Attention outputs" not in J(neighborhood_readings({"layers": [{"layer": 0, "aps_mean": 0.9}]}))
    # the per-sequence mean is read before the mean-map value where a layer has both
    both = {"layers": [{"layer": 0, "aps_mean": 0.9, "attn_aps_mean": 0.625, "attn_aps": 0.95}]}
    assert "Attention outputs alone reach APS 0.625" in J(neighborhood_readings(both))


def test_neighborhood_finding():
    per = {"layers": [{"layer": "embeddings", "aps_mean": 0.5}, {"layer": 0, "aps_mean": 0.75},
                      {"layer": 1, "aps_mean": 0.625}]}
    f = key_findings([("r", "scan", ["neighborhood"], per)])["neighborhood"][0]
    assert f == "r: APS per sequence 0.625 … 0.75 over 2 decoder layers (0.5 = chance)."
    mm = {"layers": [{"layer": 0, "mean_map_aps": 0.9}]}
    f = key_findings([("r", "scan", ["neighborhood"], mm)])["neighborhood"][0]
    assert f.startswith("r: mean-map APS 0.9 over 1 decoder layers") and "no chance level" in f
    assert key_findings([("r", "scan", ["neighborhood"], {"layers": [{"layer": 0}]})]) == {}


# --------------------------------------------------------------------------------------------
# trained models, comparisons
# --------------------------------------------------------------------------------------------
def test_model_readings():
    out = model_readings({"pe": "rope", "task": "copy", "initial_loss": 4.5, "final_loss": 0.25, "steps": 200,
                          "eval_accuracy": 0.875, "eval_accuracy_long": 0.5}, {})
    assert out[0] == "A model with RoPE, trained on the copy task."
    assert "from 4.5 to 0.25 over 200 steps" in out[1]
    assert "0.875 at the training lengths, 0.5 at lengths beyond" in out[2] and "does not generalise" in out[2]
    ok = model_readings({"pe": "none", "data": "stdlib", "eval_accuracy": 0.5, "eval_accuracy_long": 0.25}, {})
    assert ok[0] == "A model with no positional encoding (NoPE), trained on the stdlib corpus."
    assert "does not generalise" not in ok[1]  # a drop of 0.25: not called
    assert "does not generalise" in model_readings({"eval_accuracy": 0.5, "eval_accuracy_long": 0.1875}, {})[0]
    assert model_readings({"steps": 0, "pe": "learned"}, {})[1] == "It is untrained (0 steps): a random-initialisation control."
    assert model_readings({"pe": "alibi"}, {}) == ["A model with alibi."]
    assert model_readings({"task": "sort"}, {})[0] == "A model with unknown positional encoding, trained on the sort task."
    assert model_readings({"initial_loss": 1.0, "steps": 5}, {}) == []
    assert model_readings({"eval_accuracy": 0.5}, {}) == ["Exact-match accuracy 0.5 at the training lengths."]


def test_comparison_readings():
    assert comparison_readings("APS", {"a": [0.5, None, 0.75], "b": [None]}) == "Mean APS over layers: a 0.625; b flat."
    assert comparison_readings("APS", {}) is None


# --------------------------------------------------------------------------------------------
# slash: scans' key finding
# --------------------------------------------------------------------------------------------
def test_slash_finding():
    n = 10
    base = uniform_slash(n, 2)
    s = {"seq_len": n, "slash_heads": [{"layer": 3, "head": 1, "offset": 2, "score": 4 * base}],
         "layers": [{"layer": 0, "q_top1_energy": [0.25, None, 0.5]}, {"layer": 1, "q_top1_energy": [0.75]},
                    {"layer": 2, "q_top1_energy": [None]}, {"layer": 3}]}
    f = key_findings([("r", "scan", ["slash"], s)])["slash"][0]
    assert f"layer 3 head 1, Δ = 2, SlashScore {fmt(4 * base)}, 4× uniform" in f
    assert "query top-1 energy (most rank-one head per layer) 0.5 … 0.75" in f
    nolen = key_findings([("r", "scan", ["slash"], {**s, "seq_len": None, "layers": []})])["slash"][0]
    assert "uniform" not in nolen and "energy" not in nolen
    assert key_findings([("r", "scan", ["slash"], {"layers": [{"layer": 0, "q_top1_energy": [0.5]}]})])["slash"] == [
        "r: pre-RoPE query top-1 energy (most rank-one head per layer) 0.5."]


def test_key_findings_fallback_and_limit():
    runs = [(f"r{i}", "scan", ["kim", "other"], {"layers": [{"layer": 0, "relativity_index": 0.5, "locality": 0.1}]})
            for i in range(6)]
    out = key_findings(runs, max_per_paper=4)
    assert [f.split(":")[0] for f in out["kim"][:4]] == ["r0", "r1", "r2", "r3"]
    assert out["kim"][4] == "… and 2 more run(s) below." and len(out["kim"]) == 5 and set(out) == {"kim"}
    assert len(key_findings(runs[:4], max_per_paper=4)["kim"]) == 4
    assert key_findings(runs[:5])["kim"][4] == "… and 1 more run(s) below."  # four per paper by default
    first = key_findings([("p", "panels", ["kim"], {"readings": [3, "First reading.", "Second."]})])
    assert first == {"kim": ["p: First reading."]}
    assert key_findings([("p", "panels", ["kim"], {"readings": []})]) == {}


# --------------------------------------------------------------------------------------------
# analysis commands
# --------------------------------------------------------------------------------------------
def test_neighborhood_command_verdicts():
    def first(a1, **kw):
        return neighborhood_command_readings({"layers": [{"layer": 0, "aps_mean": a1, **kw}]})

    assert "APS 0.8 under the causal mask: a clear adjacency pattern" in first(0.8)[0]
    assert "a weak adjacency pattern" in first(0.79)[0] and "a weak adjacency pattern" in first(0.6)[0]
    assert "no adjacency pattern" in first(0.59)[0]
    assert first(0.8)[0].endswith("rises towards the diagonal).") and len(first(0.8)) == 1
    assert neighborhood_command_readings({"layers": [{"layer": 0}]}) == [] and neighborhood_command_readings({}) == []


def test_neighborhood_command_layers_and_controls():
    s = {"layers": [{"layer": "embeddings", "aps_mean": 0.5},
                    {"layer": 0, "aps_mean": 0.75, "bidirectional_aps_mean": 0.5, "norm_score_mean": 0.25},
                    {"layer": 1, "aps_mean": 0.875}, {"layer": 2, "aps_mean": 0.625}],
         "theory_gap_layer0": 0.04}
    out = neighborhood_command_readings(s)
    assert "(layer 0) have APS 0.75" in out[0] and "the embeddings have 0.5." in out[0]
    assert "highest APS is in layer 1 (0.875); the last layer (2) has 0.625" in out[1]
    assert "layer 0's APS is 0.5, 0.25 lower than causal: the mask is what creates" in out[2]
    assert "norm score is 0.25: norms grow with position" in out[3]
    assert "by 0.04 on average" in out[4] and "(close: attention is nearly uniform)" in out[4]
    far = J(neighborhood_command_readings({**s, "theory_gap_layer0": 0.05}))
    assert "far from uniform" in far


@pytest.mark.parametrize("b1, words", [(0.5, "the mask is what creates"), (0.35, "not the only source"),
                                       (0.62, "not the only source"), (0.66, "makes little difference"),
                                       (0.9, "makes little difference")])
def test_neighborhood_command_bidirectional_branches(b1, words):
    out = J(neighborhood_command_readings({"layers": [{"layer": 0, "aps_mean": 0.75,
                                                       "bidirectional_aps_mean": b1}]}))
    assert words in out
    assert ("higher than causal" in out) == (b1 >= 0.75) and ("lower than causal" in out) == (b1 < 0.75)


def test_panels_readings():
    s = {"layer": 4, "panels": [{"panel": "a", "locality": 0.25, "non_relativity": 0.125,
                                 "non_relativity_with_sink": 0.5},
                                {"panel": "b", "locality": -0.5},
                                {"panel": "c", "locality": 0.0},
                                {"panel": "i", "locality": 0.75, "non_relativity": 0.375,
                                 "non_relativity_with_sink": 0.625}, "x"]}
    out = panels_readings(s)
    assert "2 of 4 panels of decoder layer 4 rise" in out[0]
    assert "strongest in (i) at 0.75, weakest in (b) at -0.5" in out[0]
    assert "from 0.125 in the layer's normalised input (a) to 0.375 in the next layer's scores (i)" in out[1]
    assert "with key 0: 0.5 → 0.625" in out[1]
    assert "(b) favour distant keys (locality -0.5)" in out[2]
    no_sink = panels_readings({**s, "panels": [{**s["panels"][0], "non_relativity_with_sink": None}, s["panels"][3]]})
    assert "with key 0" not in J(no_sink) and no_sink[1].endswith("(i).")
    assert len(panels_readings({"panels": [{"panel": "a", "non_relativity": 0.1}]})) == 0


@pytest.mark.parametrize("v, word", [(0.11, "favour nearby keys"), (0.1, "show little distance trend"),
                                     (-0.1, "show little distance trend"), (-0.11, "favour distant keys")])
def test_panel_b_trend(v, word):
    assert word in panels_readings({"panels": [{"panel": "b", "locality": v}]})[-1]


def test_score_maps_readings():
    s = {"layers": [{"layer": "embeddings", "non_relativity": 0.99},
                    {"layer": 0, "non_relativity": 0.25, "non_relativity_with_sink": 0.5, "locality": 0.5,
                     "sink_weight": 0.125},
                    {"layer": 1, "non_relativity": 0.125, "locality": -0.25, "sink_weight": 0.5},
                    {"layer": 2, "non_relativity": 0.5, "non_relativity_with_sink": 0.75, "locality": 0.25}]}
    out = score_maps_readings(s)
    assert "ranges from 0.125 (layer 1) to 0.5 (layer 2)" in out[0] and "explain 50 … 87.5 %" in out[0]
    assert "non-relativity reads 0.5 … 0.75" in out[1]
    assert "2 of 3 layers' mean scores rise" in out[2] and "(mean locality 0.167)" in out[2]
    assert "per layer: 0.125 → 0.5." in out[3]
    assert score_maps_readings({"layers": [{"layer": 0, "non_relativity": 0.25}]})[1:] == []
    # the extremes are by value, not by layer: the least relative layer here is the first
    first = score_maps_readings({"layers": [{"layer": 0, "non_relativity": 0.5}, {"layer": 1, "non_relativity": 0.125},
                                            {"layer": 2, "non_relativity": 0.25}]})
    assert "ranges from 0.125 (layer 1) to 0.5 (layer 0)" in first[0]
    assert score_maps_readings({}) == []


def _head(layer, head, delta, score, **kw):
    return {"layer": layer, "head": head, "best_delta": delta, "best_score": score, **kw}


def test_slash_command_best_head_and_kappas():
    heads = [_head(0, 0, 1, 0.25), _head(1, 2, 3, 0.75), _head(2, 1, 2, 0.5), {"best_score": None}]
    s = {"heads": heads, "kappas": [0.2, 0.4, 0.6, 0.8], "delta_range": [1, 8], "seq_len": 10}
    out = slash_command_readings(s)
    assert "(Δ ≥ 1) is layer 1 head 2 with SlashScore(3) = 0.75" in out[0]
    assert f"would give about {uniform_slash(10, 3):.3g})" in out[0]
    assert out[1].startswith("1 of 3 heads are (0.6, Δ)-slash-dominant") and "at κ = 0.2: 3." in out[1]
    none = slash_command_readings({**s, "kappas": [0.9, 0.95], "seq_len": None})
    assert none[0].endswith("= 0.75.") and none[1] == "No head reaches κ = 0.9 at any Δ in the range."
    edge = slash_command_readings({**s, "kappas": [0.75]})  # a score equal to κ reaches it
    assert edge[1].startswith("1 of 3 heads are (0.75, Δ)")
    assert slash_command_readings({"heads": [], "kappas": [0.5]}) == []
    assert "(Δ ≥ 2)" in slash_command_readings({"heads": heads, "delta_range": [2, 5]})[0]
    assert "(Δ ≥ 1)" in slash_command_readings({"heads": heads})[0]


def test_slash_command_persistence():
    heads = [_head(0, 0, 1, 0.9)]
    pers = [{"layer": 0, "head": 0, "delta": 2, "persists": True, "ratio": 0.5, "score_in": 0.9, "score_random": 0.4},
            {"layer": 1, "head": 3, "delta": 1, "persists": False, "ratio": 0.25},
            {"layer": 2, "head": 5, "delta": 1, "persists": True, "ratio": 1.0, "score_in": 0.875,
             "score_random": 0.75}]
    out = J(slash_command_readings({"heads": heads, "persistence": pers, "persist_kappa": 0.7}))
    assert "2 of 3 in-distribution (0.7, Δ)-SDHs persist" in out and "(median ratio random / in-distribution 0.5)" in out
    assert "Previous-token head: layer 2 head 5, SlashScore(1) 0.875 in distribution, 0.75 on random" in out
    out2 = J(slash_command_readings({"heads": heads, "persistence": pers[:2], "persist_kappa": 0.7}))
    assert "Previous-token head" not in out2 and "median ratio random / in-distribution 0.5" in out2
    empty = J(slash_command_readings({"heads": heads, "persistence": [], "persist_kappa": 0.7}))
    assert "No head reaches κ = 0.7 in distribution, so persistence is untested." in empty
    assert "persist" not in J(slash_command_readings({"heads": heads, "persistence": None}))


def test_slash_command_decomposition():
    heads = [_head(i, 0, 1, s, predicted_peak=1, peak_match=m, q_top1_energy=q,
                   band_usage={"high": h, "low": 1 - h})
             for i, (s, m, q, h) in enumerate([(0.9, True, 0.75, 0.5), (0.5, False, 0.25, 0.25),
                                               (0.4, True, 0.5, 0.0)] + [(0.1, False, 0.125, 0.0)] * 17)]
    out = slash_command_readings({"heads": heads})
    t = J(out)
    # 20 heads: the top 2 by score (0.9, 0.5)
    assert "For the top 2 slash heads" in t and "peak offset in 1 of 2" in t
    assert "put 0.5 of the energy in the top singular direction (other heads: 0.146)" in t
    assert "Band usage (share of Σ A_l) of the top slash heads: high 0.375, low 0.625." in t
    q_none = J(slash_command_readings({"heads": [_head(0, 0, 1, 0.9, predicted_peak=2, q_top1_energy=None),
                                                 _head(1, 0, 1, 0.1, predicted_peak=2, q_top1_energy=0.5)]}))
    assert "put 0 of the energy" in q_none and "(other heads: 0.5)" in q_none
    nb = J(slash_command_readings({"heads": [_head(0, 0, 1, 0.9, predicted_peak=2)]}))
    assert "top 1 slash heads" in nb and "other heads: –" in nb and "Band usage" not in nb
    nope = slash_command_readings({"heads": [_head(0, 0, 1, 0.9)]})
    assert nope[-1] == "The scanned layers apply no RoPE, so there is no RoPE decomposition."
    mixed = J(slash_command_readings({"heads": [_head(0, 0, 1, 0.9), _head(1, 0, 1, 0.1, predicted_peak=1)]}))
    assert "RoPE decomposition" not in mixed and "top 1" not in mixed


def test_dynamics_readings():
    steps = [{"step": 0, "accuracy": 0.1, "best": {"slash_in": 0.125, "q_top1": 0.25, "k_top1": 0.5, "layer": 0,
                                                  "head": 1}},
             {"step": 50, "best": None},
             {"step": 75, "best": {"slash_in": None, "layer": 1, "head": 0}},  # no score: not an emergence
             {"step": 100, "accuracy": 0.5, "best": {"slash_in": 0.5, "layer": 1, "head": 0}},
             {"step": 200, "accuracy": 0.875, "best": {"slash_in": 0.75, "slash_random": 0.5, "q_top1": 0.875,
                                                      "k_top1": 0.625, "layer": 1, "head": 2, "predicted_peak": 3,
                                                      "band_usage": {"high": 0.25, "medium": 0.625, "low": None}}}]
    s = {"steps": steps, "config": {"delta": 2, "kappa": 0.5}}
    out = dynamics_readings(s)
    assert "SlashScore(2) of the best head rises from 0.125 at step 0 to 0.75 at step 200" in out[0]
    assert "(task accuracy 0.875)" in out[0]
    assert out[1] == "A (0.5, 2)-slash-dominant head first appears at step 100."
    assert "(layer 1 head 2) scores 0.5 at Δ = 2: the SDH persists out of distribution (κ = 0.5)." in out[2]
    assert "holds 0.25 of the energy at step 0 and 0.875 at the end (keys: 0.5 → 0.625)" in out[3]
    assert "most amplitude in the medium-frequency band (high 0.25, medium 0.625, low 0)" in out[4]
    assert "peak at Δ = 3" in out[4]
    hard = dynamics_readings({**s, "config": {"delta": 2, "kappa": 0.8}})
    assert hard[1] == "No head reaches SlashScore(2) ≥ 0.8 within 200 steps." and "does not persist" in hard[2]
    no_rand = dict(steps[-1], best={k: v for k, v in steps[-1]["best"].items() if k != "slash_random"})
    missing = dynamics_readings({"steps": [steps[0], no_rand], "config": {"delta": 2, "kappa": 0.5}})
    assert "(layer 1 head 2) has no random-token score" in missing[2] and "persists" not in missing[2]
    edge = dynamics_readings({**s, "config": {"delta": 2, "kappa": 0.5}, "steps": [steps[0], dict(
        steps[-1], best={**steps[-1]["best"], "slash_random": 0.5})]})
    assert "the SDH persists" in edge[2]  # a score equal to κ reaches it
    nok = dynamics_readings({**s, "config": {"delta": 2}})
    assert len(nok) == 3 and "persist" not in J(nok)
    assert dynamics_readings({"steps": [{"step": 0, "best": None}]}) == [] and dynamics_readings({}) == []


def test_sweep_readings():
    res = [{"shape": "tiny", "sigma": 0.5, "aps_causal_mean": [0.5, 0.75, 0.875], "aps_bidirectional_mean": [0.5, 0.55]},
           {"shape": "tiny", "sigma": 2.0, "aps_causal_mean": [0.5, 0.875, 0.625]},
           {"shape": "tiny", "sigma": 1.0, "aps_causal_mean": [0.5, 0.9, 0.5]},
           {"shape": "tiny", "sigma": 0.25, "aps_causal_mean": [0.5, 0.8, 0.7]},  # the smallest σ: not the lowest APS
           {"shape": "wide", "sigma": 1.0, "aps_causal_mean": [0.5, 0.5]},
           {"shape": "bad", "sigma": 1.0, "aps_causal_mean": [0.5]},
           {"shape": "none", "sigma": 1.0, "aps_causal_mean": [0.5, None]}]
    out = sweep_readings({"results": res})
    assert "tiny: APS of decoder layer 0 (causal) ranges from 0.75 (σ = 0.5) to 0.9 (σ = 1)" in out[0]
    assert "a clear adjacency pattern (APS ≥ 0.8) at σ ∈ {2, 1, 0.25}." in out[0]
    assert "in the last decoder layer (1) APS is 0.875, 0.625, 0.5, 0.7 for σ = 0.5, 2, 1, 0.25." in out[1]
    assert "wide: APS of decoder layer 0 (causal) ranges from 0.5 (σ = 1) to 0.5" in out[2]
    assert "no σ gives a clear adjacency pattern (APS ≥ 0.8)" in out[2]
    assert "departs from chance (0.5) by more than 0.05 in mean APS: the pattern comes from the mask." in out[3]
    assert len(out) == 4 and not any(x.startswith(("bad", "none")) for x in out)
    far = sweep_readings({"results": [{**res[0], "aps_bidirectional_mean": [0.5, 0.375]}]})
    assert "by more than 0.125 in mean APS; something other than the mask" in far[-1]
    assert sweep_readings({}) == []


def test_probes_readings():
    v = {"model": "m", "pe": "none", "state": "trained", "cosine_beats_norm": "yes", "cosine_best_r": 0.875,
         "cosine_best_layer": 2, "norm_best_r": 0.5, "norm_best_layer": 1, "cosine_lower_mse_layers": 3, "layers": 4}
    recs = [{"model": "m", "state": "trained", "feature": "vector", "probe": "linear", "layer": 1, "r": 0.25},
            {"model": "m", "state": "trained", "feature": "vector", "probe": "linear", "layer": 3, "r": 0.75},
            {"model": "m", "state": "trained", "feature": "vector", "probe": "mlp", "layer": 0, "r": 0.99},
            {"model": "m", "state": "init", "feature": "vector", "probe": "linear", "layer": 0, "r": 0.98},
            {"model": "m", "state": "trained", "feature": "vector", "probe": "linear", "layer": "emb", "r": 0.97}]
    out = probes_readings({"verdicts": [v, "x"], "records": recs})
    assert "m (none PE, trained): cos(h_i, h_T) predicts T − i with r up to 0.875 (layer 2)" in out[0]
    assert "the norm with r up to 0.5 (layer 1)" in out[0] and "in 3 of 4 decoder layers" in out[0]
    assert out[0].endswith(": cosine beats the norm.")
    assert out[1] == ("m (trained): a linear probe on the vector h_i recovers the absolute position with r = 0.75 "
                      "at layer 3 on unseen characters.")
    for verdict, end in (("no", ": cosine does not beat the norm."), ("mixed", ": the two criteria disagree."),
                         (None, "held-out characters).")):
        assert probes_readings({"verdicts": [{**v, "cosine_beats_norm": verdict}]})[0].endswith(end)
    assert probes_readings({}) == []


def test_command_readings_dispatch():
    assert set(COMMAND_READINGS) == {"neighborhood", "panels", "kim-maps", "slash", "slash-dynamics", "sweep",
                                     "probes"}
    s = {"panels": [{"panel": "b", "locality": 0.5}]}
    assert command_readings("panels", s) == panels_readings(s) and command_readings("scan", s) is None
    assert run_readings("panels", ["kim", "slash"], s, "kim") == panels_readings(s)
    assert run_readings("scan", ["slash", "kim"], {"readings": ["own"]}, "slash") == ["own"]
    assert run_readings("scan", ["slash", "kim"], {"readings": ["own"]}, "neighborhood") == ["own"]
    assert run_readings("scan", ["slash", "kim"], {"readings": ["own"]}, "other") == ["own"]
    sl = {"seq_len": 10, "slash_heads": [{"layer": 1, "head": 0, "offset": 1, "score": 0.5}], "readings": ["own"]}
    assert run_readings("scan", ["kim", "slash"], sl, "slash") == slash_readings(sl) != ["own"]
    nb = {"layers": [{"layer": 0, "aps_mean": 0.9}]}
    assert run_readings("scan", ["kim", "neighborhood"], nb, "neighborhood") == neighborhood_readings(nb)
