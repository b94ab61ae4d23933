"""Position probes (arXiv 2501.00073): planted signals are recovered, shuffled targets are not."""

import json

import pytest
import torch

from poslens.metrics.probes import (compare_cosine_norm, evaluate_probe, fit_linear, pearson_r, predict_linear,
                                    probe_features)


def test_pearson_r_known_values():
    x = torch.arange(10.0)
    assert pearson_r(x, 3 * x + 1) == pytest.approx(1.0)
    assert pearson_r(x, -x) == pytest.approx(-1.0)
    assert pearson_r(torch.ones(5), x[:5]) != pearson_r(torch.ones(5), x[:5])  # NaN for a constant


def test_linear_probe_recovers_planted_position_exactly():
    g = torch.Generator().manual_seed(0)
    B, T, d = 20, 16, 24
    direction = torch.randn(d, generator=g, dtype=torch.float64)
    noise = torch.randn(B, T, d, generator=g, dtype=torch.float64)
    noise -= (noise @ direction)[..., None] * direction / direction.dot(direction)  # orthogonal to the signal
    h = noise + torch.arange(T, dtype=torch.float64)[None, :, None] * direction
    X, y = probe_features(h)["vector"]
    w = fit_linear(X, y)
    assert torch.allclose(predict_linear(w, X), y, atol=1e-5)
    res = evaluate_probe("linear", X[: 10 * T], y[: 10 * T], X[10 * T:], y[10 * T:])
    assert res["r"] > 0.9999 and res["mse"] < 1e-6 and res["chance_mse"] > 10


def test_linear_probe_equals_least_squares_and_shrinks_with_the_ridge():
    """The linear probe against an independent reference: with a negligible ridge it is ordinary least
    squares with an intercept (torch.linalg.lstsq); with a ridge it is the closed-form ridge solution on
    centred data, the ridge given relative to the mean diagonal of the centred XᵀX."""
    g = torch.Generator().manual_seed(6)
    X = torch.randn(300, 5, generator=g, dtype=torch.float64) * torch.tensor([1.0, 2, 3, 4, 5], dtype=torch.float64)
    y = X @ torch.tensor([0.5, -1.0, 2.0, 0.0, 0.3], dtype=torch.float64) + 7 + 0.1 * torch.randn(300, generator=g,
                                                                                                  dtype=torch.float64)
    A = torch.cat([X, torch.ones(300, 1, dtype=torch.float64)], 1)
    ref = torch.linalg.lstsq(A, y[:, None]).solution[:, 0]
    m = fit_linear(X, y, ridge=1e-12)
    assert torch.allclose(torch.as_tensor(m.coef_), ref[:5], atol=1e-8) and abs(m.intercept_ - float(ref[5])) < 1e-8
    Xc, yc = X - X.mean(0), y - y.mean()
    lam = 0.5 * float((Xc * Xc).sum(0).mean())
    w = torch.linalg.solve(Xc.T @ Xc + lam * torch.eye(5, dtype=torch.float64), Xc.T @ yc)
    m = fit_linear(X, y, ridge=0.5)
    assert torch.allclose(torch.as_tensor(m.coef_), w, atol=1e-10)
    assert torch.allclose(predict_linear(m, X), Xc @ w + y.mean(), atol=1e-9)


def test_shuffled_targets_give_r_near_zero():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(2000, 8, generator=g)
    y = torch.arange(2000.0) % 32
    y = y[torch.randperm(2000, generator=g)]
    for kind in ("linear", "mlp"):
        res = evaluate_probe(kind, X[:1500], y[:1500], X[1500:], y[1500:], mlp_steps=60)
        assert abs(res["r"]) < 0.1, kind
        assert res["mse"] > 0.9 * res["chance_mse"]


