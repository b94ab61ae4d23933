"""The judgements of the analysis commands (neighbourhood, panels, score maps, slash, slash dynamics,
sweep, probes): hand-built summaries with numbers on both sides of each threshold; the numbers and
codes each judgement carries are checked, and that summary.json can hold them."""

import json

import pytest

from poslens.conventions import ADJACENT, ADJACENT_WEAK, MASK_MARGIN, NORM_SHRINK, PANEL_TREND, THEORY_CLOSE
from poslens.metrics.judge.commands import (COMMAND_JUDGES, adjacency_code, command_judgement, judge_dynamics,
                                            judge_neighborhood, judge_panels, judge_probes, judge_score_maps,
                                            judge_slash, judge_sweep, norm_code, uniform_slash_score)


def test_thresholds():
    assert (ADJACENT, ADJACENT_WEAK, PANEL_TREND, THEORY_CLOSE, NORM_SHRINK, MASK_MARGIN) == (0.8, 0.6, 0.1, 0.05,
                                                                                              0.7, 0.1)


def test_codes_and_uniform_slash():
    assert [adjacency_code(a) for a in (0.8, 0.79, 0.6, 0.59)] == ["clear", "weak", "weak", "none"]
    assert [norm_code(v) for v in (0.7, 0.69, 0.31, 0.3)] == ["shrink", "flat", "flat", "grow"]
    assert uniform_slash_score(10, 3) == pytest.approx(sum(1 / i for i in range(4, 11)) / 7)
    assert uniform_slash_score(3, 3) != uniform_slash_score(3, 3)  # no query beyond the offset: nan


# --------------------------------------------------------------------------------------------
# neighborhood
# --------------------------------------------------------------------------------------------
def test_neighborhood_first_layer():
    def first(a1, **kw):
        return judge_neighborhood({"layers": [{"layer": 0, "aps_mean": a1, **kw}]})

    assert first(0.8) == {"layer": 0, "aps": 0.8, "adjacency": "clear", "embeddings_aps": None}
    assert [first(a)["adjacency"] for a in (0.79, 0.6, 0.59)] == ["weak", "weak", "none"]
    assert judge_neighborhood({"layers": [{"layer": 0}]}) == {} and judge_neighborhood({}) == {}


def test_neighborhood_layers_and_controls():
    s = {"layers": [{"layer": "embeddings", "aps_mean": 0.5},
                    {"layer": 0, "aps_mean": 0.75, "bidirectional_aps_mean": 0.5, "norm_score_mean": 0.25},
                    {"layer": 1, "aps_mean": 0.875}, {"layer": 2, "aps_mean": 0.625}],
         "theory_gap_layer0": 0.04}
    assert judge_neighborhood(s) == {
        "layer": 0, "aps": 0.75, "adjacency": "weak", "embeddings_aps": 0.5, "best_layer": 1, "best_aps": 0.875,
        "last_layer": 2, "last_aps": 0.625, "bidirectional_aps": 0.5, "mask_drop": 0.25, "mask": "creates",
        "norm_score": 0.25, "norm": "grow", "theory_gap": 0.04, "theory": "close"}
    s["theory_gap_layer0"] = THEORY_CLOSE  # the gap must lie under it to be close
    assert judge_neighborhood(s)["theory"] == "far"


@pytest.mark.parametrize("b1, mask", [(0.5, "creates"), (0.35, "partial"), (0.62, "partial"), (0.66, "little"),
                                      (0.9, "little")])
def test_neighborhood_bidirectional_branches(b1, mask):
    j = judge_neighborhood({"layers": [{"layer": 0, "aps_mean": 0.75, "bidirectional_aps_mean": b1}]})
    assert j["mask"] == mask and j["bidirectional_aps"] == b1 and j["mask_drop"] == pytest.approx(0.75 - b1)


# --------------------------------------------------------------------------------------------
# panels and score maps
# --------------------------------------------------------------------------------------------
def test_panels():
    s = {"layer": 4, "panels": [{"panel": "a", "locality": 0.25, "non_relativity": 0.125,
                                 "non_relativity_with_sink": 0.5},
                                {"panel": "b", "locality": -0.5},
                                {"panel": "c", "locality": 0.0},
                                {"panel": "i", "locality": 0.75, "non_relativity": 0.375,
                                 "non_relativity_with_sink": 0.625}, "x"]}
    assert judge_panels(s) == {
        "layer": 4, "rising": 2, "panels": 4, "strongest": {"panel": "i", "locality": 0.75},
        "weakest": {"panel": "b", "locality": -0.5}, "non_relativity": {"a": 0.125, "i": 0.375},
        "with_sink": {"a": 0.5, "i": 0.625}, "b_locality": -0.5, "trend": "distant"}
    no_sink = judge_panels({**s, "panels": [{**s["panels"][0], "non_relativity_with_sink": None}, s["panels"][3]]})
    assert no_sink["non_relativity"] == {"a": 0.125, "i": 0.375} and "with_sink" not in no_sink
    assert judge_panels({"panels": [{"panel": "a", "non_relativity": 0.1}]}) == {"layer": None}


