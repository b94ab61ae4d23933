"""The fingerprint's verdicts on six papers' claims, as numbers and codes.

Each judge reads one model record (``fingerprint.json``'s ``models[i]``, or the record
:mod:`poslens.reporting.plain` builds from plain scans) and returns the claim's verdict record: the
numbers of :func:`poslens.metrics.verdicts.measured` (``value``, ``chance``, ``floor``, ``threshold``,
``margin``, ``level``, ``measure``), the ``verdict`` (one of :data:`poslens.metrics.verdicts.VERDICTS`),
a ``reason`` code where the verdict needs one (why a claim is not judged, or which of several reasons
holds) and the numbers a reading of the verdict quotes. The sentences are
:mod:`poslens.reporting.readings.fingerprint`'s.

Every judge applies one rule (:func:`poslens.metrics.verdicts.rule`): a claim that does not apply to
the model is ``not_judged`` with the reason; a claim that applies is ``reproduced`` or
``not_reproduced`` by its numbers alone (at or under the noise floor: not reproduced).

Reasons a claim is not judged: ``no_bos`` (sink: the sequences do not begin with the model's
start-of-text token), ``no_noise_floor`` (too few sequences for a noise floor, or a single layer),
``few_groups`` (the sign-flip tests cannot reach the level), ``no_slash_heads``, ``no_random_scan``,
``all_rope`` (Zuo et al.: every layer rotates q/k), ``no_rope``, ``no_massive_or_rope``. Reasons a claim
that applies falls short (``not_reproduced``): ``not_most`` (some layers depart beyond their noise
floor, not most), ``mask_below_floor`` (no RoPE: the mask's signal stays under the noise floor),
``small`` / ``no_order`` (APS beyond noise but small / not beyond noise), ``low_not_first`` /
``slash_not_fast`` (Barbero et al.: the slow pairs carry no more than their share / the slash heads do
not lean on the fast pairs).
"""

from __future__ import annotations

import math
import statistics

from poslens.metrics import verdicts as V
from poslens.metrics.judge.papers import too_few_groups
from poslens.metrics.verdicts import uniform_sink_weight, uniform_slash

#: the claims judged, in the page's order
CLAIM_KEYS = ("sink", "kim", "slash", "zuo", "barbero", "jin")
#: the two conditions of Cheng et al.'s slash heads (:func:`slash_conditions`)
RANK_ONE, FAST_BANDS = "rank_one", "fast_bands"


def _judged(verdict: str, n: dict, reason: str | None = None, **numbers) -> dict:
    return {**n, **numbers, "verdict": verdict, "reason": reason}


def _ruled(n: dict, not_applicable: str | None = None, reason: str | None = None, **numbers) -> dict:
    """The record of the one rule (:func:`poslens.metrics.verdicts.rule`) on ``n``: not judged when the
    claim does not apply (``not_applicable``, its reason code), else reproduced or not reproduced by the
    numbers alone, with ``reason`` saying which way a claim falls short."""
    verdict = V.rule(n, not_applicable)
    return _judged(verdict, n, not_applicable if not_applicable is not None
                   else (None if verdict == V.REPRODUCED else reason), **numbers)


def judge_sink(m: dict, eps: float) -> dict:
    """Gu et al.: the share of heads whose mean weight on key 0 exceeds ``eps``, against evenly attending heads."""
    o, S = m["overall"], m["seq_len"]
    even = uniform_sink_weight(S)  # weight on key 0 of a head attending evenly
    heads = m["num_layers"] * m["num_heads"]
    chance = 1.0 if even > eps else 0.0  # the share of evenly attending heads over eps
    n = V.measured(o["sink_rate"], chance, V.binomial_floor(chance, heads), V.THRESHOLDS["sink"],
                   f"share of heads whose mean weight on key 0 exceeds eps = {eps:g} (text)")
    numbers = dict(eps=eps, even=even, seq_len=S, heads=heads, sink_rate=o["sink_rate"],
                   sink_rate_random=o.get("sink_rate_random"), sink_mean=o.get("sink_mean"))
    # under the level: the sequences lack the start-of-text token the model's sink may sit on (not applicable)
    return _ruled(n, None if V.holds(n) else "no_bos", **numbers)


def judge_kim_nope(m: dict) -> dict:
    """Kim et al. without RoPE: whether the layers after the first have mean score maps that vary with
    position beyond their noise floor (the causal mask alone), not whether they are relative."""
    ls = m["layers"]
    later = ls[1:]
    tested, moved = V.layer_share(later, "flat_p")
    n = V.measured(len(moved) / len(later) if later else None, 0.0, V.binomial_floor(V.LEVEL, len(tested)),
                   V.THRESHOLDS["relativity"], "share of the layers after the first whose mean score map varies with "
                   "position beyond its noise floor (a model without position: none)")
    numbers = dict(rope=False, moved=len(moved), later=len(later), num_layers=m.get("num_layers", 0),
                   flat_p=[[r["layer"], r["flat_p"]] for r in ls if r.get("flat_p") is not None])
    if not tested:
        return _ruled(n, "no_noise_floor", **numbers)
    return _ruled(n, reason=None if V.holds(n) else "mask_below_floor", **numbers)


