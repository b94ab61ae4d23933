"""The causal-mask paper's readings and key finding (arXiv 2509.21042), each decision given numbers on
both sides of its threshold and asserted on the judge's codes (:mod:`poslens.metrics.judge.papers`); in
particular a scan's full-map relativity index, which is not noise-corrected, is never quoted without its
noise floor, and too few sequence groups are said to be too few. A few rendering tests check that each
code's sentence is written and quotes the numbers. Expected numbers are computed here by hand."""

import pytest

from poslens.conventions import FEW_GROUPS_MARGIN, NOISE_P, RELATIVE, TREND
from poslens.metrics.judge.papers import (judge_kim, kim_finding, noise_shares, noise_source, p_counts, smallest_p,
                                        too_few_groups)
from poslens.metrics.verdicts import bh_significant
from poslens.reporting.readings.common import few_groups, noise_phrase
from poslens.reporting.readings.findings import key_findings, run_readings
from poslens.reporting.readings.kim import kim_readings


def L(i, ri=0.5, loc=0.5, **kw):
    return {"layer": i, "relativity_index": ri, "locality": loc, **kw}


def text(layers, noise="noise"):
    return " ".join(kim_readings(layers, noise=noise))


def rel(layers):
    return judge_kim(layers)["relativity"]


def loc(layers):
    return judge_kim(layers)["locality"]


def trend(layers):
    return judge_kim(layers)["trend"]


def test_constants():
    assert (RELATIVE, TREND, NOISE_P, FEW_GROUPS_MARGIN) == (0.98, 0.3, 0.01, 10)


def test_no_layers_and_only_flat_layers():
    assert kim_readings([]) == [] and kim_readings(["x", 3]) == []
    assert judge_kim(["x", 3]) == {"missing": [], "reason": None, "count": 0, "flat": [], "live": []}
    two = judge_kim([L(0, None, None), L(1, None, None)])
    assert two["flat"] == [0, 1] and two["live"] == [] and "series" not in two
    words = kim_readings([L(0, None, None), L(1, None, None)])
    assert len(words) == 1 and "within" not in words[0]  # no noise named: no "within"


def test_missing_layers_have_no_verdict():
    j = judge_kim([L(0, None, None, missing={"relativity_index": "x"}), L(1, None, None), L(2)])
    assert j["missing"] == [0] and j["reason"] == "x" and j["flat"] == [1] and j["live"] == [2]
    assert j["count"] == 2 and j["series"]["relativity"] == [0.5]
    only = judge_kim([L(0, None, None, missing={"relativity_index": "why"})])
    assert only["missing"] == [0] and only["count"] == 0 and len(kim_readings([L(0, None, None,
                                                                                  missing={"relativity_index": "x"})])) == 1


def test_many_flat_layers_name_the_few_live_ones():
    three = [L(i, None, None) for i in range(10)]
    three[1], three[4], three[6] = L(1), L(4), L(6)
    j = judge_kim(three)
    assert j["live"] == [1, 4, 6] and j["flat"] == [0, 2, 3, 5, 7, 8, 9] and j["count"] == 10
    flat = [L(i, None, None) for i in range(8)]
    one = flat[:]
    one[5] = L(5)
    assert (judge_kim(one)["live"], len(judge_kim(one)["flat"])) == ([5], 7)
    four = flat[:]  # four live layers: the flat ones are listed instead
    for i in (1, 3, 5, 7):
        four[i] = L(i)
    assert judge_kim(four)["flat"] == [0, 2, 4, 6] and "All" not in text(four)


