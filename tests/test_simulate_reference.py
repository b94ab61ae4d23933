"""The streaming simulator end to end against a per-sequence float64 loop over the same inputs.

The reference runs arXiv 2509.21042's parameter-free layer ``X <- Softmax(mask(s * Q K^T)) Y + X``
(Y = L2Norm(X) or LayerNorm(X), Q = K = RoPE(Y)) one sequence at a time with explicit 2x2
rotations, then takes plain means, sample variances and the n % G group means itself; only the
input draw (``sample_inputs``, checked on its own below) is shared with the code under test.
"""

import math

import pytest
import torch

from poslens.capture.statistics.accumulators import NOISE_GROUPS
from poslens.simulator import RNG_BLOCK, SimConfig, run_simulation, sample_inputs


def _normed(x, norm):
    if norm == "l2":
        return x / x.norm(dim=-1, keepdim=True)
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5)


def reference(cfg):
    n_blocks = math.ceil(cfg.samples / RNG_BLOCK)
    x = torch.cat([sample_inputs(cfg, b) for b in range(n_blocks)])[: cfg.samples].to(torch.float64)
    S, d = cfg.seq_len, cfg.dim
    scale = 1.0 if cfg.norm == "l2" else 1.0 / (d if cfg.scale == "d" else math.sqrt(d))
    scores, probs = [], []
    for _ in range(cfg.layers):
        y = _normed(x, cfg.norm)
        q = y.clone()
        if cfg.rope:
            h = d // 2
            for p in range(S):
                for l in range(h):
                    ang = p * cfg.rope_theta ** (-2 * l / d)
                    c, s = math.cos(ang), math.sin(ang)
                    q[:, p, l], q[:, p, l + h] = y[:, p, l] * c - y[:, p, l + h] * s, y[:, p, l] * s + y[:, p, l + h] * c
        sc = scale * q @ q.transpose(1, 2)
        if cfg.causal:
            sc = sc.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(sc, -1)
        x = x + p @ y
        scores.append(sc)
        probs.append(p)
    return torch.stack(scores, 1), torch.stack(probs, 1)  # [N, L, S, S]


CASES = [
    dict(alpha=0.3, layers=2, seq_len=5, dim=6, samples=300, chunk_size=RNG_BLOCK),
    dict(alpha=0.0, layers=2, seq_len=4, dim=6, samples=260, rope=True, rope_theta=50.0, seed=3),
    dict(alpha=0.5, layers=1, seq_len=4, dim=5, samples=120, norm="layernorm"),
    dict(alpha=0.2, layers=2, seq_len=4, dim=4, samples=90, norm="layernorm", scale="d", causal=False, seed=1),
]


@pytest.mark.parametrize("kw", CASES)
def test_run_simulation_matches_a_per_sequence_loop(kw):
    cfg = SimConfig(**kw)
    res = run_simulation(cfg)
    sc, pr = reference(cfg)
    N, L, S = cfg.samples, cfg.layers, cfg.seq_len
    assert res.samples == N and not res.stopped_early
    upper = torch.ones(S, S, dtype=torch.bool).triu(1)
    valid = ~upper if cfg.causal else torch.ones(S, S, dtype=torch.bool)
    mean = sc.mean(0)
    sd = sc.std(0, unbiased=True) / math.sqrt(N)
    for l in range(L):
        torch.testing.assert_close(res.scores[l][valid], mean[l][valid], rtol=0, atol=2e-5)
        torch.testing.assert_close(res.scores_stderr[l][valid], sd[l][valid], rtol=1e-3, atol=1e-4)  # float32 sums of squares: a floor for constant entries
        torch.testing.assert_close(res.probs[l], pr.mean(0)[l], rtol=0, atol=2e-6)
        if cfg.causal:
            assert bool(res.scores[l][upper].isnan().all()) and bool(res.scores_stderr[l][upper].isnan().all())
    # noise groups: sample n belongs to group n % G
    G = min(NOISE_GROUPS, N)
    assert res.group_counts.tolist() == [float(len(range(g, N, NOISE_GROUPS))) for g in range(G)]
    for g in range(G):
        gm = sc[g::NOISE_GROUPS].mean(0)
        for l in range(L):
            torch.testing.assert_close(res.score_groups[g, l][valid], gm[l][valid], rtol=0, atol=2e-5)
            if cfg.causal:
                assert bool(res.score_groups[g, l][upper].isnan().all())


