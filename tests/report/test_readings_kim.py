"""The causal-mask paper's readings and key finding (arXiv 2509.21042), each branch given numbers on
both sides of its threshold; in particular a scan's full-map relativity index, which is not
noise-corrected, is never quoted without its noise floor, and too few sequence groups are said to be
too few. Expected numbers are computed here by hand."""

import pytest

from poslens.conventions import FEW_GROUPS_MARGIN, NOISE_P, RELATIVE, TREND
from poslens.reporting.readings.common import few_groups, noise_phrase, noise_shares, smallest_p
from poslens.reporting.readings.findings import key_findings, run_readings
from poslens.reporting.readings.kim import kim_readings


def L(i, ri=0.5, loc=0.5, **kw):
    return {"layer": i, "relativity_index": ri, "locality": loc, **kw}


def text(layers, noise="noise"):
    return " ".join(kim_readings(layers, noise=noise))


def test_constants():
    assert (RELATIVE, TREND, NOISE_P, FEW_GROUPS_MARGIN) == (0.98, 0.3, 0.01, 10)


def test_no_layers_and_only_flat_layers():
    assert kim_readings([]) == [] and kim_readings(["x", 3]) == []
    out = kim_readings([L(2, None, None)], noise="Monte Carlo noise")
    assert out == ["Layer 2 is flat within Monte Carlo noise: there the attention scores carry no information "
                   "about position."]
    two = kim_readings([L(0, None, None), L(1, None, None)])
    assert len(two) == 1 and two[0].startswith("Layers 0 and 1 are flat:")  # no noise named: no "within"


def test_many_flat_layers_name_the_few_live_ones():
    flat = [L(i, None, None) for i in range(8)]
    one = flat[:]
    one[5] = L(5)
    assert kim_readings(one)[0].startswith("All 8 layers but layer 5 (7 of 8) are flat")
    three = [L(i, None, None) for i in range(10)]
    three[1], three[4], three[6] = L(1), L(4), L(6)
    assert kim_readings(three)[0].startswith("All 10 layers but 1, 4 and 6 (7 of 10) are flat")
    four = flat[:]  # four live layers: the flat ones are listed instead
    for i in (1, 3, 5, 7):
        four[i] = L(i)
    assert kim_readings(four)[0].startswith("Layers 0, 2, 4 and 6 are flat")
    seven = [L(i, None, None) for i in range(6)] + [L(6)]  # six flat: listed, not "all but"
    assert kim_readings(seven)[0].startswith("Layers 0 … 5 are flat")


def test_series_and_from_layer_k_on():
    out = kim_readings([L(0, None, None), L(1, 0.25, 0.5), L(2, 0.75, -0.125)], noise="noise")
    assert "From layer 1 on the scores depend on position: relativity index 0.25 → 0.75" in out[1]
    assert "locality 0.5 → -0.125" in out[1] and "key 0 excluded" not in out[1]
    one = kim_readings([L(0, None, None), L(1, 0.25, 0.5)], noise="noise")  # one live layer: "in layer 1"
    assert one[1].startswith("In layer 1 the scores depend on position")
    sink = text([L(0, 0.5, 0.5, relativity_index_with_sink=0.1)])
    assert "relativity index (key 0 excluded) 0.5" in sink
    none_sink = text([L(0, 0.5, 0.5, relativity_index_with_sink=None)])
    assert "key 0 excluded" not in none_sink


def test_without_noise_the_maps_are_said_to_carry_no_standard_errors():
    quiet = kim_readings([L(0), L(1)])
    assert quiet[0].startswith("In layers 0 and 1 relativity index") and "depend on position" not in quiet[0]
    assert any("carry no standard errors" in s for s in quiet)
    assert not any("carry no standard errors" in s for s in kim_readings([L(0), L(1)], noise="noise"))