def test_running_mean_cosine_and_norm_predict_distance_to_end():
    """Running means of i.i.d. vectors: cos(h_i, h_T) = sqrt(i/T) and ||h_i|| ∝ 1/sqrt(i) both encode T - i."""
    g = torch.Generator().manual_seed(2)
    v = torch.randn(48, 24, 512, generator=g, dtype=torch.float64)
    h = v.cumsum(1) / torch.arange(1, 25, dtype=torch.float64)[None, :, None]
    f = probe_features(h)
    X, y = f["cosine"]
    assert torch.allclose(X.view(48, 23).mean(0), (torch.arange(1, 24, dtype=torch.float64) / 24).sqrt(), atol=0.02)
    assert torch.equal(y[:23], 23 - torch.arange(23, dtype=torch.float64))
    i = torch.arange(1, 24, dtype=torch.float64)
    # a linear probe can reach exactly |corr(f(i), i)| when the feature is f(i) = sqrt(i/T) or 1/sqrt(i)
    cases = (("cosine", "linear", pearson_r(i.sqrt(), i)), ("norm", "linear", -pearson_r(i ** -0.5, i)),
             ("norm", "mlp", 0.95))
    for feat, kind, expect in cases:
        X, y = f[feat]
        res = evaluate_probe(kind, X[: 32 * 23], y[: 32 * 23], X[32 * 23:], y[32 * 23:], mlp_steps=150)
        if kind == "linear":
            assert abs(res["r"] - expect) < 0.04, (feat, res["r"], expect)
        else:
            assert res["r"] > expect, (feat, kind)
    # i.i.d. vectors without the running mean: neither scalar carries position
    for feat in ("cosine", "norm"):
        X, y = probe_features(v)[feat]
        res = evaluate_probe("linear", X[: 32 * 23], y[: 32 * 23], X[32 * 23:], y[32 * 23:])
        assert abs(res["r"]) < 0.15, feat


def test_compare_cosine_norm_counts_layers():
    # the embeddings (best r of all here) are not a decoder layer and are left out of the comparison
    rows = [{"layer": k, "feature": f, "probe": "mlp", "r": r, "mse": m}
            for k, (cr, cm, nr, nm) in zip(["embeddings", 0, 1], [(1, 0, 1, 0), (0.9, 10, 0.5, 50), (0.8, 60, 0.7, 40)])
            for f, r, m in (("cosine", cr, cm), ("norm", nr, nm))]
    c = compare_cosine_norm(rows)
    assert c["cosine_best"]["layer"] == 0 and c["norm_best"]["layer"] == 1
    assert c["cosine_lower_mse_layers"] == 1 and c["layers"] == 2
    assert "test_seqs" not in c  # no per-sequence errors given: no paired count


def test_per_sequence_errors_are_each_test_sequences_mse_and_pair_over_layers():
    """``seq_mse`` is each test sequence's own MSE (their mean is the test MSE); the comparison sums
    each probe's per-sequence errors over the decoder layers and counts the sequences the cosine wins."""
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(90, 3, generator=g, dtype=torch.float64), torch.randn(90, generator=g, dtype=torch.float64)
    res = evaluate_probe("linear", X[:60], y[:60], X[60:], y[60:], test_seqs=5)
    assert len(res["seq_mse"]) == 5 and abs(sum(res["seq_mse"]) / 5 - res["mse"]) < 1e-12
    for i in range(5):  # the same probe (fit on the training rows alone) tested on one sequence's rows
        rows_i = slice(60 + 6 * i, 66 + 6 * i)
        assert abs(evaluate_probe("linear", X[:60], y[:60], X[rows_i], y[rows_i])["mse"] - res["seq_mse"][i]) < 1e-9
    errs = {("cosine", 0): [1, 5, 2], ("norm", 0): [2, 1, 2], ("cosine", 1): [1, 1, 9], ("norm", 1): [1, 4, 1]}
    rows = [{"layer": k, "feature": f, "probe": "mlp", "r": 0.5, "mse": sum(e) / 3, "seq_mse": e}
            for (f, k), e in errs.items()]
    c = compare_cosine_norm(rows)
    assert c["test_seqs"] == 3 and c["cosine_lower_mse_seqs"] == 1  # sums 2 vs 3, 6 vs 5, 11 vs 3