def test_series_and_from_layer_k_on():
    j = judge_kim([L(0, None, None), L(1, 0.25, 0.5), L(2, 0.75, -0.125)])
    s = j["series"]
    assert s["relativity"] == [0.25, 0.75] and s["locality"] == [0.5, -0.125] and s["tail"] and not s["sink"]
    assert s["testable"] and not s["corrected"]
    assert not judge_kim([L(0, None, None), L(1, 0.25, 0.5)])["series"]["tail"]  # one live layer: "in layer 1"
    assert not judge_kim([L(0), L(1)])["series"]["tail"]  # nothing flat before
    assert judge_kim([L(0, 0.5, 0.5, relativity_index_with_sink=0.1)])["series"]["sink"]
    assert not judge_kim([L(0, 0.5, 0.5, relativity_index_with_sink=None)])["series"]["sink"]
    mixed = [L(0, None, None), L(1, 0.9, 0.2), L(2, None, None), L(3, 0.9, 0.2)]
    assert not judge_kim(mixed)["series"]["tail"] and judge_kim(mixed)["live"] == [1, 3]


def test_rendering_flat_layers_and_the_series_quotes_the_numbers():
    three = [L(i, None, None) for i in range(10)]
    three[1], three[4], three[6] = L(1), L(4), L(6)
    out = kim_readings([L(0, None, None), L(1, 0.25, 0.5), L(2, 0.75, -0.125)], noise="noise")
    quiet = text([L(0), L(1)], noise="")  # no noise named: no claim, and the maps are said to carry no errors
    assert (kim_readings([L(2, None, None)], noise="Monte Carlo noise") == [
        "Layer 2 is flat within Monte Carlo noise: there the attention scores carry no information about position."]
        and text(three).startswith("All 10 layers but 1, 4 and 6 (7 of 10) are flat within noise:")
        and "From layer 1 on the scores depend on position: relativity index 0.25 → 0.75" in out[1]
        and "locality 0.5 → -0.125" in out[1]
        and quiet.startswith("In layers 0 and 1 relativity index 0.5 → 0.5") and "carry no standard errors" in quiet)
    assert "errors" not in text([L(0), L(1)]) and "scores depend" not in text([L(0, noise_groups=6), L(1, noise_groups=6)])


def test_locality_thresholds():
    assert loc([L(0, loc=0.31), L(1, loc=0.9)])["code"] == "near"
    assert loc([L(0, loc=0.3), L(1, loc=0.9)]) == {"code": "some", "strong": [1], "layers": [0, 1],
                                                  "threshold": TREND}
    assert loc([L(0, loc=-0.31), L(1, loc=-0.9)])["code"] == "far"
    assert loc([L(0, loc=-0.3), L(1, loc=-0.9)])["code"] == "some"
    assert loc([L(0, loc=-0.5), L(1, loc=0.0), L(2, loc=0.5)])["strong"] == [0, 2]
    assert loc([L(0, loc=0.3), L(1, loc=-0.3)])["code"] == "none"
    assert loc([L(0, loc=None), L(1, loc=None)])["code"] is None
    assert loc([L(0, loc=None), L(1, loc=0.9)])["code"] == "near"  # a layer without locality is left out, not 0


def test_relativity_thresholds():
    assert rel([L(0, 0.98), L(1, 0.99)])["code"] == "relative"
    assert rel([L(0, 0.97), L(1, 0.99)])["code"] is None
    drop = rel([L(0, 0.99), L(1, 0.949), L(2, 0.9)])
    assert (drop["code"], drop["first"], drop["first_layer"], drop["drop"], drop["drop_layer"]) == ("drop", 0.99, 0, 0.9, 2)
    assert rel([L(0, 0.99), L(1, 0.951)])["code"] is None  # within 0.03 of the threshold: no drop is called
    assert rel([L(0, 0.98), L(1, 0.949)])["code"] == "drop"
    assert rel([L(0, 0.99)])["code"] == "relative"  # one layer: nothing later
    part = rel([L(0, 0.875), L(1, 0.95)])
    assert part["code"] == "partial" and part["unexplained"] == 0.125 and part["low"] == 0.875
    assert rel([L(0, 0.9), L(1, 0.95)])["code"] is None
    low = rel([L(0, 0.6), L(1, 0.95)])
    assert low["unexplained"] == pytest.approx(0.4) and low["low_layer"] == 0  # the lowest layer, not the first
    assert rel([L(0, 0.95), L(1, 0.6)])["low_layer"] == 1