@pytest.mark.parametrize("v, trend", [(0.11, "nearby"), (0.1, "none"), (-0.1, "none"), (-0.11, "distant")])
def test_panel_b_trend(v, trend):
    assert judge_panels({"panels": [{"panel": "b", "locality": v}]})["trend"] == trend


def test_score_maps():
    s = {"layers": [{"layer": "embeddings", "non_relativity": 0.99},
                    {"layer": 0, "non_relativity": 0.25, "non_relativity_with_sink": 0.5, "locality": 0.5,
                     "sink_weight": 0.125},
                    {"layer": 1, "non_relativity": 0.125, "locality": -0.25, "sink_weight": 0.5},
                    {"layer": 2, "non_relativity": 0.5, "non_relativity_with_sink": 0.75, "locality": 0.25}]}
    assert judge_score_maps(s) == {
        "lowest": {"layer": 1, "non_relativity": 0.125}, "highest": {"layer": 2, "non_relativity": 0.5},
        "explained_pct": [50.0, 87.5], "with_sink": [0.5, 0.75], "rising": 2, "layers": 3,
        "mean_locality": pytest.approx(0.5 / 3), "sink_weight": [0.125, 0.5]}
    assert judge_score_maps({"layers": [{"layer": 0, "non_relativity": 0.25}]}) == {
        "lowest": {"layer": 0, "non_relativity": 0.25}, "highest": {"layer": 0, "non_relativity": 0.25},
        "explained_pct": [75.0, 75.0]}
    # the extremes are by value, not by layer: the least relative layer here is the first
    first = judge_score_maps({"layers": [{"layer": 0, "non_relativity": 0.5}, {"layer": 1, "non_relativity": 0.125},
                                         {"layer": 2, "non_relativity": 0.25}]})
    assert (first["lowest"]["layer"], first["highest"]["layer"]) == (1, 0)
    assert judge_score_maps({}) == {}


# --------------------------------------------------------------------------------------------
# slash and its training dynamics
# --------------------------------------------------------------------------------------------
def _head(layer, head, delta, score, **kw):
    return {"layer": layer, "head": head, "best_delta": delta, "best_score": score, **kw}


def test_slash_best_head_and_kappas():
    heads = [_head(0, 0, 1, 0.25), _head(1, 2, 3, 0.75), _head(2, 1, 2, 0.5), {"best_score": None}]
    s = {"heads": heads, "kappas": [0.2, 0.4, 0.6, 0.8], "delta_range": [1, 8], "seq_len": 10}
    j = judge_slash(s)
    assert j["best"] == {"layer": 1, "head": 2, "delta": 3, "score": 0.75, "uniform": uniform_slash_score(10, 3)}
    assert j["heads"] == 3 and j["min_delta"] == 1 and j["rope"] is False and "persistence" not in j
    assert j["kappas"] == {"first": 0.2, "reached": [{"kappa": 0.2, "heads": 3}, {"kappa": 0.4, "heads": 2},
                                                     {"kappa": 0.6, "heads": 1}]}
    none = judge_slash({**s, "kappas": [0.9, 0.95], "seq_len": None})
    assert none["best"]["uniform"] is None and none["kappas"] == {"first": 0.9, "reached": []}
    assert judge_slash({**s, "kappas": [0.75]})["kappas"]["reached"] == [{"kappa": 0.75, "heads": 1}]  # = κ reaches
    assert judge_slash({"heads": [], "kappas": [0.5]}) == {}
    assert judge_slash({"heads": heads, "delta_range": [2, 5]})["min_delta"] == 2
    assert judge_slash({"heads": heads})["min_delta"] == 1 and "kappas" not in judge_slash({"heads": heads})


