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
from poslens.fmt import fmt
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
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.rundir.io import read_tensors

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
    assert s["paper"] == "slash" and s["judgement"]["heads"] == len(s["heads"])
    assert (out / "slash_profiles.png").is_file()
    assert json.loads((out / "config.json").read_text())["command"] == "slash"
    counts = s["tables"][0]["rows"]
    sl = maps["slash"].double()
    assert [r[1] for r in counts] == [int((sl[..., d] >= 0.1).sum()) for d in range(1, 7)]
    # the same scan as its own random control: every SDH persists with ratio 1
    assert all(p["persists"] and p["ratio"] == pytest.approx(1.0) for p in s["persistence"])
    code, _, err = cli("slash", root / "scan", "--kappa", "2", "--out", root / "bad", "--quiet")
    assert code == 2 and "--kappa" in err and not (root / "bad").exists()


def test_slash_terminal_tables_fit_80_columns(rank_one_scan, cli):
    """`poslens slash` prints its tables within 80 columns, every row named layer.head, no header cut,
    and its (κ, Δ) table stops at the last offset where some head is slash-dominant."""
    import json
    import re

    root, _ = rank_one_scan
    out = root / "slash-terminal"
    code, text, err = cli("slash", root / "scan", "--kappa", "0.1,0.3", "--max-delta", 6, "--out", out)
    assert code == 0, err
    lines = text.splitlines()
    assert lines and max(len(l) for l in lines) <= 80
    s = json.loads((out / "summary.json").read_text())
    from poslens.analysis.slash import HEAD_COLUMNS

    for c in HEAD_COLUMNS:  # every header whole, in some block of the split head table
        assert any(c in l for l in lines), c
    blocks = [l for l in lines if l.strip().startswith("layer.head")]
    assert len(blocks) >= 2  # the head table is split, each block led by layer.head
    heads = {f"{h['layer']}.{h['head']}" for h in s["heads"]}
    named = []
    for i, l in enumerate(lines):  # the rows of each block: after its header and rule, up to a blank line
        if l.strip().startswith("layer.head"):
            for row in lines[i + 2:]:
                if not row.strip():
                    break
                named.append(row.split()[0])
    assert named and set(named) <= heads and all(re.fullmatch(r"\d+\.\d+", n) for n in named)
    counts = s["tables"][0]["rows"]
    from poslens.cli.kim_slash import _without_empty_offsets
    from poslens.reporting.readings.commands import command_readings, omitted_offsets_reading

    shown, gone = _without_empty_offsets(s)
    printed = " ".join(" ".join(lines).split())  # the terminal wraps long lines
    kept = len(shown["tables"][0]["rows"])
    assert gone == [r[0] for r in counts[kept:]] and not any(any(r[1:-1]) for r in counts[kept:])
    for line in command_readings("slash", s) + ([omitted_offsets_reading(gone)] if gone else []):
        assert f"- {line}" in printed  # the readings rendered from the judgement, then the note


def test_slash_terminal_count_table_ends_at_the_last_offset_with_a_head():
    from poslens.cli.kim_slash import _without_empty_offsets

    rows = [[1, 3, 1, "0.1 2.0 1.1"], [2, 1, 0, "3.1"], [3, 0, 0, ""], [4, 0, 0, ""]]
    s = {"sdh_counts": rows, "readings": ["r"], "tables": [{"title": "t", "columns": ["Δ", "κ=0.1", "κ=0.3", "heads"],
                                                            "rows": rows}, {"title": "u", "columns": [], "rows": []}]}
    t, gone = _without_empty_offsets(s)
    assert t["tables"][0]["rows"] == rows[:2] and t["tables"][1] == s["tables"][1] and gone == [3, 4]
    assert t["readings"] == ["r"] and s["tables"][0]["rows"] == rows  # a copy
    assert _without_empty_offsets({**s, "tables": [{**s["tables"][0], "rows": rows[:3]}]})[1] == []  # not the table
    full = {**s, "sdh_counts": rows[:2], "tables": [{**s["tables"][0], "rows": rows[:2]}]}
    assert _without_empty_offsets(full) == (full, [])  # nothing to leave out


