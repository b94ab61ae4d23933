"""The readings' small helpers and the slash reading, each branch given numbers on both sides of
its threshold; expected numbers are computed here by hand or by plain loops."""

import math

import pytest

from poslens.fmt import fmt

from poslens.conventions import NORM_SHRINK
from poslens.metrics.judge.papers import judge_slash, norm_trend
from poslens.metrics.verdicts import uniform_slash
from poslens.reporting.readings.common import (_decoder_layers, _layers_phrase, _series_short, layer_aps,
                                               layer_slash_head)
from poslens.metrics.judge.papers import num
from poslens.reporting.readings.neighborhood import norm_phrase
from poslens.reporting.readings.slash import slash_readings, slash_top


def test_num_reads_finite_numbers_only():
    assert num(3) == 3.0 and num("2.5") == 2.5 and num(0) == 0.0
    for bad in (None, True, False, "x", float("nan"), float("inf"), -float("inf"), [1]):
        assert num(bad) is None


def test_layer_aps_prefers_the_per_sequence_value():
    assert layer_aps({"aps_mean": 0.7, "aps_std": 0.1, "mean_map_aps": 0.9}) == (0.7, 0.1)
    assert layer_aps({"aps_mean": 0.0, "mean_map_aps": 0.9}) == (0.0, None)  # 0 is a value, not missing
    assert layer_aps({"aps_mean": None, "mean_map_aps": 0.9, "aps": 0.8}) == (0.9, None)
    assert layer_aps({"aps": 0.8}) == (0.8, None)
    assert layer_aps({}) == (None, None)


def test_layer_slash_head_offsets_one_to_max():
    heads = [{"offset": 0, "score": 0.99}, {"offset": 1, "score": 0.3}, {"offset": 16, "score": 0.5},
             {"offset": 17, "score": 0.98}, {"offset": 2, "score": None}, {"offset": 2.0, "score": 0.97}, "x"]
    assert layer_slash_head({"top_slash_heads": heads}) == {"offset": 16, "score": 0.5}
    assert layer_slash_head({"top_slash_heads": heads}, max_delta=15) == {"offset": 1, "score": 0.3}
    assert layer_slash_head({"top_slash_heads": heads[:1]}) is None
    assert layer_slash_head({}) is None and layer_slash_head({"top_slash_heads": None}) is None


def test_layers_phrase():
    ids = [[4], [1, 3], [1, 3, 5], [0, 1, 2], [0, 1, 2, 3], [0, 2, 4, 6, 8, 10], [0, 2, 4, 6, 8, 10, 12],
           ["embeddings", 0, 1, 2]]
    assert [_layers_phrase(i) for i in ids] == [
        "layer 4", "layers 1 and 3", "layers 1, 3 and 5",
        "layers 0, 1 and 2",  # three in a row are listed
        "layers 0 … 3", "layers 0, 2, 4, 6, 8 and 10", "7 layers (0, 2, 4, …, 12)", "layers embeddings, 0, 1 and 2"]


def test_series_short():
    assert _series_short([0.1, 0.2]) == "0.1 → 0.2"
    six = [1, 2, 3, 4, 5, 6]
    assert _series_short(six).count("→") == 5
    seven = [0.5, 0.25, 3, 4, 5, 6, -1]
    s = _series_short(seven)
    assert s.startswith("0.5 → 0.25 → … → -1") and "range -1 … 6" in s
    assert "range" not in _series_short([None] * 7)
    assert _series_short(seven, max_items=7).count("→") == 6


def test_decoder_layers_split():
    emb, dec = _decoder_layers([{"layer": "embeddings"}, {"layer": 0}, {"layer": True}, "x", {"layer": 1}])
    assert emb == {"layer": "embeddings"} and dec == [{"layer": 0}, {"layer": 1}]
    assert _decoder_layers(None) == (None, [])


def test_uniform_slash_is_the_mean_of_one_over_i():
    # uniform causal attention: row i (1-indexed) puts 1/i on each key; offset d is seen by rows d+1..n
    for n, d in ((5, 0), (5, 1), (10, 3), (7, 6)):
        rows = [1.0 / i for i in range(1, n + 1) if i - 1 >= d]
        assert uniform_slash(n, d) == pytest.approx(sum(rows) / len(rows), rel=1e-14)
    assert math.isnan(uniform_slash(4, 4)) and math.isnan(uniform_slash(3, 5))