@pytest.fixture(scope="module")
def char_model_dir(tmp_path_factory):
    from poslens.models.families import build_model
    from poslens.data.tokenizer import char_tokenizer

    tok = char_tokenizer()
    m = build_model("none", "micro", len(tok), init_std=0.0002, hidden=64, heads=2, kv_heads=2, layers=1, seed=0)
    path = tmp_path_factory.mktemp("charmodel")
    m.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_cli_probes_run_dir(cli, tmp_path, char_model_dir):
    out = tmp_path / "pr"
    code, _, err = cli("probes", char_model_dir, "--out", out, "--seq-len", 16, "--num-train-seqs", 16, "--num-test-seqs", 8,
                       "--mlp-steps", 40, "--train-chars", "ABCDEFGHIJKLM", "--test-chars", "NOPQRSTUVWXYZ",
                       "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert json.loads((out / "config.json").read_text())["command"] == "probes"
    assert s["paper"] == "neighborhood" and len(s["tables"]) == 2 and s["readings"] == []
    judged = [(v["model"], v["state"], v["cosine_beats_norm"]) for v in s["judgement"]["verdicts"]]
    assert judged == [(v["model"], v["state"], v["cosine_beats_norm"]) for v in s["verdicts"]]
    assert all((out / f["file"]).exists() for f in s["figures"])
    rec = {(r["state"], r["layer"], r["feature"], r["probe"]): r for r in s["records"]}
    # near-zero-init NoPE decoder layer 0 is a running mean: cosine to the last token predicts T - i on unseen
    # characters (r over seeds 0-5 at this size: 0.88-0.93, with either draw of the random sequences; chance is
    # r ≈ 0); the embeddings are named as such (decoder layers count from 0)
    assert rec[("trained", 0, "cosine", "mlp")]["r"] > 0.85
    assert {k[1] for k in rec} == {"embeddings", 0}
    assert [row[3] for row in s["tables"][1]["rows"][:2]] == ["embeddings", 0]
    assert {v["state"] for v in s["verdicts"]} == {"trained", "random init"}


def test_cli_probes_rejects_bad_input(cli, tmp_path, char_model_dir):
    code, _, err = cli("probes", char_model_dir, "--out", tmp_path / "a", "--train-chars", "0123", "--test-chars",
                       "3456", "--quiet")
    assert code == 2 and "disjoint" in err and not (tmp_path / "a").exists()
    code, _, err = cli("probes", char_model_dir, "--out", tmp_path / "b", "--train-chars", "01~", "--quiet")
    assert code == 2 and "--train-chars" in err and not (tmp_path / "b").exists()


def test_skip_first_removes_a_bos_marker():
    """A fixed first token (BOS) marks position 0 in any model; skip_first leaves it out of the samples."""
    g = torch.Generator().manual_seed(4)
    h = torch.randn(40, 12, 16, generator=g, dtype=torch.float64)
    h[:, 0] = 5.0  # the same vector at position 0 in every sequence
    with_bos = probe_features(h)["vector"]
    without = probe_features(h, skip_first=1)["vector"]
    assert without[0].shape[0] == 40 * 11 and float(without[1].min()) == 1.0
    r_with = evaluate_probe("linear", with_bos[0][:360], with_bos[1][:360], with_bos[0][360:], with_bos[1][360:])["r"]
    r_without = evaluate_probe("linear", without[0][:330], without[1][:330], without[0][330:], without[1][330:])["r"]
    assert r_with > 0.3 and abs(r_without) < 0.2


def test_select_ridge_prefers_shrinkage_under_shift_and_none_without():
    from poslens.metrics.probes import select_ridge

    g = torch.Generator().manual_seed(5)
    n, d = 400, 40
    y = torch.arange(n, dtype=torch.float64) % 20
    signal = torch.randn(d, generator=g, dtype=torch.float64)
    Xa = y[:, None] * signal / 20 + 1e-4 * torch.randn(n, d, generator=g, dtype=torch.float64)
    # a (nearly) exact planted signal and no shift: shrinkage only hurts, the weakest ridge wins
    assert select_ridge(Xa[:200], y[:200], Xa[200:], y[200:]) <= 1e-4
    # in A a tiny direction predicts y exactly while the real signal is noisy; in B that direction
    # is large and unrelated to y: an unregularised fit leans on it and fails, a ridge does not
    nuisance = torch.randn(d, generator=g, dtype=torch.float64)
    noisy = y[:, None] * signal / 20 + 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)
    Xa2 = noisy[:200] + 1e-3 * y[:200, None] * nuisance
    Xb2 = noisy[200:] + 5 * torch.randn(200, 1, generator=g, dtype=torch.float64) * nuisance
    assert select_ridge(Xa2, y[:200], Xb2, y[200:]) >= 1e-2
