"""The one verdict rule (value beyond chance and the noise floor by a threshold) and the fingerprint's
findings built on it, on hand-made model records whose numbers are known."""

from __future__ import annotations

import math

import pytest

from poslens.metrics import verdicts as V
from poslens.metrics.judge.fingerprint import FAST_BANDS, RANK_ONE, judge_claims


def test_z_and_floors_closed_form():
    assert V.z(0.01) == pytest.approx(2.3263, abs=1e-4)
    assert V.binomial_floor(0.01, 30) == pytest.approx(0.01 + 2.3263 * math.sqrt(0.01 * 0.99 / 30), abs=1e-4)
    assert V.binomial_floor(0.0, 50) == 0.0  # no item passes by chance: no noise beyond it
    assert V.binomial_floor(0.3, 0) == 0.3
    assert V.mean_floor(0.5, 0.01) == pytest.approx(0.5 + 0.023263, abs=1e-5)
    assert V.mean_floor(0.5, None) == 0.5


def test_bh_matches_the_step_up_rule():
    # BH at q: sorted p_(k) <= k q / m; the largest such k and every smaller p is kept
    ps = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216]
    q = 0.05
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    k = max([r + 1 for r, i in enumerate(order) if ps[i] <= (r + 1) * q / m], default=0)
    expect = [False] * m
    for i in order[:k]:
        expect[i] = True
    assert V.bh_significant(ps, q) == expect
    assert V.bh_significant([], q) == []


def test_rule_needs_the_threshold_beyond_both():
    assert V.beyond(0.75, 0.62, 0.64, 0.1)
    assert not V.beyond(0.64, 0.62, 0.60, 0.1)  # beyond chance and floor, but by less than the threshold
    assert not V.beyond(0.80, 0.62, 0.75, 0.1)  # the floor, not chance, is what it must clear
    assert not V.beyond(None, 0.0, 0.0, 0.1)
    assert V.measured(0.8, 0.6, 0.65, 0.1, "x")["margin"] == pytest.approx(0.15)


def _layer(i, *, rope=True, low=0.64, fast=(0.18, 0.18), nonrel_p=0.5, flat_p=1e-4, aps=(0.52, 0.02), dims=None):
    H = 2
    return {"layer": i, "type": "rope" if rope else "no_rope", "rope": rope, "relativity_index": 1.0,
            "flat": flat_p >= 0.01, "flat_p": flat_p, "nonrelative_p": nonrel_p, "aps_mean": aps[0], "aps_std": aps[1],
            "freq_heads": {"high": [fast[0]] * H, "medium": [fast[1]] * H, "low": [low] * H, "unrotated": [0.0] * H},
            "dims_by_band": dims or {"high": 4, "medium": 2, "low": 10, "unrotated": 0}}


def _model(layers, *, slash=(), sink_rate=0.0, massive=(0, 0, 0, 0), name="m"):
    mq, mk, mql, mkl = massive
    return {"name": name, "num_layers": len(layers), "num_heads": 2, "head_dim": 16, "seq_len": 128, "num_seqs": 16,
            "rope_layers": [l["layer"] for l in layers if l["rope"]], "layers": layers, "slash_heads": list(slash),
            "massive_lambda": 5.0,
            "overall": {"sink_rate": sink_rate, "sink_rate_random": sink_rate, "relativity_median": 1.0,
                        "aps_min": min(l["aps_mean"] for l in layers), "aps_max": max(l["aps_mean"] for l in layers),
                        "freq": {"high": 0.18, "medium": 0.18, "low": 0.64, "unrotated": 0.0},
                        "massive_q": mq, "massive_k": mk, "massive_q_low": mql, "massive_k_low": mkl,
                        "massive_q_low_share": mql / mq if mq else None, "massive_k_low_share": mkl / mk if mk else None}}


_PAPERS = {"sink": "Gu", "kim": "Kim", "slash": "Cheng", "zuo": "Zuo", "barbero": "Barbero", "jin": "Jin"}


