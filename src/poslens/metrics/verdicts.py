"""One verdict rule for every paper's claim, held against chance and against the noise floor.

A claim is judged on one number, oriented so that more means the structure the paper describes
is there, and three numbers it is held against:

- ``value``: the measured number (a share of heads or layers, an APS, a share of energy);
- ``chance``: what a model without the structure gives (the band's share of dimensions for RoPE
  energy, 0.5 for APS, no head for sinks and slash heads);
- ``floor``: the largest value sampling noise alone reaches, one-sided at the level :data:`LEVEL`
  (``chance + z·SE``); a share of items that each pass their own test (heads, layers) has the
  binomial bound of that test's false-positive rate over the items;
- ``threshold``: the effect size the verdict needs (:data:`THRESHOLDS`, stated once in
  ``docs/fingerprint.md``).

The claim is *reproduced* when ``value − max(chance, floor) ≥ threshold``. Where several layers
are tested on the same sequences, the per-layer p-values are held at a false discovery rate of
:data:`LEVEL` (Benjamini & Hochberg, J. R. Stat. Soc. B 57, 1995), the same level and correction
the report's readings use (:data:`poslens.conventions.NOISE_P`).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from poslens.conventions import NOISE_P as LEVEL
from poslens.conventions import VERDICT_THRESHOLDS as THRESHOLDS


def z(level: float = LEVEL) -> float:
    """The one-sided standard normal quantile of ``level`` (2.33 at 0.01)."""
    return NormalDist().inv_cdf(1.0 - level)


def binomial_floor(p0: float, n: int, level: float = LEVEL) -> float:
    """The share of ``n`` items that noise alone reaches when each passes with probability ``p0``:
    ``p0 + z·sqrt(p0 (1 − p0) / n)`` (normal bound of the binomial share), capped at 1."""
    if n <= 0:  # nothing counted: no noise beyond chance to bound
        return p0
    return min(1.0, p0 + z(level) * math.sqrt(p0 * (1.0 - p0) / n))


def mean_floor(chance: float, se: float | None, level: float = LEVEL) -> float:
    """``chance + z·se``: the largest mean noise alone gives around ``chance`` (``se`` None: ``chance``)."""
    return chance + (z(level) * se if se is not None and math.isfinite(se) else 0.0)


def bh_significant(ps: list[float], level: float = LEVEL) -> list[bool]:
    """Which of ``ps`` stay significant at a false discovery rate of ``level`` (Benjamini–Hochberg
    adjusted p-values, ``scipy.stats.false_discovery_control``, below ``level``)."""
    if not ps:
        return []
    from scipy.stats import false_discovery_control  # lazily: scipy.stats costs a fifth of a second to import

    adj = false_discovery_control([min(max(float(p), 0.0), 1.0) for p in ps], method="bh")
    return [bool(a < level) for a in adj]


def layer_share(ls: list[dict], key: str, ok=lambda r: True) -> tuple[list[dict], list[dict]]:
    """``(tested, significant)``: the layers with a p-value ``key``, and those significant at a false
    discovery rate of LEVEL over them (Benjamini–Hochberg) that also pass ``ok``."""
    tested = [r for r in ls if r.get(key) is not None]
    sig = bh_significant([r[key] for r in tested])
    return tested, [r for r, s in zip(tested, sig) if s and ok(r)]


def kim_numbers(layers: list[dict]) -> tuple[dict, list[dict], list[dict]]:
    """Kim et al.'s claim with RoPE (arXiv 2509.21042) on a scan's layer records: ``(numbers, tested,
    non-relative)``, the value being the share of layers whose mean score map departs from a purely
    relative one beyond its noise floor (``nonrelative_p``, not flat), chance 0, the binomial floor of
    the level over the layers tested."""
    tested, nonrel = layer_share(layers, "nonrelative_p", lambda r: not r.get("flat"))
    n = measured(len(nonrel) / len(layers) if layers else None, 0.0, binomial_floor(LEVEL, len(tested)),
                 THRESHOLDS["relativity"], "share of layers whose mean score map departs from a purely relative "
                 "one beyond its noise floor (RoPE alone: none)")
    return n, tested, nonrel


# the chance levels of uniform causal attention (every query spreads its weight evenly over the keys it sees)
#: the formula of :func:`uniform_sink_weight` in words, quoted wherever the sink's chance level is
SINK_CHANCE_FORMULA = "the mean over queries i = 1 … S − 1 of 1/(i + 1)"


def uniform_slash(n: int, d: int) -> float:
    """SlashScore(d) of uniform causal attention over ``n`` tokens (every query spreads its weight evenly
    over the keys it sees): the mean over queries i = d … n − 1 (from 0) of 1/(i + 1); NaN where no
    query lies ``d`` tokens past a key."""
    if n <= d:
        return float("nan")
    return sum(1.0 / i for i in range(d + 1, n + 1)) / (n - d)


def uniform_sink_weight(S: int) -> float:
    """The weight uniform causal attention over ``S`` tokens puts on key 0, the attention sink's chance
    level: :data:`SINK_CHANCE_FORMULA` (query 0 sees only key 0 and is left out); 0.0349 at S = 128,
    close to but below ln(S)/S."""
    return uniform_slash(S, 1)

def margin(value: float, chance: float, floor: float) -> float:
    """How far ``value`` lies beyond both chance and the noise floor."""
    return value - max(chance, floor)


def beyond(value: float | None, chance: float, floor: float, threshold: float) -> bool:
    """The verdict rule: ``value − max(chance, floor) ≥ threshold``."""
    return value is not None and math.isfinite(value) and margin(value, chance, floor) >= threshold - 1e-12


def holds(n: dict) -> bool:
    """The verdict rule on a :func:`measured` record."""
    return beyond(n["value"], n["chance"], n["floor"], n["threshold"])


#: the verdict codes of a record (:func:`measured`): the rule holds, it does not, or nothing was measured
REPRODUCED, NOT_REPRODUCED, NOT_JUDGED = "reproduced", "not_reproduced", "not_judged"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_JUDGED)


def verdict(value: float | None, chance: float, floor: float, threshold: float) -> str:
    """The verdict code of the rule on these numbers (:data:`NOT_JUDGED` when there is no finite value)."""
    if value is None or not math.isfinite(value):
        return NOT_JUDGED
    return REPRODUCED if beyond(value, chance, floor, threshold) else NOT_REPRODUCED


def rule(n: dict, not_applicable: str | None = None) -> str:
    """The one verdict rule on a :func:`measured` record: :data:`NOT_JUDGED` when the claim does not apply
    to the model (``not_applicable``: the reason, which the verdict must state) or nothing was measured;
    else :data:`REPRODUCED` when ``value − max(chance, floor) ≥ threshold`` and :data:`NOT_REPRODUCED`
    otherwise: a claim that applies whose value lies at or under the noise floor is not reproduced, never
    left unjudged."""
    if not_applicable is not None:
        return NOT_JUDGED
    return verdict(n["value"], n["chance"], n["floor"], n["threshold"])


def measured(value: float | None, chance: float, floor: float, threshold: float, measure: str) -> dict:
    """The record of a verdict, as ``summary.json`` holds it: ``value``, ``chance``, ``floor``,
    ``threshold``, ``verdict`` (:data:`VERDICTS`), with ``margin``, ``level`` and ``measure`` (the name
    of what the value is)."""
    ok = value is not None and math.isfinite(value)
    return {"value": value if ok else None, "chance": chance, "floor": floor, "threshold": threshold,
            "verdict": verdict(value, chance, floor, threshold),
            "margin": margin(value, chance, floor) if ok else None, "level": LEVEL, "measure": measure}


RULE = ("reproduced when value − max(chance, floor) ≥ threshold; chance: what a model without the structure "
        f"gives; floor: the largest value sampling noise reaches at the one-sided level {LEVEL} (z·SE above chance, "
        "or the binomial bound of the items' false-positive rate); several layers' tests at a false discovery "
        f"rate of {LEVEL} (Benjamini–Hochberg)")


#: the verdict codes of a change (``poslens compare``): beyond the noise and the threshold, or not
CHANGED, UNCHANGED = "changed", "unchanged"


def change_verdicts(delta: list[float], se: list[float | None], p: list[float | None], threshold: float,
                    level: float = LEVEL) -> list[dict]:
    """The verdict of each paired change of one family (one reading at one length, over its layers and
    heads): the record ``{value, chance, floor, threshold, significant, verdict}`` with ``value = |delta|``,
    ``chance = 0`` (no change), ``floor = z·SE`` (the largest |delta| sampling noise alone reaches at the
    one-sided level), ``significant`` (the sign-flip p-value below ``level`` after Benjamini–Hochberg over
    the family) and ``verdict`` :data:`CHANGED` when the change is significant and
    ``value − max(chance, floor) ≥ threshold`` (the one rule, :func:`beyond`), else :data:`UNCHANGED`. A
    change with no SE or p (fewer than two groups) is unchanged: no noise was measured."""
    finite = [i for i, x in enumerate(p) if x is not None and math.isfinite(x)]
    sig = [False] * len(p)
    for i, s in zip(finite, bh_significant([p[i] for i in finite], level)):
        sig[i] = s
    out = []
    for dv, s, ok in zip(delta, se, sig):
        value = abs(dv) if dv is not None and math.isfinite(dv) else None
        floor = mean_floor(0.0, s, level) if s is not None and math.isfinite(s) else None
        judged = value is not None and floor is not None
        changed = judged and ok and beyond(value, 0.0, floor, threshold)
        out.append({"value": value, "chance": 0.0, "floor": floor, "threshold": threshold, "significant": ok,
                    "verdict": CHANGED if changed else UNCHANGED})
    return out