def judge_kim(m: dict) -> dict:
    """Kim et al. with RoPE: the share of layers whose mean score map departs from a purely relative one
    beyond its noise floor (:func:`poslens.metrics.verdicts.kim_numbers`); without RoPE :func:`judge_kim_nope`."""
    ls = m["layers"]
    if not m.get("rope_layers") and not any(r.get("rope") for r in ls):
        return judge_kim_nope(m)
    n, tested, nonrel = V.kim_numbers(ls)
    numbers = dict(rope=True, nonrelative=len(nonrel), layers=len(ls),
                   relativity_median=m["overall"]["relativity_median"])
    if not tested:
        return _ruled(n, "no_noise_floor", **numbers)
    if V.holds(n):
        return _ruled(n, **numbers)
    few = too_few_groups(tested)
    if few["few"]:  # a test that could hardly reach the level finds nothing: no verdict
        return _ruled(n, "few_groups", **numbers, groups=few["groups"], p_min=few["p_min"])
    return _ruled(n, reason=None if n["value"] <= n["floor"] else "not_most", **numbers)


def dims_share(rope_ls: list[dict], bands: tuple[str, ...]) -> float | None:
    """The share of a head's dimensions (rotated and unrotated) that lie in ``bands``: where a head
    without a preference among dimensions puts its energy."""
    dims = [r["dims_by_band"] for r in rope_ls if r.get("dims_by_band")]
    total = sum(sum(d.values()) for d in dims)
    return sum(d.get(b, 0) for d in dims for b in bands) / total if total else None


def _fast(r: dict, h: int) -> float:
    return r["freq_heads"]["high"][h] + r["freq_heads"]["medium"][h]


def slash_conditions(m: dict) -> list[dict]:
    """The paper's two conditions for slash heads, each against what chance gives: (1) pre-RoPE
    queries near rank one (:data:`RANK_ONE`; chance: 1 / head_dim, an isotropic head), (2) RoPE energy
    dominated by the medium and high frequencies (:data:`FAST_BANDS`; chance: those bands' share of the
    dimensions; dominated: over half)."""
    sh = m["slash_heads"]
    out = []
    q1 = [s["q_top1_energy"] for s in sh if s.get("q_top1_energy") is not None]
    if q1:
        v = statistics.median(q1)
        out.append({"condition": RANK_ONE, "value": v, "chance": 1.0 / max(m.get("head_dim") or 1, 1),
                    "needs": 0.5, "met": v >= 0.5,
                    "measure": "median share of the slash heads' pre-RoPE query energy in the first singular direction"})
    by_layer = {r["layer"]: r for r in m["layers"] if r["rope"] and r.get("freq_heads")}
    fast = [_fast(by_layer[s["layer"]], s["head"]) for s in sh if s["layer"] in by_layer]
    chance = dims_share(list(by_layer.values()), ("high", "medium"))
    if fast and chance is not None:
        v = statistics.mean(fast)
        out.append({"condition": FAST_BANDS, "value": v, "chance": chance, "needs": 0.5,
                    "met": v > 0.5, "measure": "mean share of the slash heads' q·k energy in the high and medium "
                                               "RoPE bands"})
    return out


def judge_slash(m: dict, kappa: float) -> dict:
    """Cheng et al.: the share of slash heads that keep their pattern on random tokens (the two
    conditions stated beside it)."""
    sh, S = m["slash_heads"], m["seq_len"]
    uni = uniform_slash(S, 1)
    persist = [s for s in sh if s["persists"]]
    # a head whose pattern comes from the text falls to about even attention on random tokens (SlashScore
    # ≈ 1/i, far below kappa): chance and the false-positive rate of the per-head test are 0
    n = V.measured(len(persist) / len(sh) if sh else None, 0.0, V.binomial_floor(0.0, len(sh)),
                   V.THRESHOLDS["slash"], f"share of the slash heads (SlashScore ≥ kappa = {kappa:g} at some Δ in "
                   "1 … 16) that stay ≥ kappa on uniformly random tokens")
    if not sh:
        return _ruled(n, "no_slash_heads", kappa=kappa, conditions=[])
    predicted = [s for s in sh if s.get("predicted_delta") is not None]
    offsets = {s["delta"] for s in sh}
    top = sh[0]
    numbers = dict(kappa=kappa, uniform=uni, heads=len(sh), persist=len(persist),
                   strongest={k: top[k] for k in ("layer", "head", "score", "delta")},
                   predicted=len(predicted), predicted_match=sum(s["predicted_delta"] == s["delta"] for s in predicted),
                   # a predictor that always named this offset would match as often
                   same_offset=next(iter(offsets)) if predicted and len(sh) > 1 and len(offsets) == 1 else None,
                   conditions=slash_conditions(m))
    if any(s["persists"] is None for s in sh):
        return _ruled(n, "no_random_scan", **numbers)
    return _ruled(n, **numbers)