def test_slash_dynamics_small_run(tmp_path, cli):
    import json

    out = tmp_path / "dyn"
    code, _, err = cli("slash-dynamics", "--out", out, "--steps", 6, "--snapshots", "0,3", "--hidden", 16,
                       "--num-seqs", 4, "--seq-len", 10, "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert [r["step"] for r in s["steps"]] == [0, 3, 6] and s["paper"] == "slash" and (out / "dynamics.png").is_file()
    assert len(s["tables"][0]["rows"]) == 3 and s["judgement"]["last_step"] == 6
    for r in s["steps"]:
        assert len(r["heads"]) == 2 and abs(sum(r["best"]["band_usage"].values()) - 1) < 1e-9
    assert (out / "snapshots" / "step-000003" / "scan-random" / "maps.safetensors").is_file()
    # weights differ between snapshots (each snapshot really is its own step)
    from poslens.rundir.io import read_tensors
    w0 = read_tensors(out / "snapshots" / "step-000000" / "model.safetensors")
    w3 = read_tensors(out / "snapshots" / "step-000003" / "model.safetensors")
    k = next(n for n in w0 if "q_proj" in n)
    assert not torch.equal(w0[k], w3[k])
    code, _, err = cli("slash-dynamics", "--out", tmp_path / "bad", "--steps", 5, "--snapshots", "9", "--quiet")
    assert code == 2 and "--snapshots" in err and not (tmp_path / "bad").exists()


# --------------------------------------------------------------------------------------------
# `poslens slash` on a hand-made scan: the numbers of the run against explicit loops
# --------------------------------------------------------------------------------------------
def _fake_maps(L=2, Hq=4, Hkv=2, Dh=4, n=8, seed=3):
    g = torch.Generator().manual_seed(seed)
    slash = torch.rand(L, Hq, n, generator=g, dtype=torch.float64) * 0.2
    slash[0, 1, 2] = 0.9  # a Δ = 2 slash head
    slash[1, 3, 1] = 0.45  # a previous-token head, weaker
    slash[1, 0, 0] = 0.99  # Δ = 0: outside the default range 1..
    a = torch.randn(L, Hq, Dh, Dh, generator=g, dtype=torch.float64)
    b = torch.randn(L, Hkv, Dh, Dh, generator=g, dtype=torch.float64)
    return {"slash": slash, "q_gram": a @ a.transpose(-1, -2), "k_gram": b @ b.transpose(-1, -2),
            "dim_logit": torch.randn(L, Hq, Dh, generator=g, dtype=torch.float64)}


def test_decompose_scan_reads_each_heads_kv_head_and_its_window():
    maps = _fake_maps()
    rows = decompose_scan(maps, rotary_dim=4, base=BASE, scaling=0.5, rope_layers=[True, False], min_delta=1,
                          max_delta=5, layer_ids=[7, 9])
    assert [(r["layer"], r["head"]) for r in rows] == [(7, h) for h in range(4)]  # layer 9 applies no RoPE
    for r in rows:
        h = r["head"]
        dec = rope_decomposition(maps["q_gram"][0, h], maps["k_gram"][0, h // 2], maps["dim_logit"][0, h],
                                 rotary_dim=4, base=BASE, scaling=0.5, seq_len=8)
        obs = [float(maps["slash"][0, h, d]) for d in range(1, 6)]
        pred = [float(dec.profile[d]) for d in range(1, 6)]
        d_obs, d_pred = 1 + obs.index(max(obs)), 1 + pred.index(max(pred))
        assert (r["observed_peak"], r["predicted_peak"]) == (d_obs, d_pred)
        assert r["observed_score"] == float(maps["slash"][0, h, d_obs])
        assert r["predicted_score"] == pytest.approx(float(dec.profile[d_pred]), abs=1e-12)
        assert r["predicted_score_at_observed_peak"] == pytest.approx(float(dec.profile[d_obs]), abs=1e-12)
        assert r["peak_match"] == (d_obs == d_pred)
        mo, mp = sum(obs) / 5, sum(pred) / 5
        cov = sum((x - mo) * (y - mp) for x, y in zip(obs, pred))
        corr = cov / math.sqrt(sum((x - mo) ** 2 for x in obs) * sum((y - mp) ** 2 for y in pred))
        assert r["profile_corr"] == pytest.approx(corr, abs=1e-9)
        assert r["band_usage"] == pytest.approx(dec.band_usage())
        assert r["band_peak_contribution"] == pytest.approx(dec.band_peak_contribution(d_pred))
        assert (r["sign"], r["coherence"], r["pair_fit"]) == (dec.sign, dec.coherence, dec.pair_fit)
        assert torch.equal(r["profile"], dec.profile)
    assert decompose_scan(maps, rotary_dim=None, base=None, scaling=0.5, rope_layers=[True, True]) == []
    # the scan's own RoPE table (per layer kind) replaces rotary_dim / base; a layer without one is skipped
    theta = [1.0, 0.25]
    rope = {"layer_kind": ["full", None], "kinds": {"full": {"inv_freq": theta, "attention_scaling": 2.0}}}
    maps["slash"][0, 2, 7] = 0.95  # a peak at the last offset, S - 1
    own = decompose_scan(maps, rotary_dim=None, base=None, scaling=0.5, rope_layers=[True, True], max_delta=None,
                         rope=rope)
    assert own[2]["observed_peak"] == 7 and own[2]["observed_score"] == pytest.approx(0.95)
    assert [(r["layer"], r["head"]) for r in own] == [(0, h) for h in range(4)]
    dec = rope_decomposition(maps["q_gram"][0, 3], maps["k_gram"][0, 1], maps["dim_logit"][0, 3], rotary_dim=None,
                             base=None, scaling=0.5, seq_len=8, theta=theta, attention_scaling=2.0)
    assert torch.equal(own[3]["profile"], dec.profile)
    pred = [float(dec.profile[d]) for d in range(1, 8)]  # max_delta None: up to S - 1
    assert own[3]["predicted_peak"] == 1 + pred.index(max(pred))
    flat = {**maps, "slash": torch.full((2, 4, 8), 0.125, dtype=torch.float64)}
    assert decompose_scan(flat, rotary_dim=4, base=BASE, scaling=0.5, rope_layers=[True, False])[0]["profile_corr"] is None
    two = decompose_scan(maps, rotary_dim=4, base=BASE, scaling=0.5, rope_layers=[True, False], min_delta=1,
                         max_delta=2)
    assert all(abs(r["profile_corr"]) == pytest.approx(1.0) for r in two)  # two offsets: a correlation of ±1
    one = decompose_scan(maps, rotary_dim=4, base=BASE, scaling=0.5, rope_layers=[True, False], min_delta=3,
                         max_delta=3)
    assert one[0]["profile_corr"] is None and one[0]["observed_peak"] == 3


def _cfg(**kw):
    from poslens.analysis.slash import SlashConfig

    return SlashConfig(scan_dir="scan", out="out", **kw)


def test_analyze_scans_counts_best_offsets_and_persistence():
    from poslens.analysis.slash import analyze_scans

    maps = _fake_maps()
    rand = {**maps, "slash": maps["slash"] * 0.5}
    geom = {"rotary_dim": 4, "base": BASE, "scaling": 0.5}
    parts, tensors = analyze_scans(maps, geom, [False, True], [3, 5], _cfg(kappa=(0.4, 0.2, 0.8), max_delta=6), rand)
    sl = maps["slash"]
    assert parts["kappas"] == [0.2, 0.4, 0.8] and parts["max_delta"] == 6 and parts["persist_kappa"] == 0.4
    for row in parts["by_delta"]:
        d = row[0]
        assert row[1:4] == [int((sl[..., d] >= k).sum()) for k in (0.2, 0.4, 0.8)]
    assert [r[0] for r in parts["by_delta"]] == [1, 2, 3, 4, 5, 6]
    assert parts["by_delta"][1][4] == "3.1" and parts["by_delta"][0][4] == "5.3"  # heads listed at the first κ
    ranks = rank_table(maps["q_gram"], maps["k_gram"])
    assert len(parts["heads"]) == 8
    for r in parts["heads"]:
        li = [3, 5].index(r["layer"])
        window = [float(sl[li, r["head"], d]) for d in range(1, 7)]
        assert r["best_score"] == max(window) and r["best_delta"] == 1 + window.index(max(window))
        assert r["q_top1_energy"] == float(ranks["q_top1_energy"][li, r["head"]])
        assert ("predicted_peak" in r) == (r["layer"] == 5) and "profile" not in r
    assert torch.isnan(tensors["slash_predicted"][0]).all() and not torch.isnan(tensors["slash_predicted"][1]).any()
    assert torch.equal(tensors["slash"], sl) and torch.equal(tensors["slash_random"], rand["slash"])
    assert torch.equal(tensors["rank_k_n95"], ranks["k_n95"])
    # persistence at κ = 0.4: the two heads at Δ 1..6 reaching it, both halved on "random tokens"
    assert [(p["layer"], p["head"], p["delta"], p["persists"]) for p in parts["persistence"]] == [
        (3, 1, 2, True), (5, 3, 1, False)]
    plain, t2 = analyze_scans(maps, {"rotary_dim": None, "base": None, "scaling": 1.0}, [True, True], [0, 1],
                              _cfg(kappa=(0.1, 0.2), persist_kappa=0.15))
    assert plain["persistence"] is None and plain["persist_kappa"] == 0.15 and "slash_random" not in t2
    assert torch.isnan(t2["slash_predicted"]).all() and all("predicted_peak" not in r for r in plain["heads"])
    assert analyze_scans(maps, geom, [True, True], [0, 1], _cfg(kappa=(0.1, 0.2)))[0]["persist_kappa"] == 0.2
    rope = {"layer_kind": ["full", None], "kinds": {"full": {"inv_freq": [1.0, 0.5], "attention_scaling": 1.0}}}
    own = analyze_scans(maps, {"rotary_dim": None, "base": None, "scaling": 0.5, "rope": rope}, [True, True], [0, 1],
                        _cfg(kappa=(0.5,)))[0]["heads"]  # the scan's own RoPE tables, no rotary_dim
    assert [("predicted_peak" in r) for r in own] == [True] * 4 + [False] * 4
    none_on = analyze_scans(maps, geom, [False, False], [0, 1], _cfg(kappa=(0.5,)))[0]["heads"]
    assert all("predicted_peak" not in r for r in none_on)
    zero = analyze_scans(maps, geom, [True, True], [0, 1], _cfg(kappa=(0.5,), min_delta=0, max_delta=40))[0]
    assert zero["max_delta"] == 7 and max(zero["heads"], key=lambda r: r["best_score"])["best_delta"] == 0
    for bad in (dict(min_delta=-1), dict(min_delta=8, max_delta=9), dict(min_delta=4, max_delta=3)):
        with pytest.raises(PoslensError, match="--min-delta"):
            analyze_scans(maps, geom, [True, True], [0, 1], _cfg(**bad))
    assert analyze_scans(maps, geom, [True, True], [0, 1], _cfg(min_delta=7, max_delta=7))[0]["max_delta"] == 7


def test_slash_tables_store_numbers():
    from poslens.analysis.slash import HEAD_COLUMNS, analyze_scans, slash_tables

    maps = _fake_maps()
    parts, _ = analyze_scans(maps, {"rotary_dim": 4, "base": BASE, "scaling": 0.5}, [True, True], [0, 1],
                             _cfg(kappa=(0.3, 0.5)), {**maps})
    tables = slash_tables(parts, _cfg(kappa=(0.3, 0.5), top=3), 8)
    counts, heads, pers = tables
    assert counts["title"] == "number of (κ, Δ)-slash-dominant heads (of 8)"
    assert counts["columns"] == ["Δ", "κ=0.3", "κ=0.5", "heads at κ=0.3"] and counts["rows"] == parts["by_delta"]
    assert heads["columns"] == HEAD_COLUMNS and len(heads["columns"]) == 13 and heads["title"].startswith("top 3 heads")
    assert "Δ = 1..16" in heads["title"] or "Δ = 1..7" in heads["title"]
    top = sorted(parts["heads"], key=lambda r: -r["best_score"])[:3]
    assert [r[0] for r in heads["rows"]] == [f"{r['layer']}.{r['head']}" for r in top] == ["0.1", "1.3", "0.0"][:1] + \
        [f"{r['layer']}.{r['head']}" for r in top[1:]]
    for row, r in zip(heads["rows"], top):
        assert row[1:4] == [r["best_delta"], r["best_score"], r["q_top1_energy"]]  # unrounded numbers
        assert row[4:7] == [r["k_top1_energy"], r["q_effective_rank"], r["k_effective_rank"]]
        assert row[7:9] == [int(r["q_n95"]), int(r["k_n95"])] and isinstance(row[7], int)
        assert row[9:12] == [r["predicted_peak"], r["profile_corr"], r["coherence"]]
        assert row[12] == "/".join(fmt(r["band_usage"][b]) for b in ("high", "medium", "low"))
    assert pers["columns"] == ["layer.head", "Δ", "in-distribution", "random tokens", "ratio", "persists"]
    assert "(0.3, Δ)-SDHs" in pers["title"]
    assert pers["rows"] == [[f"{p['layer']}.{p['head']}", p["delta"], p["score_in"], p["score_random"], p["ratio"],
                             p["persists"]] for p in parts["persistence"]]
    bare = dict(parts, persistence=None, heads=[{**h, "band_usage": None, "profile_corr": None}
                                                for h in parts["heads"]])
    t = slash_tables(bare, _cfg(top=20), 8)
    assert len(t) == 2 and len(t[1]["rows"]) == 8 and t[1]["rows"][0][12] is None and t[1]["rows"][0][10] is None
    assert t[1]["title"].startswith("top 8 heads by SlashScore over Δ = 1..")


def _fake_scan(root, maps, layers_rope=(True, True), layer_ids=(0, 1), **summary):
    import json

    from poslens.models.families import build_config
    from poslens.rundir.io import write_tensors

    model = root / "model"
    model.mkdir(parents=True, exist_ok=True)
    build_config("rope", "micro", V, rope_theta=BASE, layers=2, hidden=16, heads=4, kv_heads=2,
                 intermediate=32).save_pretrained(str(model))
    scan = root / "scan"
    scan.mkdir(parents=True, exist_ok=True)
    write_tensors(scan / "maps.safetensors", {k: v.float() for k, v in maps.items()}, metadata={"layers": list(layer_ids)})
    (scan / "config.json").write_text(json.dumps({"options": {"model_dir": str(model)}, "source": {"kind": "stdlib"}}))
    (scan / "summary.json").write_text(json.dumps({"model_type": "smollm3", "num_seqs": 4,
                                                   "layers": [{"rope": r} for r in layers_rope], **summary}))
    return scan, model


def test_run_slash_on_a_hand_made_scan(tmp_path):
    import json

    from poslens.analysis.slash import SlashConfig, model_rope_geometry, run_slash
    from poslens.rundir.io import read_tensors

    maps = {k: v.float().double() for k, v in _fake_maps(Dh=8).items()}
    scan, model = _fake_scan(tmp_path, maps, (True, False), (4, 6), attention={"scaling": [0.25, 0.25]})
    geom = model_rope_geometry(str(model))
    assert geom["head_dim"] == 4 and geom["scaling"] == 0.5 and geom["num_kv_heads"] == 2 and geom["rotary_dim"] == 4
    out = tmp_path / "out"
    s = run_slash(SlashConfig(scan_dir=str(scan), out=str(out), kappa=(0.5, 0.3), max_delta=5, figures=False))
    assert s["geometry"]["scaling"] == 0.25 and s["geometry"]["base"] == BASE  # the scan's own logit scale
    assert s["title"] == "Slash-dominant heads of model (4 x 8 tokens)" and s["delta_range"] == [1, 5]  # its name
    assert s["kappas"] == [0.3, 0.5] and s["persist_kappa"] == 0.3 and s["persistence"] is None
    assert s["seq_len"] == 8 and s["model_dir"] == str(model) and s["figures"] == [] and s["paper"] == "slash"
    assert len(s["heads"]) == 8 and len(s["tables"]) == 2 and s.get("readings", []) == []
    assert s["judgement"]["best"]["score"] == max(h["best_score"] for h in s["heads"])
    assert [("predicted_peak" in r) for r in s["heads"]] == [True] * 4 + [False] * 4  # layer 1: no RoPE
    assert [r["layer"] for r in s["heads"]] == [4] * 4 + [6] * 4  # the scan's own layer indices
    assert s["experiment"] == "slash" and s["scan_dir"] == str(scan) and s["random_scan"] is None
    assert s["sdh_counts"] == s["tables"][0]["rows"] and s["tables"][0]["title"].endswith("(of 8)")
    saved = json.loads((out / "summary.json").read_text())
    assert saved["command"] == "slash" and saved["tables"][1]["rows"][0][0] == "4.1"
    assert saved["tables"][1]["rows"][0][2] == pytest.approx(0.9, abs=1e-7)  # stored as a number
    assert json.loads((out / "config.json").read_text())["command"] == "slash"
    t = read_tensors(out / "slash.safetensors")
    assert set(t) >= {"slash", "slash_predicted", "rank_q_top1_energy"} and not (out / "slash_profiles.png").exists()
    assert all(v.dtype == torch.float32 for v in t.values())
    from safetensors import safe_open

    with safe_open(str(out / "slash.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["layers"]) == [4, 6]
    # with the random-token twin, figures, and a model directory given
    rscan = tmp_path / "rand"
    _fake_scan(rscan, {**maps, "slash": maps["slash"] * 0.5})
    cfgj = json.loads((rscan / "scan" / "config.json").read_text())
    (rscan / "scan" / "config.json").write_text(json.dumps({**cfgj, "source": {"kind": "random"}}))
    import poslens.analysis.slash as mod

    drawn = []
    real = mod._profiles_figure

    def spy(*a, **kw):
        drawn.append(kw.get("random"))
        return real(*a, **kw)

    mod._profiles_figure = spy
    try:
        s2 = run_slash(SlashConfig(scan_dir=str(scan), out=str(tmp_path / "o2"), random_scan=str(rscan / "scan"),
                                   kappa=(0.4,), model_dir=str(model)))
    finally:
        mod._profiles_figure = real
    assert s2["random_scan"] == str(rscan / "scan") and s2["figures"][0]["file"] == "slash_profiles.png"
    assert len(drawn) == 1 and torch.equal(drawn[0], (maps["slash"] * 0.5).float().double())
    assert s2["title"].endswith("(4 x 8 tokens, with random-token control)") and len(s2["tables"]) == 3
    assert [(p["layer"], p["head"], p["persists"]) for p in s2["persistence"]] == [(4, 1, True), (6, 3, False)]
    assert (tmp_path / "o2" / "slash_profiles.png").is_file() and "on random tokens" in s2["figures"][0]["caption"]
    assert "slash_random" in read_tensors(tmp_path / "o2" / "slash.safetensors")


def test_run_slash_title_without_a_sequence_count(tmp_path):
    """A scan summary that does not record its sequence count reads '?' in the title, not 'None'."""
    import json

    from poslens.analysis.slash import SlashConfig, run_slash

    maps = {k: v.float().double() for k, v in _fake_maps(Dh=8).items()}
    scan, _ = _fake_scan(tmp_path, maps)
    ssum = json.loads((scan / "summary.json").read_text())
    del ssum["num_seqs"]
    (scan / "summary.json").write_text(json.dumps(ssum))
    s = run_slash(SlashConfig(scan_dir=str(scan), out=str(tmp_path / "out"), kappa=(0.5,), max_delta=5, figures=False))
    assert s["title"] == "Slash-dominant heads of model (? x 8 tokens)"


def test_run_slash_input_errors(tmp_path):
    import json

    from poslens.analysis.slash import SlashConfig, model_rope_geometry, run_slash

    maps = _fake_maps(Dh=8)
    scan, model = _fake_scan(tmp_path, maps, layers_rope=())  # no per-layer record: RoPE where the model has it

    def fails(match, **kw):
        with pytest.raises(PoslensError, match=match):
            run_slash(SlashConfig(**{"scan_dir": str(scan), "out": str(tmp_path / "x"), "figures": False, **kw}))
        assert not (tmp_path / "x").exists()

    fails("--kappa", kappa=(0.5, 1.5))
    fails("--kappa", kappa=(0.0,))
    fails("--kappa", kappa=())
    k1 = run_slash(SlashConfig(scan_dir=str(scan), out=str(tmp_path / "k1"), kappa=(1.0,), figures=False))
    assert len(k1["heads"]) == 8 and all("predicted_peak" in r for r in k1["heads"])
    fails("no maps.safetensors", scan_dir=str(tmp_path))
    fails("not random tokens", random_scan=str(scan))
    small = tmp_path / "small"
    _fake_scan(small, {k: v[:1] for k, v in maps.items()})
    fails("does not match", random_scan=str(small / "scan"))
    (scan / "config.json").write_text(json.dumps({}))
    fails("does not name the model")
    part = tmp_path / "part"
    _fake_scan(part, {k: v for k, v in maps.items() if k != "dim_logit"})
    fails("lacks 'dim_logit'", scan_dir=str(part / "scan"), model_dir=str(model))
    with pytest.raises(PoslensError, match="no config.json"):
        model_rope_geometry(str(tmp_path))


def test_profiles_figure_draws_the_top_heads_data():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from poslens.analysis.slash import _profiles_figure

    g = torch.Generator().manual_seed(0)
    slash = torch.rand(2, 3, 8, generator=g, dtype=torch.float64)
    rand = slash * 0.5
    pred = torch.full_like(slash, float("nan"))
    pred[1] = slash[1] * 2
    heads = [{"layer": l, "head": h, "best_score": float(slash[i, h].max())} for i, l in enumerate((4, 6))
             for h in range(3)]
    top = sorted(heads, key=lambda r: -r["best_score"])[:5]
    fig = _profiles_figure(slash, pred, heads, [4, 6], 5, n=5, random=rand)
    axes = fig.axes
    assert len(axes) == 8 and fig.get_size_inches() == pytest.approx([3.4 * 4, 2.6 * 2])
    for ax, r in zip(axes, top):
        li = [4, 6].index(r["layer"])
        lines = ax.get_lines()
        assert ax.get_title() == f"layer {r['layer']} head {r['head']} (layers from 0)"
        assert ax.get_xlabel() == "Δ" and ax.get_ylabel() == "SlashScore"
        assert list(lines[0].get_xdata()) == list(range(6))
        assert list(lines[0].get_ydata()) == slash[li, r["head"], :6].tolist()
        assert list(lines[1].get_ydata()) == rand[li, r["head"], :6].tolist()
        assert len(lines) == (3 if li == 1 else 2)
        if li == 1:
            assert list(lines[2].get_ydata()) == pred[li, r["head"], :6].tolist()
        assert [ln.get_label() for ln in lines] == ["observed", "random tokens", "rank-one RoPE"][: len(lines)]
    assert axes[0].get_legend() is not None and all(ax.get_legend() is None for ax in axes[1:])
    assert all(not ax.axison for ax in axes[5:]) and all(ax.axison for ax in axes[:5])
    plt.close(fig)
    fig = _profiles_figure(slash, pred, heads[:1], [4, 6], 3)  # one head: one panel
    assert len(fig.axes) == 1 and fig.axes[0].get_legend() is not None
    plt.close(fig)
    fig = _profiles_figure(slash, pred, heads[:2], [4, 6], 3)
    assert len(fig.axes) == 2 and [len(ax.get_lines()) for ax in fig.axes] == [1, 1]
    plt.close(fig)


def test_model_rope_geometry_reads_the_query_scalar_and_the_scan_its_rope_tables(tmp_path):
    from transformers import Gemma3TextConfig

    from poslens.analysis.slash import SlashConfig, model_rope_geometry, run_slash

    gem = tmp_path / "gemma"
    Gemma3TextConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=4, query_pre_attn_scalar=64).save_pretrained(str(gem))
    g = model_rope_geometry(str(gem))
    assert g["scaling"] == 64 ** -0.5 and g["head_dim"] == 4 and g["num_kv_heads"] == 2  # not head_dim ** -0.5
    rope = {"layer_kind": ["full", "full"], "kinds": {"full": {"inv_freq": [1.0, 0.5], "attention_scaling": 1.0}}}
    scan, _ = _fake_scan(tmp_path / "r", _fake_maps(Dh=8), rope=rope, attention={"scaling": [0.25, 0.5]})
    s = run_slash(SlashConfig(scan_dir=str(scan), out=str(tmp_path / "o")))  # figures without a random scan
    assert (tmp_path / "o" / "slash_profiles.png").is_file() and "random" not in s["figures"][0]["caption"]
    assert s["geometry"]["rope"] == rope and s["geometry"]["scaling"] == 0.5  # two scales: the model's own