def test_relativity_is_read_from_the_noise_corrected_grid_index_where_every_layer_has_one():
    grid = [L(0, 0.888, grid_relativity_index=0.991, nonrelative_p=0.2),
            L(1, 0.383, grid_relativity_index=0.635, nonrelative_p=0.001), L(2, 0.9, grid_relativity_index=0.95)]
    r = rel(grid)
    assert (r["index"], r["corrected"], r["code"], r["first"], r["drop"], r["drop_layer"]) == \
        ("grid", True, "drop", 0.991, 0.635, 1)
    part = rel([grid[0], L(1, 0.383, nonrelative_p=0.001)])  # one layer without a grid index: the full map's
    assert (part["index"], part["corrected"], part["code"], part["low"]) == ("full", False, "partial", 0.383)
    assert part["unexplained"] == pytest.approx(0.617)
    low = rel([L(0, 0.5, grid_relativity_index=0.8, nonrelative_p=0.001), L(1, 0.5, grid_relativity_index=0.95)])
    assert (low["code"], low["low"], low["corrected"]) == ("partial", 0.8, True)
    assert low["unexplained"] == pytest.approx(0.2)
    assert rel([L(0, 0.5, grid_relativity_index=0.99), L(1, 0.5, grid_relativity_index=0.98)])["code"] == "relative"
    noisy = rel([L(0, 0.5, grid_relativity_index=0.9, nonrelative_p=0.5),
                 L(1, 0.5, grid_relativity_index=0.95, nonrelative_p=0.5)])
    assert (noisy["code"], noisy["low"], noisy["low_layer"], noisy["corrected"]) == ("noise", 0.9, 0, True)


def test_relativity_without_significance_says_noise():
    r = rel([L(0, 0.99, nonrelative_p=0.5), L(1, 0.4, nonrelative_p=0.02), L(2, 0.9, nonrelative_p=0.011)])
    assert (r["code"], r["low"], r["low_layer"], r["tested"], r["significant"]) == ("noise", 0.4, 1, 3, 0)
    sig = rel([L(0, 0.99, nonrelative_p=0.5), L(1, 0.4, nonrelative_p=0.0099)])  # one layer significant
    assert (sig["code"], sig["drop"], sig["drop_layer"], sig["significant"]) == ("drop", 0.4, 1, 1)
    assert rel([L(0, 0.99, nonrelative_p=0.5), L(1, 0.98, nonrelative_p=0.5)])["code"] == "relative"


def test_rendering_each_relativity_and_locality_code_quotes_its_numbers():
    assert ("Layer 0 is purely relative (noise-corrected relativity 0.991); later layers drop to 0.635 (layer 1)"
            in text([L(0, 0.888, grid_relativity_index=0.991), L(1, 0.383, grid_relativity_index=0.635)])
            and "All of them are purely relative (relativity ≥ 0.98)" in text([L(0, 0.98), L(1, 0.99)])
            and "Up to 0.125 of the variation is not explained by the distance alone (relativity index 0.875)"
            in text([L(0, 0.875), L(1, 0.95)])
            and "The relativity index is as low as 0.4 (layer 1), but in no layer is the departure from a purely "
            "relative map beyond sampling noise (p of \"purely relative\" ≥ 0.01 in all 2)"
            in text([L(0, 0.99, nonrelative_p=0.5), L(1, 0.4, nonrelative_p=0.02)])
            and "Every such layer favours nearby keys" in text([L(0, loc=0.31), L(1, loc=0.9)])
            and "distant keys are favoured" in text([L(0, loc=-0.31), L(1, loc=-0.9)])
            and "clear only in layers 0 and 2" in text([L(0, loc=-0.5), L(1, loc=0.0), L(2, loc=0.5)])
            and "No layer shows a clear trend with distance (|locality| ≤ 0.3)" in text([L(0, loc=0.3), L(1, loc=-0.3)]))