def test_slash_persistence():
    heads = [_head(0, 0, 1, 0.9)]
    pers = [{"layer": 0, "head": 0, "delta": 2, "persists": True, "ratio": 0.5, "score_in": 0.9, "score_random": 0.4},
            {"layer": 1, "head": 3, "delta": 1, "persists": False, "ratio": 0.25},
            {"layer": 2, "head": 5, "delta": 1, "persists": True, "ratio": 1.0, "score_in": 0.875,
             "score_random": 0.75}]
    assert judge_slash({"heads": heads, "persistence": pers, "persist_kappa": 0.7})["persistence"] == {
        "kappa": 0.7, "tested": 3, "persist": 2, "median_ratio": 0.5,
        "previous_token": {"layer": 2, "head": 5, "score_in": 0.875, "score_random": 0.75}}
    two = judge_slash({"heads": heads, "persistence": pers[:2], "persist_kappa": 0.7})["persistence"]
    assert two["previous_token"] is None and two["median_ratio"] == 0.5 and two["persist"] == 1
    empty = judge_slash({"heads": heads, "persistence": [], "persist_kappa": 0.7})
    assert empty["persistence"] == {"kappa": 0.7, "tested": 0}
    assert "persistence" not in judge_slash({"heads": heads, "persistence": None})


def test_slash_decomposition():
    heads = [_head(i, 0, 1, s, predicted_peak=1, peak_match=m, q_top1_energy=q,
                   band_usage={"high": h, "low": 1 - h})
             for i, (s, m, q, h) in enumerate([(0.9, True, 0.75, 0.5), (0.5, False, 0.25, 0.25),
                                               (0.4, True, 0.5, 0.0)] + [(0.1, False, 0.125, 0.0)] * 17)]
    j = judge_slash({"heads": heads})
    # 20 heads: the top 2 by score (0.9, 0.5)
    assert j["decomposition"] == {"top": 2, "tested": 2, "peak_matches": 1, "q_top1": 0.5,
                                  "q_top1_other": pytest.approx((0.5 + 17 * 0.125) / 18),
                                  "band_usage": {"high": 0.375, "low": 0.625}}
    assert j["rope"] is True
    q_none = judge_slash({"heads": [_head(0, 0, 1, 0.9, predicted_peak=2, q_top1_energy=None),
                                    _head(1, 0, 1, 0.1, predicted_peak=2, q_top1_energy=0.5)]})["decomposition"]
    assert (q_none["q_top1"], q_none["q_top1_other"]) == (0.0, 0.5)
    nb = judge_slash({"heads": [_head(0, 0, 1, 0.9, predicted_peak=2)]})["decomposition"]
    assert nb["top"] == 1 and nb["q_top1_other"] is None and nb["band_usage"] == {}
    nope = judge_slash({"heads": [_head(0, 0, 1, 0.9)]})
    assert "decomposition" not in nope and nope["rope"] is False
    mixed = judge_slash({"heads": [_head(0, 0, 1, 0.9), _head(1, 0, 1, 0.1, predicted_peak=1)]})
    assert "decomposition" not in mixed and mixed["rope"] is True  # RoPE, but not in the top head


def test_dynamics():
    steps = [{"step": 0, "accuracy": 0.1, "best": {"slash_in": 0.125, "q_top1": 0.25, "k_top1": 0.5, "layer": 0,
                                                  "head": 1}},
             {"step": 50, "best": None},
             {"step": 75, "best": {"slash_in": None, "layer": 1, "head": 0}},  # no score: not an emergence
             {"step": 100, "accuracy": 0.5, "best": {"slash_in": 0.5, "layer": 1, "head": 0}},
             {"step": 200, "accuracy": 0.875, "best": {"slash_in": 0.75, "slash_random": 0.5, "q_top1": 0.875,
                                                      "k_top1": 0.625, "layer": 1, "head": 2, "predicted_peak": 3,
                                                      "band_usage": {"high": 0.25, "medium": 0.625, "low": None}}}]
    s = {"steps": steps, "config": {"delta": 2, "kappa": 0.5}}
    assert judge_dynamics(s) == {
        "delta": 2, "kappa": 0.5, "first_step": 0, "last_step": 200, "slash_first": 0.125, "slash_last": 0.75,
        "accuracy": 0.875, "head": {"layer": 1, "head": 2}, "q_top1": [0.25, 0.875], "k_top1": [0.5, 0.625],
        "emergence": "emerged", "emerged_at": 100, "slash_random": 0.5, "persistence": "persists",
        "band_usage": {"high": 0.25, "medium": 0.625, "low": 0.0}, "top_band": "medium", "predicted_peak": 3}
    hard = judge_dynamics({**s, "config": {"delta": 2, "kappa": 0.8}})
    assert (hard["emergence"], hard["emerged_at"], hard["persistence"]) == ("not_emerged", None, "transient")
    no_rand = dict(steps[-1], best={k: v for k, v in steps[-1]["best"].items() if k != "slash_random"})
    missing = judge_dynamics({"steps": [steps[0], no_rand], "config": {"delta": 2, "kappa": 0.5}})
    assert missing["persistence"] == "untested" and missing["slash_random"] is None
    nok = judge_dynamics({**s, "config": {"delta": 2}})
    assert nok["kappa"] is None and not {"emergence", "persistence"} & set(nok)
    assert judge_dynamics({"steps": [{"step": 0, "best": None}]}) == {} and judge_dynamics({}) == {}