def test_locality_thresholds():
    near, far = "favours nearby keys", "distant keys are favoured"
    assert near in text([L(0, loc=0.31), L(1, loc=0.9)]) and near not in text([L(0, loc=0.3), L(1, loc=0.9)])
    assert far in text([L(0, loc=-0.31), L(1, loc=-0.9)]) and far not in text([L(0, loc=-0.3), L(1, loc=-0.9)])
    assert "clear only in layer 1" in text([L(0, loc=0.3), L(1, loc=0.9)])
    assert "clear only in layer 1" in text([L(0, loc=-0.3), L(1, loc=-0.9)])
    assert "clear only in layers 0 and 2" in text([L(0, loc=-0.5), L(1, loc=0.0), L(2, loc=0.5)])
    assert "No layer shows a clear trend with distance (|locality| ≤ 0.3)" in text([L(0, loc=0.3), L(1, loc=-0.3)])
    none = text([L(0, loc=None), L(1, loc=None)])
    assert "favour" not in none and "No layer shows" not in none
    partial = text([L(0, loc=None), L(1, loc=0.9)])  # a layer without locality is left out, not read as 0
    assert near in partial


def test_relativity_thresholds():
    assert "All of them are purely relative (relativity ≥ 0.98)" in text([L(0, 0.98), L(1, 0.99)])
    assert "purely relative" not in text([L(0, 0.97), L(1, 0.99)])
    drop = text([L(0, 0.99), L(1, 0.949), L(2, 0.9)])
    assert "Layer 0 is purely relative (relativity 0.99); later layers drop to 0.9 (layer 2)" in drop
    no_drop = text([L(0, 0.99), L(1, 0.951)])  # within 0.03 of the threshold: no drop is called
    assert "later layers drop" not in no_drop and "All of them" not in no_drop and "Up to" not in no_drop
    assert "later layers drop" in text([L(0, 0.98), L(1, 0.949)])
    assert "later layers drop" not in text([L(0, 0.99)])  # one layer: nothing later
    assert "Up to 0.125 of the variation is not explained" in text([L(0, 0.875), L(1, 0.95)])
    assert "Up to" not in text([L(0, 0.9), L(1, 0.95)])
    assert "Up to 0.4 of" in text([L(0, 0.6), L(1, 0.95)])  # the lowest layer, not the first


def test_relativity_is_read_from_the_noise_corrected_grid_index_where_every_layer_has_one():
    grid = [L(0, 0.888, grid_relativity_index=0.991, nonrelative_p=0.2),
            L(1, 0.383, grid_relativity_index=0.635, nonrelative_p=0.001), L(2, 0.9, grid_relativity_index=0.95)]
    t = text(grid)
    assert "Layer 0 is purely relative (noise-corrected relativity 0.991); later layers drop to 0.635 (layer 1)" in t
    assert "0.383" not in t.split("later layers drop")[1].split(".")[0]
    part = text([grid[0], L(1, 0.383, nonrelative_p=0.001)])  # one layer without a grid index: the full map's
    assert "Layer 0 is purely relative (relativity 0.888" not in part and "Up to 0.617 of the variation" in part
    assert "(relativity index 0.383)" in part
    low = text([L(0, 0.5, grid_relativity_index=0.8, nonrelative_p=0.001), L(1, 0.5, grid_relativity_index=0.95)])
    assert "Up to 0.2 of the variation is not explained by the distance alone (noise-corrected relativity index 0.8)" in low
    allrel = text([L(0, 0.5, grid_relativity_index=0.99), L(1, 0.5, grid_relativity_index=0.98)])
    assert "All of them are purely relative (noise-corrected relativity ≥ 0.98)" in allrel
    noisy = text([L(0, 0.5, grid_relativity_index=0.9, nonrelative_p=0.5), L(1, 0.5, grid_relativity_index=0.95,
                                                                            nonrelative_p=0.5)])
    assert "The noise-corrected relativity index is as low as 0.9 (layer 0)" in noisy