def _by_paper(models):
    out = judge_claims(models, {"sink_eps": 0.3, "slash_kappa": 0.3})
    return {_PAPERS[f["claim"]]: {m["name"]: m for m in f["models"]} for f in out}


def test_low_band_at_its_share_of_dimensions_is_not_reproduced():
    # 64 % of the energy in the low band where 10 / 16 = 62.5 % of the dims lie: about uniform
    f = _by_paper([_model([_layer(0, low=0.64), _layer(1, low=0.64)])])["Barbero"]["m"]
    assert f["chance"] == pytest.approx(10 / 16)
    assert f["verdict"] == V.NOT_REPRODUCED
    g = _by_paper([_model([_layer(0, low=0.9, fast=(0.05, 0.05)), _layer(1, low=0.88, fast=(0.06, 0.06))])])
    assert g["Barbero"]["m"]["verdict"] == V.REPRODUCED


def test_small_aps_above_half_is_not_the_adjacency_pattern():
    tiny = _model([_layer(0, rope=False, aps=(0.52, 0.02)), _layer(1, rope=False, aps=(0.53, 0.02))])
    strong = _model([_layer(0, rope=False, aps=(0.9, 0.05)), _layer(1, rope=False, aps=(0.95, 0.03))], name="s")
    f = _by_paper([tiny, strong])["Zuo"]
    assert f["m"]["verdict"] == V.NOT_REPRODUCED and f["m"]["value"] > f["m"]["floor"]  # beyond noise, too small
    assert f["s"]["verdict"] == V.REPRODUCED and f["s"]["chance"] == 0.5


def test_layer_tests_are_held_at_one_false_discovery_rate():
    # 30 layers at p = 0.02: each below 0.05, none below 0.01 after Benjamini–Hochberg
    weak = _model([_layer(i, nonrel_p=0.02) for i in range(30)])
    strong = _model([_layer(i, nonrel_p=1e-4) for i in range(30)], name="s")
    f = _by_paper([weak, strong])["Kim"]
    assert f["m"]["value"] == 0 and f["m"]["verdict"] == V.NOT_REPRODUCED
    assert f["s"]["value"] == 1 and f["s"]["verdict"] == V.REPRODUCED


def test_every_reproduced_verdict_carries_its_numbers_and_clears_them():
    slash = [{"layer": 1, "head": h, "delta": 1, "score": 0.6, "score_random": 0.5, "persists": True,
              "q_top1_energy": 0.9, "k_top1_energy": 0.9, "predicted_delta": 1} for h in range(2)]
    m = _model([_layer(0, low=0.9, fast=(0.05, 0.05), nonrel_p=1e-4), _layer(1, low=0.9, fast=(0.05, 0.05),
                nonrel_p=1e-4)], slash=slash, sink_rate=0.75, massive=(10, 4, 10, 4))
    seen = 0
    for paper in _by_paper([m]).values():
        f = paper["m"]
        for k in ("value", "chance", "floor", "threshold"):
            assert k in f
        if f["verdict"] == V.REPRODUCED:
            seen += 1
            assert f["value"] - max(f["chance"], f["floor"]) >= f["threshold"]
    assert seen >= 3  # sinks, Kim, Cheng, Jin (Barbero: the slash heads lean on the fast pairs no more than the rest)
    cheng = _by_paper([m])["Cheng"]["m"]
    # the paper's two conditions are stated beside the verdict, each against its chance level
    conds = {c["condition"]: c for c in cheng["conditions"]}
    assert conds[RANK_ONE]["met"] and conds[RANK_ONE]["chance"] == pytest.approx(1 / 16)
    assert not conds[FAST_BANDS]["met"]
    assert conds[FAST_BANDS]["chance"] == pytest.approx(6 / 16)


