import math

import pytest
import torch

from poslens.errors import PoslensError
from poslens.rundir.io import read_json, read_tensors
from poslens.simulator import RNG_BLOCK, SimConfig, load_result, run_simulation, sample_inputs
from poslens.theory import kim_mean_field, kim_theory


def test_inputs_have_mean_inner_product_alpha():
    for alpha in (0.0, 0.2, 0.6):
        x = sample_inputs(SimConfig(alpha=alpha, dim=256, seq_len=10), 0).double()
        assert torch.allclose(x.norm(dim=-1), torch.ones(1, dtype=torch.float64), atol=1e-6)
        g = x @ x.transpose(-1, -2)
        off = g[:, ~torch.eye(10, dtype=torch.bool)]
        assert float(off.mean()) == pytest.approx(alpha, abs=0.01)


def test_simulation_converges_to_theory_as_dim_grows():
    # Layer 2 of the L2 model: the closed form is exact when <x_i, x_j> = alpha exactly; the
    # fluctuation is O(1/sqrt(d)), so the gap must shrink as d grows.
    alpha, N = 0.2, 8
    theory = kim_theory(alpha, N).scores
    lower = torch.ones(N, N, dtype=torch.bool).tril(-1)
    gaps = []
    for dim in (16, 128, 1024):
        r = run_simulation(SimConfig(alpha=alpha, seq_len=N, dim=dim, layers=2, samples=4000))
        gaps.append(float((r.scores[1] - theory)[lower].abs().max()))
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 0.01


def test_deep_layers_converge_to_mean_field():
    N, L = 6, 4
    r = run_simulation(SimConfig(alpha=0.0, seq_len=N, dim=2048, layers=L, samples=2000))
    mf = kim_mean_field(0.0, N, L)
    lower = torch.ones(N, N, dtype=torch.bool).tril(-1)
    assert float((r.scores - mf)[:, lower].abs().max()) < 0.01


def test_stderr_matches_spread_across_seeds():
    cfg = dict(alpha=0.0, seq_len=6, dim=32, layers=2, samples=2 * RNG_BLOCK)
    means = torch.stack([run_simulation(SimConfig(seed=s, **cfg)).scores[1] for s in range(8)])
    se = run_simulation(SimConfig(seed=0, **cfg)).scores_stderr[1]
    lower = torch.ones(6, 6, dtype=torch.bool).tril(-1)
    ratio = float(means.std(0)[lower].mean() / se[lower].mean())
    assert 0.6 < ratio < 1.5


def test_chunking_does_not_change_results():
    base = dict(alpha=0.3, seq_len=7, dim=16, layers=3, samples=3 * RNG_BLOCK + 17)
    a = run_simulation(SimConfig(chunk_size=RNG_BLOCK, **base))
    b = run_simulation(SimConfig(chunk_size=4 * RNG_BLOCK, **base))
    assert a.samples == b.samples == base["samples"]
    torch.testing.assert_close(a.scores, b.scores, equal_nan=True, rtol=0, atol=1e-6)