def test_relativity_without_significance_says_noise():
    layers = [L(0, 0.99, nonrelative_p=0.5), L(1, 0.4, nonrelative_p=0.02), L(2, 0.9, nonrelative_p=0.011)]
    out = text(layers)
    assert "The relativity index is as low as 0.4 (layer 1)" in out and "beyond sampling noise" in out and "in all 3" in out
    assert "later layers drop" not in out and "Up to" not in out
    sig = [L(0, 0.99, nonrelative_p=0.5), L(1, 0.4, nonrelative_p=0.0099)]  # one layer significant
    assert "as low as" not in text(sig) and "later layers drop to 0.4 (layer 1)" in text(sig)
    relative = [L(0, 0.99, nonrelative_p=0.5), L(1, 0.98, nonrelative_p=0.5)]
    assert "All of them are purely relative" in text(relative) and "as low as" not in text(relative)


def test_diagonal_trend_sign_and_significance():
    up = text([L(0, diagonal_trend=0.2), L(1, diagonal_trend=0.1)])
    assert "0.2 → 0.1" in up and "rises to the right on every diagonal" in up
    down = text([L(0, diagonal_trend=-0.2), L(1, diagonal_trend=-0.1)])
    assert "falls to the right on every diagonal" in down
    assert "changes sign between layers" in text([L(0, diagonal_trend=-0.2), L(1, diagonal_trend=0.1)])
    assert "changes sign" in text([L(0, diagonal_trend=0.0), L(1, diagonal_trend=0.1)])
    assert "Signed trend" not in text([L(0), L(1)])
    tested = [L(0, diagonal_trend=-0.2, trend_p=0.5), L(1, diagonal_trend=0.1, trend_p=0.001),
              L(2, diagonal_trend=0.3, trend_p=0.0099)]
    t = text(tested)
    assert "rises to the right on every diagonal in the 2 layer(s) where the trend is significant (p < 0.01)" in t
    allsig = text([L(0, diagonal_trend=-0.2, trend_p=0.001), L(1, diagonal_trend=-0.1, trend_p=0.001)])
    assert "falls to the right on every diagonal;" in allsig or "falls to the right on every diagonal (" in allsig
    nonsig = text([L(0, diagonal_trend=-0.2, trend_p=0.01), L(1, diagonal_trend=0.1, trend_p=0.5)])
    assert "shows no significant trend in any layer" in nonsig


def test_grid_sentence_leads_with_the_noise_corrected_index():
    layers = [L(0, 0.383, grid_relativity_index=0.888, grid_diagonal_trend=0.25, trend_p=0.001, noise_positions=64,
                noise_groups=16),
              L(1, 0.914, grid_relativity_index=1.0, grid_diagonal_trend=-0.5, trend_p=0.2, noise_positions=32,
                noise_groups=16)]
    t = text(layers)
    assert "64-position grid" in t and "trend reads 0.25 → -0.5" in t
    assert "noise-corrected relativity index 0.888 → 1" in t and "significant (p < 0.01) in 1 of 2 layers" in t
    assert "not noise-corrected" not in t and "groups of sequences" not in t  # grid present, 16 groups: enough
    no_p = text([L(0, grid_relativity_index=0.9, grid_diagonal_trend=0.1, noise_positions=8)])
    assert "8-position grid" in no_p and "is significant" not in no_p


def test_noise_shares_of_a_scan_without_grid():
    scan = [L(0, 0.77, within_diag_rms=0.5, within_diag_rms_noise=0.25, noise_positions=128),
            L(1, 0.6, within_diag_rms=0.2, within_diag_rms_noise=0.4, noise_positions=128),
            L(2, 0.6, within_diag_rms=0.2, within_diag_rms_noise=0.4)]  # no noise_positions: not a scan's
    assert noise_shares(scan) == [pytest.approx(0.25), 1.0]
    t = text(scan)
    assert "not noise-corrected" in t and "25 … 100 %" in t
    assert noise_shares([L(0, within_diag_rms=0.0, within_diag_rms_noise=0.1, noise_positions=4)]) == []
    assert noise_shares([L(0, within_diag_rms=0.5, within_diag_rms_noise=None, noise_positions=4)]) == []
    assert noise_shares([L(0, within_diag_rms=0.5, within_diag_rms_noise=0.0, noise_positions=4)]) == [0.0]
    gridded = L(0, within_diag_rms=0.5, within_diag_rms_noise=0.25, noise_positions=4, grid_relativity_index=0.9)
    assert noise_shares([gridded]) == []  # the noise-corrected index is quoted instead