def test_slash_top_sources_in_order():
    good = [{"offset": 2, "score": 0.4, "layer": 1}, {"offset": 20, "score": 0.9, "layer": 2}]
    assert slash_top({"slash_heads": good}) == good[0]
    assert slash_top({"slash_heads": [], "slash_top_heads_offset_ge1": good[::-1]}) == good[0]
    assert slash_top({"slash_top_heads": [{"offset": 3, "score": 0.2}, {"offset": 1, "score": 0.25}]})["offset"] == 1
    layers = [{"top_slash_heads": [{"offset": 1, "score": 0.1}]}, {"top_slash_heads": [{"offset": 4, "score": 0.6}]},
              "x"]
    assert slash_top({"layers": layers}) == {"offset": 4, "score": 0.6}
    assert slash_top({"layers": layers}, max_delta=3) == {"offset": 1, "score": 0.1}
    assert slash_top({}) is None


def _slash_summary(score, offset=1, n=10, **kw):
    return {"seq_len": n, "slash_heads": [{"layer": 3, "head": 2, "offset": offset, "score": score}], **kw}


def test_slash_judge_ratio_against_uniform_attention():
    n, d = 10, 1
    base = sum(1.0 / i for i in range(d + 1, n + 1)) / (n - d)
    strong = judge_slash(s := _slash_summary(2.5 * base, d, n), slash_top(s))
    assert strong["code"] == "slash" and strong["head"]["ratio"] == pytest.approx(2.5)
    assert strong["head"]["uniform"] == pytest.approx(base, rel=1e-14) and strong["head"]["score"] == 2.5 * base
    assert (strong["head"]["layer"], strong["head"]["head"], strong["head"]["offset"]) == (3, 2, 1)
    three = sum(1.0 / i for i in range(4, n + 1)) / (n - 3)  # uniform attention at Δ = 3, by hand
    at3 = judge_slash(s := _slash_summary(2.5 * three, 3, n), slash_top(s))
    assert at3["head"]["offset"] == 3 and at3["head"]["ratio"] == pytest.approx(2.5)
    weak = judge_slash(s := _slash_summary(1.5 * base, d, n), slash_top(s))
    assert weak["code"] == "weak" and weak["head"]["ratio"] == pytest.approx(1.5)
    edge = judge_slash(s := _slash_summary(2.0 * base, d, n), slash_top(s))  # exactly twice: a slash
    assert edge["code"] == "slash"
    no_len = judge_slash(s := _slash_summary(0.5, d, 0), slash_top(s))
    assert no_len["code"] is None and no_len["head"]["ratio"] is None
    assert judge_slash({}, None) == {"head": None, "code": None, "sink": None, "rank_one": None}


def test_slash_judge_sink_and_rank_one():
    s = {"sink_weight": 0.83, "layers": [{"layer": 0, "q_top1_energy": [0.2, 0.5]},
                                         {"layer": 4, "q_top1_energy": [0.9, None, 0.1]}, {"layer": 5}, "x",
                                         {"layer": 6, "q_top1_energy": 0.99}]}
    j = judge_slash(s, slash_top(s))
    assert j["head"] is None and j["sink"] == 0.83 and j["rank_one"] == {"layer": 4, "energy": 0.9}


def test_rendering_the_slash_readings_quotes_the_numbers():
    n, d = 10, 1
    base = sum(1.0 / i for i in range(d + 1, n + 1)) / (n - d)
    strong = slash_readings(_slash_summary(2.5 * base, d, n))
    weak = slash_readings(_slash_summary(1.5 * base, d, n))
    s = slash_readings({"sink_weight": 0.83, "layers": [{"layer": 4, "q_top1_energy": [0.9, None, 0.1]}]})
    assert (len(strong) == 2 and f"layer 3 head 2 puts {fmt(2.5 * base)} of its attention on the token 1 position(s) "
            f"back; uniform causal attention would put {fmt(base)} there (ratio 2.5)" in strong[0]
            and "2.5× more concentrated" in strong[1] and weak[1].startswith("No head is clearly slash-dominant")
            and "averages 0.83" in s[0] and "layer 4" in s[1] and "holds 0.9 of the energy" in s[1])
    assert len(slash_readings(_slash_summary(0.5, d, 0))) == 1 and "ratio" not in slash_readings(_slash_summary(0.5, d, 0))[0]
    assert slash_readings({}) == []


def test_norm_trend_thresholds():
    assert NORM_SHRINK == 0.7
    assert norm_trend(0.7) == norm_trend(0.95) == "shrink"
    assert norm_trend(0.69) == norm_trend(0.31) == norm_trend(0.3 + 1e-12) == "steady"
    assert norm_trend(0.3) == norm_trend(0.0) == "grow"
    assert (norm_phrase(0.7), norm_phrase(0.5), norm_phrase(0.3)) == (
        "norms shrink with position, as running means do", "norms do not change consistently with position",
        "norms grow with position")
