"""The noise floor from independent groups of samples: calibrated on nulls with correlated entries,
sensitive to a weak planted non-relative pattern, and honest about too few samples."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from poslens.metrics import describe_map, nonrelative_pvalue, trend_pvalue
from poslens.simulator import SimConfig, run_simulation, save_result
from poslens.capture.statistics.accumulators import GroupAccumulator
from poslens.conventions import NOISE_P
from poslens.metrics.noise import cross_mean_square, jackknife_se, signflip_pvalue

S = 10


def test_signflip_pvalue_equals_brute_force_enumeration():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 7, generator=g, dtype=torch.float64) + 0.3
    w = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0], dtype=torch.float64)
    obs = float((((w / w.sum())[:, None] * a).sum(0) ** 2).sum())
    stats = []
    for eps in itertools.product((1.0, -1.0), repeat=5):
        e = torch.tensor(eps, dtype=torch.float64)
        stats.append(float((((e * w / w.sum())[:, None] * a).sum(0) ** 2).sum()))
    want = sum(t >= obs * (1 - 1e-12) for t in stats) / len(stats)
    assert signflip_pvalue(a, w) == pytest.approx(want)
    assert signflip_pvalue(a[:1], w[:1]) is None  # one group: no test


def test_cross_mean_square_removes_noise_and_jackknife_matches_mean_se():
    g = torch.Generator().manual_seed(1)
    G, n = 16, 4000
    signal = torch.linspace(-1, 1, n, dtype=torch.float64)
    groups = signal + 0.5 * torch.randn(G, 1, generator=g, dtype=torch.float64) \
        + 2.0 * torch.randn(G, n, generator=g, dtype=torch.float64)
    sig, noise = cross_mean_square(groups, torch.ones(G))
    # a group's shared offset is noise too (independent between groups): only the signal survives
    assert sig == pytest.approx(float((signal**2).mean()), abs=0.05)
    assert noise == pytest.approx((0.25 + 4.0) / G, rel=0.2)
    obs = float((groups.mean(0) ** 2).mean())
    assert sig + noise == pytest.approx(obs)
    # jackknife SE of a linear statistic (the mean) equals the usual standard error of the group means
    x = torch.randn(G, generator=g, dtype=torch.float64)
    se = jackknife_se(lambda m: float(m), x.clone(), torch.ones(G))
    assert se == pytest.approx(float(x.std() / math.sqrt(G)))


def test_group_accumulator_merge_and_state():
    a, b = GroupAccumulator(4, (2,)), GroupAccumulator(4, (2,))
    a.add(0, torch.tensor([1.0, 2.0]), 1)
    b.add(0, torch.tensor([3.0, 4.0]), 1)
    b.add(3, torch.tensor([5.0, 6.0]), 2)
    a.merge(b)
    means, counts = a.group_means()
    assert counts.tolist() == [2.0, 2.0]
    torch.testing.assert_close(means, torch.tensor([[2.0, 3.0], [2.5, 3.0]], dtype=torch.float64))
    c = GroupAccumulator(4, (2,))
    c.load_state_dict(a.state_dict("x."), "x.")
    assert torch.equal(c.sum, a.sum) and torch.equal(c.counts, a.counts) and c.count == 4


@pytest.mark.parametrize("alpha,rope,key", [(0.0, False, "flat_p"), (0.5, True, "nonrelative_p")])
def test_pure_noise_reads_flat_at_the_stated_rate(alpha, rope, key):
    """The simulator's first layer (our layer 0) sees only the inputs: its mean score map is constant
    (NoPE) or Toeplitz (RoPE), so any structure is noise. At alpha > 0 the shared input component
    correlates every entry of a sample (the case an independent-entries test gets wrong). Over 100
    seeds the tests must fire at about NOISE_P = 1 %: P(Binomial(100, 0.01) > 5) < 6e-4."""
    hits = {"flat_p": 0, "nonrelative_p": 0, "trend_p": 0}
    for seed in range(100):
        r = run_simulation(SimConfig(alpha=alpha, rope=rope, layers=1, seq_len=8, dim=8, samples=160, seed=seed))
        l0 = r.summary["layers"][0]
        for k in hits:
            hits[k] += l0[k] < NOISE_P
    if rope:
        assert hits["flat_p"] == 100  # RoPE's relative pattern is real, and found every time
    assert hits[key] <= 5, hits
    assert hits["trend_p"] <= 5, hits


def test_weak_planted_non_relative_pattern_is_detected():
    """A left-to-right column trend on a Toeplitz map, under noise with a shared per-group component
    (correlated entries): its within-diagonal RMS is about 1.5 standard errors of the mean map per
    entry, so no single entry shows it, yet it is detected with the right sign in every one of 20
    draws; the same noise without the pattern is not (1 % tests, at most 2 of 20 by chance)."""
    G, n_per = 16, 50
    i = torch.arange(S, dtype=torch.float64)
    base = torch.exp(-0.3 * (i[:, None] - i[None, :]).clamp_min(0))
    pattern = (i[None, :] - i.mean()) / S * 0.4
    upper = torch.ones(S, S, dtype=torch.bool).triu(1)
    se_mean = 1.3 / math.sqrt(n_per) * math.sqrt(1 + 0.09) / math.sqrt(G)
    false_alarms = 0
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)

        def groups(with_pattern):
            shared = torch.randn(G, 1, 1, generator=g, dtype=torch.float64)
            noise = (0.3 * shared + torch.randn(G, S, S, generator=g, dtype=torch.float64)) / math.sqrt(n_per) * 1.3
            return (base + (pattern if with_pattern else 0.0) + noise).masked_fill(upper, float("nan"))

        planted = groups(True)
        d = describe_map(planted.mean(0), planted)
        assert d["nonrelative_p"] < NOISE_P and d["trend_p"] < NOISE_P and d["diagonal_trend"] > 0, (seed, d)
        assert d["within_diag_rms_noise"] == pytest.approx(se_mean, rel=0.35)
        null = groups(False)
        false_alarms += nonrelative_pvalue(null) < NOISE_P or trend_pvalue(null) < NOISE_P
    assert false_alarms <= 2


def test_one_sample_says_so_instead_of_nan(tmp_path):
    r = run_simulation(SimConfig(layers=2, seq_len=6, dim=8, samples=1))
    save_result(r, tmp_path / "one", figures=False)
    text = (tmp_path / "one" / "summary.json").read_text()
    assert "NaN" not in text
    for l in json.loads(text)["layers"]:
        assert l["noise"] == "no_groups" and set(l["missing"].values()) == {"no_groups"}
        assert l["max_stderr"] is None


def test_too_few_groups_decide_nothing():
    """Two groups cannot give p < 1 %: nothing is called flat, and the summary says why."""
    g = torch.Generator().manual_seed(0)
    groups = torch.randn(2, S, S, generator=g, dtype=torch.float64)
    d = describe_map(groups.mean(0), groups)
    assert d["flat"] is False and d["relativity_index"] is not None
    assert d["noise"] == "too_few_groups" and d["noise_groups"] == 2

    from poslens.reporting.readings.notes import noise_note

    assert noise_note(d["noise"], d["noise_groups"]).startswith("only 2 independent groups of samples: the smallest "
                                                               "attainable p-value is 0.5, above 0.01")