def judge_zuo(m: dict) -> dict:
    """Zuo et al.: the mean APS over the layers without RoPE against 0.5 (no order)."""
    ls = [r for r in m["layers"] if r["aps_mean"] is not None]
    k = m.get("num_seqs") or 1
    nope = [r for r in ls if not r["rope"]]
    judged = nope or ls
    ses = [r["aps_std"] / math.sqrt(k) for r in judged if r.get("aps_std") is not None]
    n = V.measured(statistics.mean(r["aps_mean"] for r in judged) if judged else None, 0.5,
                   V.mean_floor(0.5, statistics.mean(ses) if ses else None), V.THRESHOLDS["aps"],
                   "mean over the layers " + ("without RoPE" if nope else "(all rotate q/k)") +
                   " of the per-sequence APS of the residual stream (no order: 0.5)")
    o = m["overall"]
    numbers = dict(nope_layers=len(nope), aps_min=o["aps_min"], aps_max=o["aps_max"])
    if not nope:
        return _ruled(n, "all_rope", **numbers)
    return _ruled(n, reason="small" if n["value"] > n["floor"] else "no_order", **numbers)


def judge_barbero(m: dict) -> dict:
    """Barbero et al.: the heads' mean share of q·k energy in the low RoPE band against that band's share
    of the dimensions, and whether the slash heads lean on the fast pairs more than all heads."""
    rope_ls = [r for r in m["layers"] if r["rope"] and r.get("freq_heads")]
    chance = dims_share(rope_ls, ("low",))
    if not rope_ls or chance is None:
        n = V.measured(None, 0.0, 0.0, V.THRESHOLDS["frequency"], "share of q·k energy in the low RoPE band")
        return _ruled(n, "no_rope")
    H = m["num_heads"]
    lows = [r["freq_heads"]["low"][h] for r in rope_ls for h in range(H)]
    se = statistics.stdev(lows) / math.sqrt(len(lows)) if len(lows) > 1 else None
    n = V.measured(statistics.mean(lows), chance, V.mean_floor(chance, se), V.THRESHOLDS["frequency"],
                   f"mean over heads of the share of q·k energy in the low RoPE band (pairs turning less than once "
                   f"over {m['seq_len']} tokens); chance: that band's share of the dimensions")
    by_layer = {r["layer"]: r for r in rope_ls}
    sh = [s for s in m["slash_heads"] if s["layer"] in by_layer]
    numbers = dict(seq_len=m["seq_len"], high=m["overall"]["freq"]["high"] or 0, slash_fast=None, all_fast=None,
                   slash_lean_fast=None)
    if sh:
        numbers["slash_fast"] = statistics.mean(_fast(by_layer[s["layer"]], s["head"]) for s in sh)
        numbers["all_fast"] = statistics.mean(_fast(r, h) for r in rope_ls for h in range(H))
        numbers["slash_lean_fast"] = numbers["slash_fast"] > numbers["all_fast"]
    low_first = V.holds(n)
    if low_first and numbers["slash_lean_fast"] is not False:
        return _judged(V.REPRODUCED, n, **numbers)
    return _judged(V.NOT_REPRODUCED, n, "slash_not_fast" if low_first else "low_not_first", **numbers)


def judge_jin(m: dict) -> dict:
    """Jin et al.: the share of the massive query and key dimensions in the low RoPE band against that
    band's share of the dimensions."""
    o = m["overall"]
    rope_ls = [r for r in m["layers"] if r["rope"]]
    # where massive dims would fall by chance: the share of a head's dims that lie in low-frequency pairs
    chance = dims_share(rope_ls, ("low",))
    mq, mk = o["massive_q"], o["massive_k"]
    total = mq + mk
    value = (o["massive_q_low"] + o["massive_k_low"]) / total if total else None
    n = V.measured(value, chance or 0.0, V.binomial_floor(chance or 0.0, total), V.THRESHOLDS["massive"],
                   "share of the massive query and key dimensions in the low RoPE band; chance: that band's share of "
                   "the dimensions")
    numbers = dict(massive_q=mq, massive_k=mk, massive_lambda=m["massive_lambda"], dims_share=chance,
                   q_low_share=o["massive_q_low_share"], k_low_share=o["massive_k_low_share"])
    if total == 0 or chance is None:
        return _ruled(n, "no_massive_or_rope", **numbers)
    return _ruled(n, **numbers)


def judge(key: str, m: dict, thresholds: dict) -> dict:
    """The verdict record of claim ``key`` (:data:`CLAIM_KEYS`) on model record ``m``; ``thresholds``:
    the fingerprint's ``sink_eps`` and ``slash_kappa``."""
    if key == "sink":
        return judge_sink(m, thresholds["sink_eps"])
    if key == "slash":
        return judge_slash(m, thresholds["slash_kappa"])
    return {"kim": judge_kim, "zuo": judge_zuo, "barbero": judge_barbero, "jin": judge_jin}[key](m)


def judge_claims(models: list[dict], thresholds: dict, keys=CLAIM_KEYS) -> list[dict]:
    """``fingerprint.json``'s ``findings``: per claim (``claim``: its key) one verdict record per model
    (``name`` first)."""
    return [{"claim": key, "models": [{"name": m["name"], **judge(key, m, thresholds)} for m in models]}
            for key in keys]