def test_too_few_sequence_groups_cannot_judge_the_layers():
    # 4 groups: the sign-flip test's smallest p-value is 2 / 16 = 0.125, never below 0.01
    layers = [{**_layer(i, nonrel_p=0.125), "noise_groups": 4} for i in range(4)]
    f = _by_paper([_model(layers)])["Kim"]["m"]
    assert f["verdict"] == V.NOT_JUDGED and f["reason"] == "few_groups" and (f["groups"], f["p_min"]) == (4, 2 / 16)
    layers = [{**_layer(i, nonrel_p=0.5), "noise_groups": 16} for i in range(4)]
    assert _by_paper([_model(layers)])["Kim"]["m"]["verdict"] == V.NOT_REPRODUCED
    # 8 groups: 2 / 256 lies under 0.01 but not ten times under it; finding nothing is no verdict ...
    layers = [{**_layer(i, nonrel_p=0.5), "noise_groups": 8} for i in range(4)]
    f = _by_paper([_model(layers)])["Kim"]["m"]
    assert f["verdict"] == V.NOT_JUDGED and f["reason"] == "few_groups" and f["groups"] == 8
    # ... while what such a test does find stands
    layers = [{**_layer(i, nonrel_p=2 / 256), "noise_groups": 8} for i in range(4)]
    assert _by_paper([_model(layers)])["Kim"]["m"]["verdict"] == V.REPRODUCED


def test_a_report_of_plain_scans_leads_with_the_fingerprints_findings(tmp_path):
    """Scans of one model on text and on random tokens: the report's plain findings give the sink, the
    relativity verdict and the slash heads' persistence, each with the numbers of the one rule."""
    import sys
    from pathlib import Path

    import torch
    import transformers as tf

    import poslens
    from poslens.reporting import collect
    from poslens.reporting.plain import scan_findings

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from archs import tiny_config

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(tiny_config("llama")).eval()
    poslens.scan(model, data=torch.randint(3, 100, (8, 24)), out=tmp_path / "text", progress=False)
    poslens.scan(model, data="random", seq_len=24, num_seqs=8, out=tmp_path / "rnd", progress=False)
    runs, _ = collect([tmp_path / "text", tmp_path / "rnd"])
    blocks = scan_findings(runs)
    assert [b["paper"].split()[0] for b in blocks] == ["Gu", "Kim", "Cheng"]
    for b in blocks:
        (m,) = b["models"]  # one model: the random-token scan is paired with the text scan, not listed
        assert {"value", "chance", "floor", "threshold", "verdict"} <= set(m)
        if m["verdict"] == V.REPRODUCED:
            assert m["value"] - max(m["chance"], m["floor"]) >= m["threshold"]
    sink = blocks[0]["models"][0]
    heads = poslens.load(tmp_path / "text").heads()
    assert sink["value"] == pytest.approx(float((heads["sink"] > 0.3).mean()))
    html = poslens.report([tmp_path / "text", tmp_path / "rnd"], tmp_path / "r.html").read_text()
    assert html.index("Gu et al.") < html.index("Per run, in the papers")


def test_comparison_lines_keep_one_colour_per_run_and_a_legend_off_the_data():
    from poslens.reporting.plots import layer_lines

    panels = [{"title": "a", "series": [{"label": "deep", "layers": list(range(30)), "values": [0.8] * 30},
                                        {"label": "shallow", "layers": [0, 1], "values": [1.0, 0.9]}]},
              {"title": "b", "series": [{"label": "shallow", "layers": [0, 1], "values": [0.2, 0.3]},
                                        {"label": "deep", "layers": list(range(30)), "values": [0.5] * 30}]}]
    fig = layer_lines(panels)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    colour = [{l.get_label(): l.get_color() for l in ax.get_lines()} for ax in axes]
    assert colour[0]["deep"] == colour[1]["deep"] and colour[0]["shallow"] == colour[1]["shallow"]
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1  # one legend, beside the panels
    assert "normalised depth" in axes[0].get_xlabel() and max(axes[0].get_lines()[0].get_xdata()) == 1.0