def test_sample_inputs_are_unit_vectors_with_inner_product_alpha():
    cfg = SimConfig(alpha=0.6, seq_len=8, dim=256, seed=5)
    x = sample_inputs(cfg, 0).to(torch.float64)
    assert x.shape == (RNG_BLOCK, 8, 256)
    torch.testing.assert_close(x.norm(dim=-1), torch.ones(RNG_BLOCK, 8, dtype=torch.float64), rtol=0, atol=1e-5)
    g = x @ x.transpose(1, 2)
    off = ~torch.eye(8, dtype=torch.bool)
    assert float(g[:, off].mean()) == pytest.approx(0.6, abs=0.01)
    # blocks are independent draws, and the seed selects the stream
    assert not torch.equal(sample_inputs(cfg, 0), sample_inputs(cfg, 1))
    assert torch.equal(sample_inputs(cfg, 1), sample_inputs(SimConfig(alpha=0.6, seq_len=8, dim=256, seed=5), 1))
    assert not torch.equal(sample_inputs(cfg, 0), sample_inputs(SimConfig(alpha=0.6, seq_len=8, dim=256, seed=6), 0))


def test_score_scale_and_label():
    assert SimConfig().score_scale == 1.0
    assert SimConfig(norm="layernorm", dim=16).score_scale == 0.25
    assert SimConfig(norm="layernorm", dim=16, scale="d").score_scale == 1 / 16
    assert SimConfig(norm="layernorm", dim=16, scale="sqrt-d").score_scale == 0.25
    labels = [SimConfig(alpha=0.5, rope=True), SimConfig(norm="layernorm", causal=False),
              SimConfig(norm="layernorm", scale="d")]
    assert [c.label() for c in labels] == ["alpha=0.5, l2, RoPE, causal", "alpha=0, LN/sqrt-d, NoPE, non-causal",
                                           "alpha=0, LN/d, NoPE, causal"]


def test_target_stderr_stops_after_two_blocks_at_the_earliest():
    cfg = SimConfig(alpha=0.3, layers=1, seq_len=4, dim=8, samples=5 * RNG_BLOCK, chunk_size=RNG_BLOCK,
                    target_stderr=10.0)  # met at once: stops as soon as the check may run
    res = run_simulation(cfg)
    assert res.samples == 2 * RNG_BLOCK and res.stopped_early
    never = run_simulation(SimConfig(alpha=0.3, layers=1, seq_len=4, dim=8, samples=2 * RNG_BLOCK,
                                     chunk_size=RNG_BLOCK, target_stderr=1e-9))
    assert never.samples == 2 * RNG_BLOCK and not never.stopped_early


def test_summary_numbers_per_layer(tmp_path):
    from poslens import theory
    from poslens.simulator import load_result, save_result

    cfg = SimConfig(alpha=0.3, layers=2, seq_len=5, dim=6, samples=300)
    res = run_simulation(cfg)
    s = res.summary
    assert s["samples"] == 300 and s["label"] == cfg.label() and s["stopped_early"] is False
    assert s["samples_per_second"] == pytest.approx(300 / res.seconds)
    th = theory.kim_mean_field(0.3, 5, 2)
    for l, entry in enumerate(s["layers"]):
        lower = [(i, j) for i in range(5) for j in range(i)]
        assert entry["layer"] == l and entry["paper_layer"] == l + 1
        assert entry["max_stderr"] == pytest.approx(max(float(res.scores_stderr[l, i, j]) for i, j in lower))
        assert entry["mean_score"] == pytest.approx(sum(float(res.scores[l, i, j]) for i, j in lower) / len(lower))
        assert entry["theory_max_abs_diff"] == pytest.approx(
            max(abs(float(res.scores[l, i, j]) - float(th[l, i, j])) for i, j in lower))
        assert entry["noise_groups"] == 16
    # no closed form with RoPE, LayerNorm or without the mask
    for kw in (dict(rope=True), dict(norm="layernorm"), dict(causal=False)):
        r = run_simulation(SimConfig(alpha=0.3, layers=1, seq_len=4, dim=6, samples=20, **kw))
        assert "theory_max_abs_diff" not in r.summary["layers"][0]
    one = run_simulation(SimConfig(layers=1, seq_len=1, dim=4, samples=20))
    assert one.summary["layers"][0]["max_stderr"] == 0.0
    assert one.summary["layers"][0]["mean_score"] == pytest.approx(1.0)
    assert one.summary["layers"][0]["noise"] == "no_valid_entry"  # was a TypeError in describe_map
    # the run directory loads back to the same numbers
    save_result(res, tmp_path / "r", figures=False)
    back = load_result(tmp_path / "r")
    torch.testing.assert_close(back.scores, res.scores.float().double(), equal_nan=True)
    torch.testing.assert_close(back.score_groups, res.score_groups.float().double(), equal_nan=True)
    # the run records the device it ran on ('auto' resolved), and loads back to that config
    from poslens.runtime import parse_device

    assert res.config.device == parse_device("auto") and back.samples == 300 and back.config == res.config
