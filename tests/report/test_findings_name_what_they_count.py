"""Findings name what they count and which number they quote: both counts of a share, the exceptions
of a long list of layers, a head as "layer L, head H", the slash summary in words, the sink's chance
level as one value with its formula, and which APS (head outputs or residual stream) a sentence means."""

from __future__ import annotations

import re

from poslens.metrics.verdicts import SINK_CHANCE_FORMULA, uniform_sink_weight


def _cond(layer: int, mean: float, beyond: bool) -> dict:
    return {"intervention": "nope", "layers": [layer], "applies": True, "beyond_noise": beyond,
            "delta": {"mean": mean, "se": 0.01}, "buckets": []}


def test_ablate_names_both_counts():
    from poslens.reporting.readings.ablate import findings

    summary = {"num_layers": 30, "interventions": ["nope"], "level": 0.01,
               "conditions": [_cond(l, 0.5 if l < 2 else 0.001, l < 2) for l in range(30)]}
    text = " ".join(findings(summary))
    assert "2 of 30 layers change" not in text
    assert re.search(r"of the 30 layers \w+ .*?, 2 change", text), text  # 30 tested, 2 of them beyond the noise


def test_a_long_list_of_clear_layers_names_the_exceptions():
    from poslens.reporting.readings.kim import _kim_locality

    strong = [l for l in range(30) if l not in (3, 7, 12)]
    text = " ".join(_kim_locality({"code": "some", "strong": strong, "layers": list(range(30)), "threshold": 0.1}))
    assert "(0, 1, 2, …, 29)" not in text
    assert "27 of 30" in text and re.search(r"\b3, 7 and 12\b", text), text


def test_a_head_is_layer_and_head_in_words_and_the_sink_chance_has_its_formula():
    from poslens.metrics.judge.fingerprint import judge_claims
    from poslens.reporting.readings.fingerprint import render_findings
    from tests.analysis.test_fingerprint import _head, _record

    m = _record(slash_heads=[_head(True, layer=16, head=0)], seq_len=128)
    findings = render_findings(judge_claims([m], {"sink_eps": 0.3, "slash_kappa": 0.3}))
    text = " ".join(r["text"] for f in findings for r in f["models"])
    assert "layer.head" not in text and "16.0" not in text and "layer 16, head 0" in text
    chance = f"{100 * uniform_sink_weight(128):.1f}%"
    assert chance == "3.5%" and f"{chance} ({SINK_CHANCE_FORMULA}, at S = 128)" in text


def test_the_slash_summary_is_in_words():
    from poslens.reporting.readings.commands import slash_command_readings
    from tests.report.test_readings_commands import _head

    heads = [_head(0, 0, 1, 0.5)] + [_head(i, 0, 1, 0.05) for i in range(1, 4)]
    text = " ".join(slash_command_readings({"heads": heads, "kappas": [0.1, 0.3], "delta_range": [1, 8],
                                            "seq_len": 16}))
    assert "-slash-dominant" not in text and "κ" not in text and "0.3" in text


def test_every_aps_sentence_names_which_aps():
    from poslens.reporting.readings.findings import _neighborhood_finding
    from poslens.reporting.readings.neighborhood import render_neighborhood

    layers = [{"layer": "embeddings", "aps_mean": 0.5}] + [{"layer": l, "aps_mean": 0.62} for l in range(2)]
    heads = _neighborhood_finding("n", "neighborhood", {"layers": layers})
    resid = _neighborhood_finding("s", "scan", {"layers": layers})
    assert "head outputs" in heads and "residual stream" in resid
    j = {"layers": [0, 1], "aps": [0.62, 0.63], "embeddings": 0.5, "per_seq": True, "control": "first", "attn": 0.9,
         "norms": []}
    for sentence in render_neighborhood(j):
        if "APS" in sentence or "djacency" in sentence:
            assert "residual stream" in sentence or "attention outputs" in sentence, sentence