# --------------------------------------------------------------------------------------------
# sweep and probes
# --------------------------------------------------------------------------------------------
def test_sweep():
    res = [{"shape": "tiny", "sigma": 0.5, "aps_causal_mean": [0.5, 0.75, 0.875],
            "aps_bidirectional_mean": [0.5, 0.55]},
           {"shape": "tiny", "sigma": 2.0, "aps_causal_mean": [0.5, 0.875, 0.625]},
           {"shape": "tiny", "sigma": 1.0, "aps_causal_mean": [0.5, 0.9, 0.5]},
           {"shape": "tiny", "sigma": 0.25, "aps_causal_mean": [0.5, 0.8, 0.7]},  # the smallest σ: not the lowest APS
           {"shape": "wide", "sigma": 1.0, "aps_causal_mean": [0.5, 0.5]},
           {"shape": "bad", "sigma": 1.0, "aps_causal_mean": [0.5]},
           {"shape": "none", "sigma": 1.0, "aps_causal_mean": [0.5, None]}]
    j = judge_sweep({"results": res})
    assert j["shapes"] == [
        {"shape": "tiny", "lowest": {"sigma": 0.5, "aps": 0.75}, "highest": {"sigma": 1.0, "aps": 0.9},
         "clear_sigmas": [2.0, 1.0, 0.25], "adjacency": "clear",
         "last_layer": {"layer": 1, "sigmas": [0.5, 2.0, 1.0, 0.25], "aps": [0.875, 0.625, 0.5, 0.7]}},
        {"shape": "wide", "lowest": {"sigma": 1.0, "aps": 0.5}, "highest": {"sigma": 1.0, "aps": 0.5},
         "clear_sigmas": [], "adjacency": "none"}]
    assert j["bidirectional_dev"] == pytest.approx(0.05) and j["mask"] == "creates"
    far = judge_sweep({"results": [{**res[0], "aps_bidirectional_mean": [0.5, 0.375]}]})
    assert far["bidirectional_dev"] == 0.125 and far["mask"] == "other"
    assert judge_sweep({}) == {"shapes": []}


def test_probes():
    v = {"model": "m", "pe": "none", "state": "trained", "cosine_beats_norm": "yes", "cosine_best_r": 0.875,
         "cosine_best_layer": 2, "norm_best_r": 0.5, "norm_best_layer": 1, "cosine_lower_mse_layers": 3, "layers": 4}
    recs = [{"model": "m", "state": "trained", "feature": "vector", "probe": "linear", "layer": 1, "r": 0.25},
            {"model": "m", "state": "trained", "feature": "vector", "probe": "linear", "layer": 3, "r": 0.75},
            {"model": "m", "state": "trained", "feature": "vector", "probe": "mlp", "layer": 0, "r": 0.99},
            {"model": "m", "state": "init", "feature": "vector", "probe": "linear", "layer": 0, "r": 0.98},
            {"model": "m", "state": "trained", "feature": "vector", "probe": "linear", "layer": "emb", "r": 0.97}]
    assert judge_probes({"verdicts": [v, "x"], "records": recs}) == {"verdicts": [{**v, "vector": {"r": 0.75,
                                                                                                   "layer": 3}}]}
    assert judge_probes({"verdicts": [v]})["verdicts"][0]["vector"] is None
    assert judge_probes({}) == {"verdicts": []}


def test_dispatch_and_held_judgement():
    assert set(COMMAND_JUDGES) == {"neighborhood", "panels", "kim-maps", "slash", "slash-dynamics", "sweep", "probes"}
    s = {"panels": [{"panel": "b", "locality": 0.5}]}
    assert command_judgement("panels", s) == judge_panels(s) and command_judgement("scan", s) is None
    held = {**s, "judgement": {"layer": 7, "trend": "none", "b_locality": 0.0}}
    assert command_judgement("panels", held) is held["judgement"]  # the summary's own judgement wins
    # every judgement is plain JSON: numbers, codes, lists and dicts (no NaN)
    nb = {"layers": [{"layer": 0, "aps_mean": 0.9, "bidirectional_aps_mean": float("nan")}],
          "theory_gap_layer0": float("nan")}
    assert json.loads(json.dumps(judge_neighborhood(nb), allow_nan=False)) == judge_neighborhood(nb)