def test_diagonal_trend_sign_and_significance():
    up = trend([L(0, diagonal_trend=0.2), L(1, diagonal_trend=0.1)])
    assert (up["code"], up["values"], up["subset"]) == ("rises", [0.2, 0.1], False)
    assert trend([L(0, diagonal_trend=-0.2), L(1, diagonal_trend=-0.1)])["code"] == "falls"
    assert trend([L(0, diagonal_trend=-0.2), L(1, diagonal_trend=0.1)])["code"] == "mixed"
    assert trend([L(0, diagonal_trend=0.0), L(1, diagonal_trend=0.1)])["code"] == "mixed"
    assert trend([L(0), L(1)]) is None
    tested = trend([L(0, diagonal_trend=-0.2, trend_p=0.5), L(1, diagonal_trend=0.1, trend_p=0.001),
                    L(2, diagonal_trend=0.3, trend_p=0.0099)])
    assert (tested["code"], tested["significant"], tested["subset"]) == ("rises", 2, True)
    allsig = trend([L(0, diagonal_trend=-0.2, trend_p=0.001), L(1, diagonal_trend=-0.1, trend_p=0.001)])
    assert (allsig["code"], allsig["subset"]) == ("falls", False)
    nonsig = trend([L(0, diagonal_trend=-0.2, trend_p=0.01), L(1, diagonal_trend=0.1, trend_p=0.5)])
    assert nonsig["code"] == "none"


def test_grid_statistics_of_the_noise_floor():
    layers = [L(0, 0.383, grid_relativity_index=0.888, grid_diagonal_trend=0.25, trend_p=0.001, noise_positions=64,
                noise_groups=16),
              L(1, 0.914, grid_relativity_index=1.0, grid_diagonal_trend=-0.5, trend_p=0.2, noise_positions=32,
                noise_groups=16)]
    n = judge_kim(layers)["noise"]
    assert n["grid"] == {"positions": 64, "trend": [0.25, -0.5], "relativity": [0.888, 1.0],
                         "counts": {"significant": 1, "tested": 2, "fdr": 1}}
    assert n["shares"] == [] and n["groups"]["few"] is None  # grid present, 16 groups: enough
    tested = [L(0, diagonal_trend=-0.2, trend_p=0.5), L(1, diagonal_trend=0.1, trend_p=0.001),
              L(2, diagonal_trend=0.3, trend_p=0.0099)]
    assert ("64-position grid of the map; on that grid the trend reads 0.25 → -0.5 and the noise-corrected "
            "relativity index 0.888 → 1; the trend is significant (p < 0.01) in 1 of 2 layers" in text(layers)
            and "-0.2 → 0.1 → 0.3; the score rises to the right on every diagonal in the 2 layer(s) where the trend "
            "is significant (p < 0.01)" in text(tested)
            and "falls to the right on every diagonal" in text([L(0, diagonal_trend=-0.2), L(1, diagonal_trend=-0.1)])
            and "changes sign between layers" in text([L(0, diagonal_trend=-0.2), L(1, diagonal_trend=0.1)])
            and "shows no significant trend in any layer" in text([L(0, diagonal_trend=-0.2, trend_p=0.01)]))
    no_p = judge_kim([L(0, grid_relativity_index=0.9, grid_diagonal_trend=0.1, noise_positions=8)])["noise"]["grid"]
    assert no_p["positions"] == 8 and no_p["counts"] is None