def test_smallest_p_and_too_few_groups():
    assert smallest_p([]) == (0, None) and smallest_p([{"noise_groups": 1}]) == (1, None)
    assert smallest_p([{"noise_groups": 2}, {"noise_groups": 8}]) == (8, 2 / 256)
    assert smallest_p([{"noise_groups": 6}]) == (6, 2 / 64)
    six = few_groups([{"noise_groups": 6}])
    assert "only 6 independent groups" in six and "0.0312" in six and "not below the 0.01" in six
    eight = few_groups([{"noise_groups": 8}])  # 2/256 = 0.0078: under 0.01, but not far under
    assert "0.00781" in eight and "barely below" in eight and "too few sequences" in eight
    assert "barely below" in few_groups([{"noise_groups": 10}])  # 0.00195 * 10 > 0.01
    assert few_groups([{"noise_groups": 11}]) == ""  # 0.000977 * 10 < 0.01
    assert few_groups([{"noise_groups": 16}]) == "" and few_groups([{"noise_groups": 1}]) == "" and few_groups([]) == ""
    t = kim_readings([L(0, noise_groups=6), L(1, noise_groups=6)], noise="sampling noise")
    assert t[0].startswith("In layers 0 and 1 relativity index")  # nothing could be found flat: no claim
    assert any(s.startswith("Only 6 independent groups") for s in t)
    enough = kim_readings([L(0, noise_groups=8), L(1, noise_groups=8)], noise="sampling noise")
    assert "the scores depend on position" in enough[0]


def test_sink_weight_and_theory_sentences():
    t = text([L(0, sink_weight=0.25), L(1, sink_weight=0.5), L(2, sink_weight=None)])
    assert "key 0 (the sink), per layer: 0.25 → 0.5" in t
    sim = text([L(0, theory_max_abs_diff=0.01, max_stderr=0.002), L(1, theory_max_abs_diff=0.03, max_stderr=0.004)])
    assert "to within 0.03 in every layer (largest standard error 0.004)" in sim
    nose = text([L(0, theory_max_abs_diff=0.01)])
    assert "to within 0.01 in every layer;" in nose and "standard error" not in nose
    flat_diff = text([L(0, None, None, theory_max_abs_diff=0.07), L(1)])  # a flat layer's gap counts too
    assert "to within 0.07" in flat_diff
    assert "closed form" not in text([L(0)]) and "sink" not in text([L(0)])


def test_noise_phrase():
    assert noise_phrase([]) == "" and noise_phrase([{"max_stderr": 0.1}]) == "Monte Carlo noise"
    assert noise_phrase([{"noise_groups": 16}]) == "sampling noise (the noise floor of 16 independent groups of samples)"
    assert noise_phrase([{"noise_groups": 1}]) == ""
    assert noise_phrase([{"noise_groups": 2}]) == "sampling noise (the noise floor of 2 independent groups of samples)"
    assert noise_phrase([{"noise_groups": 4, "max_stderr": 0.1}, {"noise_groups": 8}]).startswith(
        "Monte Carlo noise (the noise floor of 8 independent")
    grid = noise_phrase([{"noise_groups": 16, "noise_positions": 64, "grid_relativity_index": 0.9},
                         {"noise_positions": 32}, "x"])
    assert grid.endswith("of 16 independent groups of samples, on a 64-position grid)")
    assert "grid" not in noise_phrase([{"noise_groups": 16, "noise_positions": 64}])


