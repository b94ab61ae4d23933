"""Slash analyses against cases with known answers.

The central case: a one-layer RoPE model whose W_Q and W_K are rank one and whose normalised
inputs have a constant component along the direction they read, so every pre-RoPE query is the
same vector a·u and every key b·v. Its logit is then exactly Σ_l A_l cos(θ_l Δ + φ_l), and the
slash profile the scan captures must equal the RoPE decomposition's prediction.
"""

from __future__ import annotations

import math

import pytest
import torch

from poslens.analysis.slash import decompose_scan
from poslens.errors import PoslensError
from poslens.metrics.rank import rank_table
from poslens.metrics.ropefit import pair_polar, predicted_slash_profile, rank_one_logit, rope_decomposition
from poslens.metrics.slash import persistence, sdh_table, slash_profile
from poslens.rope import apply_rope, cos_sin, inv_freq

V, HID, H, HK, D, S, BASE = 40, 16, 2, 1, 8, 16, 100.0


def test_rank_one_logit_matches_rotated_dot_products():
    """Sign conventions: the decomposition equals q_i·k_j after poslens.rope.apply_rope."""
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(D, generator=g, dtype=torch.float64), torch.randn(D, generator=g, dtype=torch.float64)
    pos = torch.arange(S)
    cos, sin = cos_sin(pos, D, BASE, dtype=torch.float64)
    q, k = apply_rope(u.expand(S, D), cos, sin), apply_rope(v.expand(S, D), cos, sin)
    direct = q @ k.T  # [i, j]
    mu, au = pair_polar(u, D)
    mv, av = pair_polar(v, D)
    pred = rank_one_logit(mu * mv, au - av, inv_freq(D, BASE), torch.arange(-S + 1, S))
    for i in range(S):
        for j in range(S):
            assert direct[i, j] == pytest.approx(float(pred[i - j + S - 1]), abs=1e-10)
    # a wrong convention (phase sign flipped) must fail: the check above can fail
    wrong = rank_one_logit(mu * mv, av - au, inv_freq(D, BASE), torch.arange(-S + 1, S))
    assert not torch.allclose(wrong, pred)


def test_predicted_profile_equals_explicit_attention():
    g = torch.Generator().manual_seed(1)
    z = 3 * torch.randn(S, generator=g, dtype=torch.float64)
    i = torch.arange(S)
    logits = z[(i[:, None] - i[None, :]).clamp_min(0)].masked_fill(i[None, :] > i[:, None], -math.inf)
    attn = torch.softmax(logits, -1)
    assert torch.allclose(predicted_slash_profile(z), slash_profile(attn), atol=1e-12)


def _rank_one_model(path, seed=0):
    """One-layer RoPE SmolLM3 with rank-one W_Q/W_K reading a direction every token shares."""
    from transformers import AutoModelForCausalLM

    from poslens.models.families import build_config

    cfg = build_config("rope", "micro", V, rope_theta=BASE, layers=1, hidden=HID, heads=H, kv_heads=HK,
                       intermediate=32)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(seed)
    e0 = torch.zeros(HID)
    e0[0] = 1.0
    with torch.no_grad():
        # every embedding row: 1·e0 + an orthogonal part of fixed norm, so RMSNorm(x)·e0 is one constant
        rest = torch.randn(V, HID - 1, generator=g)
        rest = 2.0 * rest / rest.norm(dim=1, keepdim=True)
        model.model.embed_tokens.weight.copy_(torch.cat([torch.ones(V, 1), rest], 1))
        att = model.model.layers[0].self_attn
        us = [torch.randn(D, generator=g) for _ in range(H)]
        v = torch.randn(D, generator=g)
        # head 1 reads -u: the coefficient product a·b is negative there (exercises the sign)
        att.q_proj.weight.copy_(torch.cat([(3.0 if h == 0 else -3.0) * us[h][:, None] * e0[None] for h in range(H)]))
        att.k_proj.weight.copy_(3.0 * v[:, None] * e0[None])
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def rank_one_scan(tmp_path_factory):
    from poslens.capture.scan import ScanConfig, run_scan
    from poslens.rundir import read_tensors

    root = tmp_path_factory.mktemp("r1")
    model = _rank_one_model(root / "model")
    run_scan(ScanConfig(model_dir=str(model), out=str(root / "scan"), data="random", seq_len=S, num_seqs=4,
                        batch_size=2, figures=False), progress=False)
    return root, read_tensors(root / "scan" / "maps.safetensors")