def test_noise_shares_of_a_scan_without_grid():
    scan = [L(0, 0.77, within_diag_rms=0.5, within_diag_rms_noise=0.25, noise_positions=128),
            L(1, 0.6, within_diag_rms=0.2, within_diag_rms_noise=0.4, noise_positions=128),
            L(2, 0.6, within_diag_rms=0.2, within_diag_rms_noise=0.4)]  # no noise_positions: not a scan's
    assert noise_shares(scan) == [pytest.approx(0.25), 1.0]
    assert judge_kim(scan)["noise"]["shares"] == [pytest.approx(0.25), 1.0]
    assert ("25 … 100 % of the within-diagonal variation" in text(scan)
            and "Only 8 independent groups of sequences: the smallest p-value the sign-flip test can give is 0.00781, "
            "barely below the 0.01 threshold" in text([L(0, noise_groups=8)])
            and "not below the 0.01" in few_groups([{"noise_groups": 6}])
            and "per layer: 0.25 → 0.5" in text([L(0, sink_weight=0.25), L(1, sink_weight=0.5)])
            and "to within 0.03 in every layer (largest standard error 0.004)" in text(
                [L(0, theory_max_abs_diff=0.01, max_stderr=0.002), L(1, theory_max_abs_diff=0.03, max_stderr=0.004)])
            and noise_phrase([{"noise_groups": 16, "noise_positions": 64, "grid_relativity_index": 0.9}])
            == "sampling noise (the noise floor of 16 independent groups of samples, on a 64-position grid)")
    assert noise_shares([L(0, within_diag_rms=0.0, within_diag_rms_noise=0.1, noise_positions=4)]) == []
    assert noise_shares([L(0, within_diag_rms=0.5, within_diag_rms_noise=None, noise_positions=4)]) == []
    assert noise_shares([L(0, within_diag_rms=0.5, within_diag_rms_noise=0.0, noise_positions=4)]) == [0.0]
    gridded = L(0, within_diag_rms=0.5, within_diag_rms_noise=0.25, noise_positions=4, grid_relativity_index=0.9)
    assert noise_shares([gridded]) == []  # the noise-corrected index is quoted instead


def test_smallest_p_and_too_few_groups():
    assert smallest_p([]) == (0, None) and smallest_p([{"noise_groups": 1}]) == (1, None)
    assert smallest_p([{"noise_groups": 2}, {"noise_groups": 8}]) == (8, 2 / 256)
    assert smallest_p([{"noise_groups": 6}]) == (6, 2 / 64)
    assert too_few_groups([{"noise_groups": 6}]) == {"groups": 6, "p_min": 2 / 64, "few": "not_below"}
    assert too_few_groups([{"noise_groups": 8}]) == {"groups": 8, "p_min": 2 / 256, "few": "barely_below"}
    assert too_few_groups([{"noise_groups": 10}])["few"] == "barely_below"  # 0.00195 * 10 > 0.01
    assert too_few_groups([{"noise_groups": 11}])["few"] is None  # 0.000977 * 10 < 0.01
    for enough in ([{"noise_groups": 16}], [{"noise_groups": 1}], []):
        assert too_few_groups(enough)["few"] is None and few_groups(enough) == ""
    six = judge_kim([L(0, noise_groups=6), L(1, noise_groups=6)])
    assert not six["series"]["testable"] and six["noise"]["groups"]["few"] == "not_below"  # nothing could be flat
    assert judge_kim([L(0, noise_groups=8), L(1, noise_groups=8)])["series"]["testable"]


def test_sink_weight_and_theory():
    e = judge_kim([L(0, sink_weight=0.25), L(1, sink_weight=0.5), L(2, sink_weight=None)])["extras"]
    assert e == {"sink_weight": [0.25, 0.5], "theory_diff": None, "stderr": None}
    sim = judge_kim([L(0, theory_max_abs_diff=0.01, max_stderr=0.002), L(1, theory_max_abs_diff=0.03,
                                                                         max_stderr=0.004)])["extras"]
    assert (sim["theory_diff"], sim["stderr"]) == (0.03, 0.004)
    assert judge_kim([L(0, theory_max_abs_diff=0.01)])["extras"]["stderr"] is None
    # a flat layer's gap counts too
    assert judge_kim([L(0, None, None, theory_max_abs_diff=0.07), L(1)])["extras"]["theory_diff"] == 0.07
    assert "closed" not in text([L(0)]) and "sink" not in text([L(0)])