# --------------------------------------------------------------------------------------------
# the key finding
# --------------------------------------------------------------------------------------------
def finding(layers, **summary):
    return key_findings([("run", "scan", ["kim"], {"layers": layers, **summary})])["kim"][0]


def test_kim_finding_plain():
    f = finding([L(0, 0.5, 0.2), L(1, 0.25, 0.4), L(2, None, None), {"layer": 3}])
    assert f.startswith("run: relativity index 0.25 … 0.5 over 2 layer(s), lowest in layer 1; locality 0.2 … 0.4")
    assert "; 1 flat layer(s)" in f and f.endswith(".") and "trend" not in f and "noise" not in f
    assert "(key 0 excluded)" in finding([L(0, relativity_index_with_sink=None)])
    assert "flat layer" not in finding([L(0)])
    assert "; locality –." in finding([L(0, loc=None)])  # no locality: a dash, not a number
    assert finding([L(0, None, None), L(1, None, None)]) == "run: every one of 2 layers is flat (no positional " \
                                                          "information in the scores)."
    assert key_findings([("run", "scan", ["kim"], {"layers": [{"layer": 0}]})]) == {}
    tr = finding([L(0, diagonal_trend=-0.125), L(1, diagonal_trend=0.25)])
    assert "; diagonal trend -0.125 … 0.25." in tr
    trp = finding([L(0, diagonal_trend=-0.125, trend_p=0.001), L(1, diagonal_trend=0.25, trend_p=0.5)])
    assert ("diagonal trend -0.125 … 0.25 (significant (p < 0.01) in 1 of 2 layers, 1 at a false discovery rate of 0.01 over the 2 (Benjamini–Hochberg))") in trp
    nr = finding([L(0, nonrelative_p=0.001), L(1, nonrelative_p=0.01)])
    # BH over two: 0.001 · 2/1 = 0.002 < 0.01 stays; 0.01 is not below 0.01 either way
    assert ("over 2 layer(s), not purely relative (p < 0.01) in 1 of 2 layers, 1 at a false discovery rate of 0.01 over the 2 (Benjamini–Hochberg), lowest") in nr
    one = finding([L(0, nonrelative_p=0.001)])
    assert "not purely relative (p < 0.01) in 1 of 1 layer, lowest" in one and "Benjamini" not in one


def test_kim_finding_leads_with_the_grid_index():
    layers = [L(0, 0.888, grid_relativity_index=0.991, nonrelative_p=0.195, noise_positions=64, noise_groups=8),
              L(1, 0.383, grid_relativity_index=0.635, nonrelative_p=0.001, noise_positions=64, noise_groups=8),
              L(2, 0.914)]
    f = finding(layers)
    assert f.startswith("run: noise-corrected relativity index 0.635 … 0.991 on a 64-position grid over 2 layer(s)")
    assert "not purely relative (p < 0.01) in 1 of 2 layers" in f
    assert "full-map index 0.383 … 0.914 (not noise-corrected), lowest in layer 1" in f
    # 8 groups: the smallest p is 2/2^8 = 0.0078, not far under 0.01
    assert "only 8 independent groups" in f and "0.00781" in f and f.endswith("relativity.")


def test_kim_finding_of_a_scan_without_grid_gives_the_noise_floor():
    layers = [L(0, 0.77, within_diag_rms=0.5, within_diag_rms_noise=0.4, noise_positions=128, noise_groups=6,
                nonrelative_p=0.156),
              L(1, 0.37, within_diag_rms=0.5, within_diag_rms_noise=0.45, noise_positions=128, noise_groups=6,
                nonrelative_p=0.031)]
    f = finding(layers)
    assert f.startswith("run: relativity index 0.37 … 0.77 over 2 layer(s) (full map, not noise-corrected: "
                        "sampling noise alone gives 64 … 81 % of the within-diagonal variation)")
    assert "not purely relative (p < 0.01) in 0 of 2 layers, 0 at" in f and "lowest in layer 1" in f
    assert "only 6 independent groups" in f and "not below the 0.01 threshold" in f