def _materialised_reference(cfg: SimConfig):
    """Independent reference: every sample's every layer kept in float64, statistics at the end."""
    from poslens.rope import apply_rope, cos_sin

    n_blocks = -(-cfg.samples // RNG_BLOCK)
    dev = "cuda" if str(cfg.device).startswith("cuda") else "cpu"  # the stream the run draws (per device)
    x = torch.cat([sample_inputs(cfg, b, device=dev).cpu() for b in range(n_blocks)])[: cfg.samples].double()
    S, d = cfg.seq_len, cfg.dim
    upper = torch.ones(S, S, dtype=torch.bool).triu(1)
    cs = cos_sin(torch.arange(S), d, cfg.rope_theta, dtype=torch.float64) if cfg.rope else None
    scores, probs = [], []
    for _ in range(cfg.layers):
        if cfg.norm == "l2":
            y = x / x.norm(dim=-1, keepdim=True)
        else:
            y = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        q = apply_rope(y, *cs) if cfg.rope else y
        s = cfg.score_scale * q @ q.transpose(1, 2)
        p = torch.softmax(s.masked_fill(upper, float("-inf")) if cfg.causal else s, -1)
        x = x + p @ y
        scores.append(s)
        probs.append(p)
    s = torch.stack(scores, 1)  # [n, L, S, S]
    G = 16
    groups = torch.stack([s[g::G].mean(0) for g in range(min(G, cfg.samples))])
    return s.mean(0), s.std(0) / math.sqrt(cfg.samples), torch.stack(probs, 1).mean(0), groups


@pytest.mark.parametrize("kw", [
    dict(alpha=0.0, seq_len=12, dim=16, layers=3, samples=2 * RNG_BLOCK + 37, chunk_size=RNG_BLOCK),
    dict(alpha=0.4, seq_len=9, dim=16, layers=2, samples=RNG_BLOCK + 5, chunk_size=2 * RNG_BLOCK),
    dict(alpha=0.3, rope=True, rope_theta=100.0, seq_len=10, dim=8, layers=2, samples=300),
    dict(alpha=0.2, norm="layernorm", scale="sqrt-d", seq_len=7, dim=16, layers=2, samples=260),
    dict(alpha=0.1, causal=False, rope=True, seq_len=8, dim=8, layers=2, samples=270),
])
def test_streaming_statistics_equal_the_materialised_reference(kw):
    """Same numbers as keeping every sample (float64) and averaging at the end: means, standard
    errors, weights and each noise group's mean (sample n in group n % 16)."""
    cfg = SimConfig(**kw)
    r = run_simulation(cfg, workers=2)
    mean, se, probs, groups = _materialised_reference(cfg)
    S = cfg.seq_len
    valid = torch.ones(S, S, dtype=torch.bool).tril(-1) if cfg.causal else ~torch.eye(S, dtype=torch.bool)
    tol = dict(rtol=0, atol=2e-5 * cfg.score_scale * cfg.dim if cfg.norm == "layernorm" else 2e-5)
    torch.testing.assert_close(r.scores[:, valid], mean[:, valid], **tol)
    torch.testing.assert_close(r.scores_stderr[:, valid], se[:, valid], rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(r.probs, probs, rtol=0, atol=2e-6)
    torch.testing.assert_close(r.score_groups[:, :, valid], groups[:, :, valid], **tol)
    assert r.group_counts.tolist() == [len(range(g, cfg.samples, 16)) for g in range(16)]
    if cfg.causal:
        upper = torch.ones(S, S, dtype=torch.bool).triu(1)
        assert r.scores[:, upper].isnan().all() and (r.probs[:, upper] == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_simulation_equals_the_materialised_reference_of_its_own_draws():
    """On CUDA the inputs are drawn on the device (another stream than the CPU's): the streaming
    statistics equal the float64 reference of those same draws."""
    cfg = SimConfig(alpha=0.3, rope=True, rope_theta=100.0, seq_len=10, dim=8, layers=2, samples=2 * RNG_BLOCK + 37,
                    device="cuda")
    r = run_simulation(cfg)
    mean, se, probs, groups = _materialised_reference(cfg)
    valid = torch.ones(10, 10, dtype=torch.bool).tril(-1)
    torch.testing.assert_close(r.scores[:, valid], mean[:, valid], rtol=0, atol=2e-5)
    torch.testing.assert_close(r.probs, probs, rtol=0, atol=2e-6)
    torch.testing.assert_close(r.score_groups[:, :, valid], groups[:, :, valid], rtol=0, atol=2e-5)


def test_workers_give_identical_results():
    """Chunk sums are folded in chunk order: any number of workers gives the same bits."""
    base = SimConfig(alpha=0.3, seq_len=7, dim=16, layers=3, samples=5 * RNG_BLOCK + 17, chunk_size=RNG_BLOCK)
    runs = [run_simulation(base, workers=w) for w in (1, 3)]
    for name in ("scores", "scores_stderr", "probs", "score_groups"):
        a, b = (getattr(r, name) for r in runs)
        assert torch.equal(a.nan_to_num(0), b.nan_to_num(0)) and torch.equal(a.isnan(), b.isnan()), name


def test_workers_restore_torch_threads():
    before = torch.get_num_threads()
    run_simulation(SimConfig(seq_len=5, dim=8, layers=1, samples=2 * RNG_BLOCK), workers=2)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("kw", [dict(), dict(rope=True, causal=False), dict(norm="layernorm", scale="d")])
def test_forward_layers_with_buffers_equals_without(kw):
    from poslens.rope import cos_sin
    from poslens.simulator import forward_layers, layer_buffers

    cfg = SimConfig(seq_len=6, dim=8, layers=3, **kw).validate()
    x = sample_inputs(cfg, 0)[:20]
    cs = cos_sin(torch.arange(6), 8, cfg.rope_theta) if cfg.rope else None
    neg = torch.zeros(6, 6).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf")) if cfg.causal else None
    plain = [(s.clone(), p.clone()) for s, p in forward_layers(x, cfg, cs, neg)]
    bufs = layer_buffers(cfg, 32, "cpu")
    xb = bufs["x"][:20]
    xb.copy_(x)
    fast = [(s.clone(), p.clone()) for s, p in forward_layers(xb, cfg, cs, neg, buffers=bufs)]
    for (s1, p1), (s2, p2) in zip(plain, fast):
        torch.testing.assert_close(s2, s1, rtol=0, atol=1e-6)
        torch.testing.assert_close(p2, p1, rtol=0, atol=1e-6)
    assert torch.equal(x, sample_inputs(cfg, 0)[:20])  # without buffers the input is left as it was


def test_sample_inputs_into_a_buffer_is_the_same_stream():
    for alpha in (0.0, 0.5):
        cfg = SimConfig(alpha=alpha, seq_len=5, dim=8)
        buf = torch.empty(RNG_BLOCK, 5, 8)
        assert torch.equal(sample_inputs(cfg, 7, out=buf), sample_inputs(cfg, 7))
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7)  # the documented stream
        z = torch.randn(RNG_BLOCK, 5, 8, generator=g)
        if alpha:
            z = z + math.sqrt(alpha / (1 - alpha)) * torch.randn(RNG_BLOCK, 1, 8, generator=g)
        torch.testing.assert_close(buf, torch.nn.functional.normalize(z, dim=-1), rtol=0, atol=1e-7)


def test_rope_causal_breaks_relativity_noncausal_keeps_it():
    # arXiv 2509.21042, Fig. 4: with RoPE the non-causal control stays relative in every layer,
    # while causal attention makes layers >= 2 non-relative.
    common = dict(alpha=0.5, rope=True, seq_len=24, dim=64, layers=3, samples=3000)
    causal = run_simulation(SimConfig(causal=True, **common)).summary["layers"]
    bidir = run_simulation(SimConfig(causal=False, **common)).summary["layers"]
    for l in bidir:
        assert l["relativity_index"] > 0.98
    assert causal[0]["relativity_index"] > 0.98
    for l in causal[1:]:
        assert l["relativity_index"] < 0.97


def test_layer0_is_flat_and_layer1_is_local():
    """Our layers count from 0: the paper's layer 1 (flat) is our layer 0."""
    s = run_simulation(SimConfig(alpha=0.0, seq_len=20, dim=64, layers=2, samples=3000)).summary["layers"]
    assert s[0]["relativity_index"] is None and s[0]["locality"] is None
    assert s[1]["locality"] > 0.5
    assert s[1]["relativity_index"] < 0.9


def test_layernorm_scales():
    a = run_simulation(SimConfig(norm="layernorm", scale="d", seq_len=5, dim=32, layers=1, samples=RNG_BLOCK))
    # LayerNorm rows have squared norm d, so with 1/d scaling the self-score is ~1
    assert torch.allclose(torch.diagonal(a.scores[0]), torch.ones(5, dtype=torch.float64), atol=1e-3)
    b = run_simulation(SimConfig(norm="layernorm", scale="sqrt-d", seq_len=5, dim=32, layers=1, samples=RNG_BLOCK))
    assert torch.allclose(torch.diagonal(b.scores[0]), torch.full((5,), math.sqrt(32), dtype=torch.float64), atol=1e-2)


def test_target_stderr_stops_early():
    r = run_simulation(SimConfig(seq_len=6, dim=16, layers=1, samples=50 * RNG_BLOCK, target_stderr=0.02))
    assert r.stopped_early and r.samples < 50 * RNG_BLOCK
    assert r.summary["layers"][0]["max_stderr"] < 0.02


@pytest.mark.parametrize("kw", [dict(alpha=1.0), dict(alpha=-0.1), dict(layers=0), dict(seq_len=0),
                                dict(dim=-1), dict(samples=0), dict(scale="d"), dict(norm="rms"),
                                dict(norm="layernorm", scale="2d"), dict(rope=True, dim=7)])
def test_bad_config(kw):
    with pytest.raises(PoslensError):
        SimConfig(**kw).validate()


def test_cli_writes_contract_and_loads_back(cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, _ = cli("simulate", "--samples", 500, "--seq-len", 8, "--dim", 16, "--num-layers", 2, "--out", out,
                          "--device", "cpu", "--quiet")
    assert code == 0
    t = read_tensors(out / "maps.safetensors")
    assert set(t) == {"scores", "scores_stderr", "probs", "score_groups", "group_counts"}
    assert t["score_groups"].shape == (16, 2, 8, 8) and int(t["group_counts"].sum()) == 500
    assert t["scores"].shape == (2, 8, 8)
    assert torch.isnan(t["scores"][0, 0, 1]) and not torch.isnan(t["scores"][0, 1, 0])
    torch.testing.assert_close(t["probs"].sum(-1), torch.ones(2, 8))
    summ = read_json(out / "summary.json")
    assert [set(l) >= {"relativity_index", "locality", "max_stderr"} for l in summ["layers"]] == [True, True]
    cfg = read_json(out / "config.json")
    assert cfg["samples"] == 500 and "torch" in cfg["versions"]
    for f in ("scores_raw.png", "scores_diagnorm.png", "probs.png"):
        assert (out / f).stat().st_size > 1000
    res = load_result(out)
    assert res.scores.shape == (2, 8, 8) and res.samples == 500
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


@pytest.mark.parametrize("args", [["--alpha", "1.5"], ["--scale", "d"], ["--seq-len", "0"], ["--samples", "-3"]])
def test_cli_bad_input_writes_nothing(cli, tmp_path, args):
    out = tmp_path / "run"
    code, _, err = cli("simulate", *args, "--out", out, "--quiet")
    assert code != 0 and err
    assert not out.exists()


def test_cli_out_is_a_file(cli, tmp_path):
    f = tmp_path / "file"
    f.write_text("keep me")
    code, _, err = cli("simulate", "--samples", 10, "--out", f, "--quiet")
    assert code == 2 and "file" in err
    assert f.read_text() == "keep me"




def test_workers_bound_the_threads_and_their_buffers():
    """``workers=3`` runs the chunks on three threads (each holds one chunk's buffers: memory is bounded
    by the workers), however many chunks are in flight, whatever the number of CPUs."""
    import threading

    seen: set[str] = set()

    def progress(done, total):
        seen.update(t.name for t in threading.enumerate() if t.name.startswith("poslens-sim"))

    run_simulation(SimConfig(seq_len=4, dim=4, layers=1, samples=8 * RNG_BLOCK, chunk_size=RNG_BLOCK),
                   progress=progress, workers=3)
    assert len(seen) == 3, seen


def test_saved_run_directory_with_figures(tmp_path, monkeypatch):
    """The run directory written with figures: every figure the summary names exists as a PNG, the
    weights figure titles its panels by layer from 0, and the tensors' metadata says so."""
    import json

    from safetensors import safe_open

    from poslens import figures as plots
    from poslens.simulator import save_result

    drawn = {}
    real = plots.layer_grid

    def spy(maps, *, titles, suptitle="", **kw):
        drawn[suptitle] = list(titles)
        return real(maps, titles=titles, suptitle=suptitle, **kw)

    monkeypatch.setattr(plots, "layer_grid", spy)
    res = run_simulation(SimConfig(alpha=0.2, layers=2, seq_len=4, dim=8, samples=40))
    save_result(res, tmp_path / "run")
    figures = json.loads((tmp_path / "run" / "summary.json").read_text())["figures"]
    names = [f if isinstance(f, str) else f["file"] for f in figures]
    assert "probs.png" in names and len(names) >= 3
    for name in names:
        assert (tmp_path / "run" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    weights = [v for k, v in drawn.items() if "attention weights" in k]
    assert weights == [["layer 0", "layer 1"]]
    with safe_open(str(tmp_path / "run" / "maps.safetensors"), "pt") as f:
        meta = {k: json.loads(v) for k, v in f.metadata().items()}
    assert meta["layers"] == "from 0" and meta["samples"] == 40 and meta["label"] == res.config.label()
    assert "n % G" in meta["score_groups"]


def test_run_directory_round_trip(tmp_path):
    """config.json names the command and the versions; the noise groups' sample counts and an early
    stop load back; a summary written before ``stopped_early`` existed loads as a full run."""
    from poslens.rundir.io import write_json
    from poslens.simulator import save_result

    res = run_simulation(SimConfig(alpha=0.3, layers=2, seq_len=5, dim=6, samples=5 * RNG_BLOCK, chunk_size=RNG_BLOCK,
                                   target_stderr=10.0))  # met at once: stops after two blocks
    save_result(res, tmp_path / "r", figures=False)
    cfg = read_json(tmp_path / "r" / "config.json")
    assert cfg["command"] == "simulate" and cfg["samples"] == 5 * RNG_BLOCK and "torch" in cfg["versions"]
    assert read_tensors(tmp_path / "r" / "maps.safetensors")["group_counts"].tolist() == [
        len(range(g, 2 * RNG_BLOCK, 16)) for g in range(16)]
    back = load_result(tmp_path / "r")
    assert back.stopped_early is True and back.samples == 2 * RNG_BLOCK
    assert back.group_counts.tolist() == res.group_counts.tolist()
    assert back.summary["command"] == "simulate" and back.summary["layers"] == res.summary["layers"]
    from poslens.conventions import LAYER_CONVENTION

    assert back.summary["layer_info"]["convention"] == LAYER_CONVENTION
    # a summary whose layers count from 1 (as the paper's do) says so in its convention instead
    res.summary = dict(res.summary, layers=[dict(l, layer=l["layer"] + 1) for l in res.summary["layers"]])
    save_result(res, tmp_path / "from1", figures=False)
    assert "counted from 1" in read_json(tmp_path / "from1" / "summary.json")["layer_info"]["convention"]
    summary = read_json(tmp_path / "r" / "summary.json")
    del summary["stopped_early"]
    write_json(tmp_path / "r" / "summary.json", summary)
    assert load_result(tmp_path / "r").stopped_early is False


@pytest.mark.parametrize("causal", [False, True])
def test_forward_layers_work_inside_the_buffers(causal):
    """With buffers the layers allocate nothing: every layer yields the buffers' own scores and weights
    (with the mask fused into the score product or without a mask), and Y = Norm(X) is written into
    the ``y`` buffer (checked after one layer against F.normalize)."""
    from poslens.simulator import forward_layers, layer_buffers

    cfg = SimConfig(seq_len=6, dim=8, layers=3, causal=causal).validate()
    neg = torch.zeros(6, 6).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf")) if causal else None
    bufs = layer_buffers(cfg, 32, "cpu")
    assert {k: tuple(v.shape) for k, v in bufs.items()} == {"x": (32, 6, 8), "y": (32, 6, 8), "s": (32, 6, 6),
                                                            "p": (32, 6, 6)}
    assert all(v.dtype == torch.float32 for v in bufs.values())
    xb = bufs["x"][:20]
    xb.copy_(sample_inputs(cfg, 0)[:20])
    x0 = xb.clone()
    for n, (s, p) in enumerate(forward_layers(xb, cfg, None, neg, buffers=bufs)):
        assert s.data_ptr() == bufs["s"].data_ptr() and p.data_ptr() == bufs["p"].data_ptr()
        if n == 0:
            torch.testing.assert_close(bufs["y"][:20], torch.nn.functional.normalize(x0, dim=-1), rtol=0, atol=1e-7)


def test_rope_theta_below_one_is_valid():
    """Any positive base is a valid rotation (frequencies above 1 included); only <= 0 is rejected."""
    SimConfig(rope=True, rope_theta=0.5).validate()
    with pytest.raises(PoslensError):
        SimConfig(rope=True, rope_theta=0.0).validate()


def test_summary_weights_the_noise_groups_by_their_samples():
    """Each layer's statistics are describe_map of its mean map with the group means weighted by their
    sample counts (300 samples: groups of 19 and 18), which differ from equal weights here; a result
    without groups (a run directory written before them) summarises without a noise floor."""
    from dataclasses import replace as dc_replace

    from poslens.metrics.diagonal import describe_map
    from poslens.simulator import summarize

    res = run_simulation(SimConfig(alpha=0.3, layers=2, seq_len=6, dim=6, samples=300))
    assert sorted(set(res.group_counts.tolist())) == [18, 19]
    for l, entry in enumerate(res.summary["layers"]):
        want = describe_map(res.scores[l], res.score_groups[:, l], res.group_counts)
        equal = describe_map(res.scores[l], res.score_groups[:, l], torch.ones(16))
        assert {k: entry[k] for k in want} == want
        assert want != equal
    bare = summarize(dc_replace(res, score_groups=None, group_counts=None))
    assert all("noise_groups" not in l and l["noise"] == "no_groups" for l in bare["layers"])