def test_noise_source():
    assert noise_source([]) == {"source": None, "groups": None, "grid": None} and noise_phrase([]) == ""
    assert noise_source([{"max_stderr": 0.1}])["source"] == "monte_carlo"
    assert noise_source([{"noise_groups": 16}]) == {"source": "sampling", "groups": 16, "grid": None}
    assert noise_source([{"noise_groups": 1}]) == {"source": None, "groups": None, "grid": None}
    assert noise_source([{"noise_groups": 4, "max_stderr": 0.1}, {"noise_groups": 8}])["groups"] == 8
    grid = noise_source([{"noise_groups": 16, "noise_positions": 64, "grid_relativity_index": 0.9},
                         {"noise_positions": 32}, "x"])
    assert grid == {"source": "sampling", "groups": 16, "grid": 64}
    assert noise_source([{"noise_groups": 16, "noise_positions": 64}])["grid"] is None


# --------------------------------------------------------------------------------------------
# the key finding
# --------------------------------------------------------------------------------------------
def finding(layers, **summary):
    return key_findings([("run", "scan", ["kim"], {"layers": layers, **summary})])["kim"][0]


def test_kim_finding_plain():
    f = kim_finding([L(0, 0.5, 0.2), L(1, 0.25, 0.4), L(2, None, None), {"layer": 3}])
    assert (f["lead"], f["count"], f["live"], f["flat"], f["lowest"]) == ("plain", 3, 2, 1, 1)
    assert f["relativity"] == [0.5, 0.25] and f["locality"] == [0.2, 0.4] and f["trend"] == []
    assert f["nonrelative"] is None and f["groups"]["few"] is None and not f["sink"]
    assert kim_finding([L(0, relativity_index_with_sink=None)])["sink"]
    assert kim_finding([L(0)])["flat"] == 0
    assert kim_finding([L(0, loc=None)])["locality"] == [None]
    allflat = kim_finding([L(0, None, None), L(1, None, None)])
    assert (allflat["live"], allflat["count"]) == (0, 2)
    assert kim_finding([{"layer": 0}]) is None and key_findings([("run", "scan", ["kim"], {"layers": [{"layer": 0}]})]) == {}
    tr = kim_finding([L(0, diagonal_trend=-0.125), L(1, diagonal_trend=0.25)])
    assert tr["trend"] == [-0.125, 0.25] and tr["trend_counts"] is None
    trp = kim_finding([L(0, diagonal_trend=-0.125, trend_p=0.001), L(1, diagonal_trend=0.25, trend_p=0.5)])
    assert trp["trend_counts"] == {"significant": 1, "tested": 2, "fdr": 1}
    # BH over two: 0.001 · 2/1 = 0.002 < 0.01 stays; 0.01 is not below 0.01 either way
    assert kim_finding([L(0, nonrelative_p=0.001), L(1, nonrelative_p=0.01)])["nonrelative"] == \
        {"significant": 1, "tested": 2, "fdr": 1}
    assert kim_finding([L(0, nonrelative_p=0.001)])["nonrelative"] == {"significant": 1, "tested": 1, "fdr": 1}



def test_kim_finding_leads_with_the_grid_index():
    layers = [L(0, 0.888, grid_relativity_index=0.991, nonrelative_p=0.195, noise_positions=64, noise_groups=8),
              L(1, 0.383, grid_relativity_index=0.635, nonrelative_p=0.001, noise_positions=64, noise_groups=8),
              L(2, 0.914)]
    f = kim_finding(layers)
    assert (f["lead"], f["grid"], f["positions"], f["grid_layers"], f["lowest"]) == ("grid", [0.991, 0.635], 64, 2, 1)
    assert f["relativity"] == [0.888, 0.383, 0.914] and f["nonrelative"]["significant"] == 1
    # 8 groups: the smallest p is 2/2^8 = 0.0078, not far under 0.01
    assert f["groups"] == {"groups": 8, "p_min": 2 / 256, "few": "barely_below"}


