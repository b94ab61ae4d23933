"""One verdict rule for every claim: a claim that does not apply to a model is not judged, with its
reason; a claim that applies is reproduced or not by its numbers alone, so a value at or under the
noise floor is not reproduced whether the model has RoPE or not."""

from __future__ import annotations

from poslens.metrics import verdicts as V
from poslens.metrics.judge.fingerprint import judge_claims


def _record(rope: bool) -> dict:
    """A 2-layer model whose maps show no position and no departure from relativity beyond the noise."""
    layers = [{"layer": l, "rope": rope, "nonrelative_p": 0.5, "flat_p": 0.5, "flat": False, "aps_mean": 0.5,
               "aps_std": 0.05, "noise_groups": 16} for l in range(2)]
    overall = {"sink_rate": 0.0, "sink_rate_random": 0.0, "relativity_median": 1.0, "aps_min": 0.5, "aps_max": 0.5,
               "freq": {"high": 0.0, "medium": 0.0, "low": 0.0, "unrotated": 0.0}, "massive_q": 0, "massive_k": 0,
               "massive_q_low": 0, "massive_k_low": 0, "massive_q_low_share": None, "massive_k_low_share": None}
    return {"name": "rope" if rope else "nope", "num_layers": 2, "num_heads": 2, "seq_len": 64, "num_seqs": 16,
            "massive_lambda": 5.0, "layers": layers, "overall": overall, "slash_heads": [],
            "rope_layers": [0, 1] if rope else []}


def _kim(rope: bool) -> dict:
    return judge_claims([_record(rope)], {"sink_eps": 0.3, "slash_kappa": 0.3}, keys=("kim",))[0]["models"][0]


def test_a_value_under_the_floor_is_not_reproduced_with_rope_and_without():
    nope, rope = _kim(False), _kim(True)
    assert nope["value"] == rope["value"] == 0.0  # the same measurement: no layer beyond its noise floor
    assert nope["value"] <= nope["floor"] and rope["value"] <= rope["floor"]
    assert nope["verdict"] == rope["verdict"] == V.NOT_REPRODUCED


def test_a_claim_that_does_not_apply_is_not_judged_with_its_reason():
    m = _record(False)
    for r in m["layers"]:
        r.pop("flat_p")  # no noise floor: the claim cannot be tested on this scan
    kim = judge_claims([m], {"sink_eps": 0.3, "slash_kappa": 0.3}, keys=("kim", "zuo", "barbero"))
    codes = {f["claim"]: (f["models"][0]["verdict"], f["models"][0]["reason"]) for f in kim}
    assert codes["kim"] == (V.NOT_JUDGED, "no_noise_floor")
    assert codes["barbero"] == (V.NOT_JUDGED, "no_rope")  # no RoPE: nothing to place
    assert judge_claims([_record(True)], {"sink_eps": 0.3, "slash_kappa": 0.3},
                        keys=("zuo",))[0]["models"][0]["reason"] == "all_rope"


def test_the_rule_itself():
    n = V.measured(0.0, 0.0, 0.05, 0.1, "x")
    assert V.rule(n) == V.NOT_REPRODUCED and V.rule(n, "no_rope") == V.NOT_JUDGED
    assert V.rule(V.measured(None, 0.0, 0.05, 0.1, "x")) == V.NOT_JUDGED
    assert V.rule(V.measured(0.5, 0.0, 0.05, 0.1, "x")) == V.REPRODUCED