def test_rank_one_model_slash_profile_is_predicted(rank_one_scan):
    _, maps = rank_one_scan
    maps = {k: v.to(torch.float64) for k, v in maps.items()}
    rows = decompose_scan(maps, rotary_dim=D, base=BASE, scaling=D ** -0.5, rope_layers=[True], min_delta=0)
    assert len(rows) == H
    # the constructed heads are not trivially flat: their profiles vary strongly with Δ
    assert float(maps["slash"][0].std(-1).min()) > 0.02
    for r in rows:
        assert torch.allclose(r["profile"], maps["slash"][0, r["head"]], atol=2e-5), r["head"]
        assert r["peak_match"] and r["profile_corr"] > 0.9999
        assert r["coherence"] == pytest.approx(1.0, abs=1e-4)  # constant coefficients a, b
        assert r["pair_fit"] == pytest.approx(1.0, abs=1e-4)
    ranks = rank_table(maps["q_gram"], maps["k_gram"])
    assert torch.allclose(ranks["q_top1_energy"], torch.ones(1, H, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(ranks["k_effective_rank"], torch.ones(1, H, dtype=torch.float64), atol=1e-3)


def test_wrong_sign_would_mispredict(rank_one_scan):
    """Without the sign read from dim_logit head 1's prediction is wrong (the test above can fail)."""
    _, maps = rank_one_scan
    maps = {k: v.to(torch.float64) for k, v in maps.items()}
    dec = rope_decomposition(maps["q_gram"][0, 1], maps["k_gram"][0, 0], -maps["dim_logit"][0, 1], rotary_dim=D,
                             base=BASE, scaling=D ** -0.5, seq_len=S)
    assert not torch.allclose(dec.profile, maps["slash"][0, 1], atol=1e-2)


def test_band_usage_and_contributions_sum(rank_one_scan):
    _, maps = rank_one_scan
    maps = {k: v.to(torch.float64) for k, v in maps.items()}
    dec = rope_decomposition(maps["q_gram"][0, 0], maps["k_gram"][0, 0], maps["dim_logit"][0, 0], rotary_dim=D,
                             base=BASE, scaling=D ** -0.5, seq_len=S)
    assert sum(dec.band_usage().values()) == pytest.approx(1.0)
    d = int(dec.logit.argmax())
    contrib = dec.band_peak_contribution(d)
    assert sum(contrib.values()) == pytest.approx(float(dec.logit[d] - dec.logit.mean()), abs=1e-9)


def test_sdh_table_and_persistence_counts():
    s_in = torch.zeros(2, 3, 8)
    s_in[0, 1, 1] = 0.9  # previous-token head
    s_in[1, 2, 1] = 0.35
    s_in[1, 0, 3] = 0.5
    s_rand = s_in.clone()
    s_rand[1, 0, 3] = 0.05  # does not persist
    tab = sdh_table(s_in, [0.3, 0.6], max_delta=4, layer_ids=[5, 6])
    counts = {(r[0], r[1]): r[2] for r in tab["rows"]}
    assert counts[(0.3, 1)] == 2 and counts[(0.6, 1)] == 1 and counts[(0.3, 3)] == 1 and counts[(0.6, 3)] == 0
    row = next(r for r in tab["rows"] if r[0] == 0.3 and r[1] == 1)
    assert row[4].split() == ["5.1", "6.2"]
    per = persistence(s_in, s_rand, 0.3, max_delta=4, layer_ids=[5, 6])
    assert [(p["layer"], p["head"], p["delta"], p["persists"]) for p in per] == [
        (5, 1, 1, True), (6, 0, 3, False), (6, 2, 1, True)]
    with pytest.raises(PoslensError):
        persistence(s_in, torch.zeros(3, 3, 8), 0.3, 4)
    with pytest.raises(PoslensError):
        sdh_table(torch.zeros(3, 8), [0.1], 2)


def test_slash_command_writes_run_directory(rank_one_scan, cli):
    import json

    root, maps = rank_one_scan
    out = root / "slash-out"
    code, _, err = cli("slash", root / "scan", "--random-scan", root / "scan", "--kappa", "0.1,0.3", "--max-delta", 6,
                       "--out", out, "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert s["paper"] == "slash" and s["readings"] and (out / "slash_profiles.png").is_file()
    assert json.loads((out / "config.json").read_text())["command"] == "slash"
    counts = s["tables"][0]["rows"]
    sl = maps["slash"].double()
    assert [r[1] for r in counts] == [int((sl[..., d] >= 0.1).sum()) for d in range(1, 7)]
    # the same scan as its own random control: every SDH persists with ratio 1
    assert all(p["persists"] and p["ratio"] == pytest.approx(1.0) for p in s["persistence"])
    code, _, err = cli("slash", root / "scan", "--kappa", "2", "--out", root / "bad", "--quiet")
    assert code == 2 and "--kappa" in err and not (root / "bad").exists()


def test_slash_dynamics_small_run(tmp_path, cli):
    import json

    out = tmp_path / "dyn"
    code, _, err = cli("slash-dynamics", "--out", out, "--steps", 6, "--snapshots", "0,3", "--hidden", 16,
                       "--num-seqs", 4, "--seq-len", 10, "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert [r["step"] for r in s["steps"]] == [0, 3, 6] and s["paper"] == "slash" and (out / "dynamics.png").is_file()
    assert len(s["tables"][0]["rows"]) == 3 and s["readings"]
    for r in s["steps"]:
        assert len(r["heads"]) == 2 and abs(sum(r["best"]["band_usage"].values()) - 1) < 1e-9
    assert (out / "snapshots" / "step-000003" / "scan-random" / "maps.safetensors").is_file()
    # weights differ between snapshots (each snapshot really is its own step)
    from poslens.rundir import read_tensors
    w0 = read_tensors(out / "snapshots" / "step-000000" / "model.safetensors")
    w3 = read_tensors(out / "snapshots" / "step-000003" / "model.safetensors")
    k = next(n for n in w0 if "q_proj" in n)
    assert not torch.equal(w0[k], w3[k])
    code, _, err = cli("slash-dynamics", "--out", tmp_path / "bad", "--steps", 5, "--snapshots", "9", "--quiet")
    assert code == 2 and "--snapshots" in err and not (tmp_path / "bad").exists()