def test_kim_finding_of_a_scan_without_grid_gives_the_noise_floor():
    layers = [L(0, 0.77, within_diag_rms=0.5, within_diag_rms_noise=0.4, noise_positions=128, noise_groups=6,
                nonrelative_p=0.156),
              L(1, 0.37, within_diag_rms=0.5, within_diag_rms_noise=0.45, noise_positions=128, noise_groups=6,
                nonrelative_p=0.031)]
    f = kim_finding(layers)
    assert f["lead"] == "shares" and f["shares"] == [pytest.approx(0.64), pytest.approx(0.81)]
    assert f["nonrelative"] == {"significant": 0, "tested": 2, "fdr": 0} and f["lowest"] == 1
    assert f["groups"]["few"] == "not_below" and f["groups"]["groups"] == 6



def test_kim_finding_is_the_run_readings_entry():
    layers = [L(0, 0.5, 0.25), L(1, 0.75, 0.5)]
    summary = {"layers": layers}
    assert run_readings("scan", ["kim", "slash"], summary, "kim") == kim_readings(layers)
    assert run_readings("scan", ["kim"], {"layers": layers, "readings": ["own"]}, "kim") == ["own"]
    assert run_readings("scan", ["kim", "slash"], {"layers": [{"layer": 0}], "readings": ["own"]}, "kim") == ["own"]


def test_fdr_count_against_hand_computed_benjamini_hochberg():
    def fdr(ps):
        return p_counts([{"p": p} for p in ps], "p")["fdr"]

    # BH: sort p ascending, reject the k smallest for the largest k with p_(k) <= k/m · q
    # m = 4, q = 0.01: thresholds 0.0025, 0.005, 0.0075, 0.01
    assert fdr([0.002, 0.004, 0.0074, 0.5]) == 3  # p_(3) = 0.0074 <= 0.0075
    assert fdr([0.002, 0.006, 0.008, 0.5]) == 1  # p_(2) = 0.006 > 0.005, p_(3) = 0.008 > 0.0075
    assert fdr([0.003, 0.004, 0.5, 0.9]) == 2  # step-up: p_(1) = 0.003 > 0.0025 but p_(2) <= 0.005
    assert fdr([0.009]) == 1 and fdr([0.011]) == 0 and p_counts([], "p") is None
    assert sum(bh_significant([0.002, 0.004, 0.0074, 0.5])) == 3
    assert p_counts([{"p": 0.009}, {"p": None}, {"q": 0.001}, {"p": 0.5}], "p") == \
        {"significant": 1, "tested": 2, "fdr": 0}  # 0.009 · 2 > 0.01


def test_the_count_of_non_relative_layers_is_corrected_for_testing_every_layer():
    """Eight groups give every sign-flip test the same smallest p (2/2^8 = 0.0078): 13 of 30 layers at that
    p are each "significant" at 0.01, but none is once the false discovery rate over the 30 is held at 0.01
    (0.0078 · 30/13 = 0.018)."""
    layers = [L(i, 0.6, grid_relativity_index=0.7, nonrelative_p=0.0078125 if i < 13 else 0.5,
                noise_positions=64, noise_groups=8) for i in range(30)]
    assert kim_finding(layers)["nonrelative"] == {"significant": 13, "tested": 30, "fdr": 0}
    # with 16 groups the smallest p is 3e-5: all 13 survive the correction
    strong = [dict(l, nonrelative_p=2 / 2**16 if l["nonrelative_p"] < 0.01 else 0.5, noise_groups=16) for l in layers]
    assert kim_finding(strong)["nonrelative"] == {"significant": 13, "tested": 30, "fdr": 13}