def test_kim_finding_is_the_run_readings_entry():
    layers = [L(0, 0.5, 0.25), L(1, 0.75, 0.5)]
    summary = {"layers": layers}
    assert run_readings("scan", ["kim", "slash"], summary, "kim") == kim_readings(layers)
    assert run_readings("scan", ["kim"], {"layers": layers, "readings": ["own"]}, "kim") == ["own"]
    assert run_readings("scan", ["kim", "slash"], {"layers": [{"layer": 0}], "readings": ["own"]}, "kim") == ["own"]


def test_fdr_count_against_hand_computed_benjamini_hochberg():
    from poslens.reporting.readings.common import fdr_count

    # BH: sort p ascending, reject the k smallest for the largest k with p_(k) <= k/m · q
    # m = 4, q = 0.01: thresholds 0.0025, 0.005, 0.0075, 0.01
    assert fdr_count([0.002, 0.004, 0.0074, 0.5]) == 3  # p_(3) = 0.0074 <= 0.0075
    assert fdr_count([0.002, 0.006, 0.008, 0.5]) == 1  # p_(2) = 0.006 > 0.005, p_(3) = 0.008 > 0.0075
    assert fdr_count([0.003, 0.004, 0.5, 0.9]) == 2  # step-up: p_(1) = 0.003 > 0.0025 but p_(2) <= 0.005
    assert fdr_count([0.009]) == 1 and fdr_count([0.011]) == 0 and fdr_count([]) == 0


def test_the_count_of_non_relative_layers_is_corrected_for_testing_every_layer():
    """Eight groups give every sign-flip test the same smallest p (2/2^8 = 0.0078): 13 of 30 layers at that
    p are each "significant" at 0.01, but none is once the false discovery rate over the 30 is held at 0.01
    (0.0078 · 30/13 = 0.018)."""
    layers = [L(i, 0.6, grid_relativity_index=0.7, nonrelative_p=0.0078125 if i < 13 else 0.5,
                noise_positions=64, noise_groups=8) for i in range(30)]
    f = finding(layers)
    assert ("not purely relative (p < 0.01) in 13 of 30 layers, 0 at a false discovery rate of 0.01 over the 30 "
            "(Benjamini–Hochberg)") in f
    # with 16 groups the smallest p is 3e-5: all 13 survive the correction
    strong = [dict(l, nonrelative_p=2 / 2**16 if l["nonrelative_p"] < 0.01 else 0.5, noise_groups=16) for l in layers]
    assert "in 13 of 30 layers, 13 at a false discovery rate" in finding(strong)


def test_a_scan_whose_noise_grid_is_the_whole_map_leads_with_the_corrected_index():
    layers = [L(0, 0.7, relativity_index_noise_corrected=True, relativity_index_uncorrected=0.5, noise_positions=64,
                noise_groups=16, within_diag_rms=0.5, within_diag_rms_noise=0.4, nonrelative_p=1e-4),
              L(1, 0.9, relativity_index_noise_corrected=True, relativity_index_uncorrected=0.8, noise_positions=64,
                noise_groups=16, within_diag_rms=0.5, within_diag_rms_noise=0.1, nonrelative_p=0.2)]
    f = finding(layers)
    assert f.startswith("run: noise-corrected relativity index 0.7 … 0.9 over 2 layer(s) (full map), not purely "
                        "relative (p < 0.01) in 1 of 2 layers")
    assert "not noise-corrected" not in f
    assert noise_shares(layers) == []
    t = text(layers)
    assert "not noise-corrected" not in t and "noise-corrected relativity index 0.7 → 0.9" in t
    assert "noise-corrected" not in text([L(0, 0.7), L(1, 0.9)])