def test_a_scan_whose_noise_grid_is_the_whole_map_leads_with_the_corrected_index():
    layers = [L(0, 0.7, relativity_index_noise_corrected=True, relativity_index_uncorrected=0.5, noise_positions=64,
                noise_groups=16, within_diag_rms=0.5, within_diag_rms_noise=0.4, nonrelative_p=1e-4),
              L(1, 0.9, relativity_index_noise_corrected=True, relativity_index_uncorrected=0.8, noise_positions=64,
                noise_groups=16, within_diag_rms=0.5, within_diag_rms_noise=0.1, nonrelative_p=0.2)]
    f = kim_finding(layers)
    assert (f["lead"], f["shares"], f["relativity"]) == ("corrected", [], [0.7, 0.9])
    assert f["nonrelative"]["significant"] == 1
    assert noise_shares(layers) == []
    j = judge_kim(layers)
    assert j["series"]["corrected"] and j["relativity"]["corrected"] and j["noise"]["shares"] == []
    assert not judge_kim([L(0, 0.7), L(1, 0.9)])["series"]["corrected"]


def test_rendering_the_finding_quotes_its_numbers():
    grid = [L(0, 0.888, grid_relativity_index=0.991, nonrelative_p=0.195, noise_positions=64, noise_groups=8),
            L(1, 0.383, grid_relativity_index=0.635, nonrelative_p=0.001, noise_positions=64, noise_groups=8),
            L(2, 0.914)]
    shares = [L(0, 0.77, within_diag_rms=0.5, within_diag_rms_noise=0.4, noise_positions=128, nonrelative_p=0.156),
              L(1, 0.37, within_diag_rms=0.5, within_diag_rms_noise=0.45, noise_positions=128, nonrelative_p=0.031)]
    whole = [L(i, r, relativity_index_noise_corrected=True, nonrelative_p=p) for i, r, p in ((0, 0.7, 1e-4), (1, 0.9, 0.2))]
    many = [L(i, 0.6, nonrelative_p=0.0078125 if i < 13 else 0.5) for i in range(30)]
    trend = [L(0, diagonal_trend=-0.125, trend_p=0.001), L(1, diagonal_trend=0.25, trend_p=0.5)]
    one = finding([L(0, nonrelative_p=0.001)])
    assert (finding([L(0, 0.5, 0.2), L(1, 0.25, 0.4), L(2, None, None), {"layer": 3}])
            == "run: relativity index 0.25 … 0.5 over 2 layer(s), lowest in layer 1; locality 0.2 … 0.4; 1 flat layer(s)."
            and finding([L(0, loc=None)]).endswith("; locality –.")  # no locality: a dash, not a number
            and "not purely relative (p < 0.01) in 1 of 1 layer, lowest" in one and "Benjamini" not in one
            and "; diagonal trend -0.125 … 0.25 (significant (p < 0.01) in 1 of 2 layers, 1 at a false discovery rate "
            "of 0.01 over the 2 (Benjamini–Hochberg))." in finding(trend)
            and finding(grid).startswith("run: noise-corrected relativity index 0.635 … 0.991 on a 64-position grid "
                                         "over 2 layer(s), not purely relative (p < 0.01) in 1 of 2 layers")
            and "full-map index 0.383 … 0.914 (not noise-corrected), lowest in layer 1" in finding(grid)
            and "only 8 independent groups" in finding(grid) and finding(grid).endswith("relativity.")
            and "(full map, not noise-corrected: sampling noise alone gives 64 … 81 % of the within-diagonal "
            "variation)" in finding(shares)
            and finding(whole).startswith("run: noise-corrected relativity index 0.7 … 0.9 over 2 layer(s) (full map), "
                                          "not purely relative (p < 0.01) in 1 of 2 layers")
            and "in 13 of 30 layers, 0 at a false discovery rate of 0.01 over the 30 (Benjamini–Hochberg)" in finding(many)
            and finding([L(0, None, None), L(1, None, None)])
            == "run: every one of 2 layers is flat (no positional information in the scores).")
