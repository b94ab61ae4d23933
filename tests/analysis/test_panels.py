"""Nine-panel Gram decomposition (arXiv 2509.21042): every Gram matrix against a direct computation from the model's own modules."""

from __future__ import annotations

import json

import pytest
import torch

from poslens.analysis.panels import PANELS, PanelsConfig, panel_metrics, run_panels, run_score_maps
from poslens.rope import apply_rope
from poslens.rundir.io import read_tensors
from tests.capture.test_capture import V, save_tiny


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("llama") / "m")


def _reference(model_dir, ids, layer):
    """The nine panels by hand: eager attention weights, the modules applied one by one."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    cfg = model.config
    H, Hk = cfg.num_attention_heads, cfg.num_key_value_heads
    D = cfg.hidden_size // H
    B, S = ids.shape
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
        pos = torch.arange(S)[None].expand(B, S)

        def scores(l, x):
            lay = model.model.layers[l]
            y = lay.input_layernorm(x)
            q = lay.self_attn.q_proj(y).view(B, S, H, D).transpose(1, 2)
            k = lay.self_attn.k_proj(y).view(B, S, Hk, D).transpose(1, 2).repeat_interleave(H // Hk, 1)
            cos, sin = model.model.rotary_emb(x, pos)
            q, k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None])
            s = (q @ k.transpose(-1, -2) * D ** -0.5).mean((0, 1)).double()
            return s.tril()

        X = out.hidden_states[layer]
        lay = model.model.layers[layer]
        Y = lay.input_layernorm(X)
        A = out.attentions[layer]
        Vv = lay.self_attn.v_proj(Y).view(B, S, Hk, D).transpose(1, 2).repeat_interleave(H // Hk, 1)
        AV = (A @ Vv).transpose(1, 2).reshape(B, S, H * D)
        AVW = lay.self_attn.o_proj(AV)
        O = AVW + X
        LO = lay.post_attention_layernorm(O)
        Xn = lay.mlp(LO) + O
        assert torch.allclose(Xn, out.hidden_states[layer + 1], atol=1e-5)
        Yn = model.model.layers[layer + 1].input_layernorm(Xn)
        g = lambda x: torch.einsum("bsd,btd->st", x.double(), x.double()) / B  # noqa: E731
        return torch.stack([g(Y), scores(layer, X), g(AV), g(AVW), g(O), g(LO), g(Xn), g(Yn), scores(layer + 1, Xn)])


def test_panels_equal_direct_computation(llama_dir, tmp_path):
    from poslens.data.sources import make_source

    out = tmp_path / "p"
    summary = run_panels(PanelsConfig(model_dir=str(llama_dir), out=str(out), layer=1, data="random", num_seqs=5,
                                      seq_len=12, batch_size=2, seed=4), progress=False)
    got = read_tensors(out / "panels.safetensors")["panels"].double()
    ids = make_source("random", seq_len=12, num_seqs=5, seed=4, vocab_size=V).batch(0, 5)
    ref = _reference(llama_dir, ids, 1)
    i = torch.arange(12)
    lower = i[:, None] >= i[None, :]
    for n, (k, _) in enumerate(PANELS):
        a, b = got[n][lower], ref[n][lower]
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max())), k
    # the panels differ from one another (a mix-up of hooks would make two equal)
    assert not torch.allclose(got[2], got[3]) and not torch.allclose(got[0], got[7])
    for f in ("config.json", "summary.json", "panels.png", "panels.safetensors"):
        assert (out / f).is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"] == "panels" and "torch" in cfg["versions"]
    assert summary["paper"] == "kim" and len(summary["tables"][0]["rows"]) == 9 and summary["judgement"]["panels"] == 9
    assert "decoder layer 1" in summary["title"] and "key 0" in summary["tables"][0]["title"]
    assert "non-relativity with key 0" in summary["tables"][0]["columns"]
    # stored numbers stay numbers at full precision (the terminal and the report format them)
    for r, row in zip(summary["panels"], summary["tables"][0]["rows"]):
        assert row[2:] == [r["relativity_index"], r["non_relativity"], r["non_relativity_with_sink"], r["locality"],
                           r["diagonal_trend"], r["mean_offdiag"]]


def test_score_panels_carry_a_jackknife_se_of_their_locality(llama_dir, tmp_path):
    """Panels (b) and (i) of a run carry the delete-one-group jackknife SE of their locality (sequence
    n in group n % G); on given group sums it equals the jackknife formula computed by hand."""
    from poslens.analysis.panels import locality_se
    from poslens.metrics import locality
    from poslens.metrics.diagonal import causal_view

    summary = run_panels(PanelsConfig(model_dir=str(llama_dir), out=str(tmp_path / "p"), layer=0, data="random",
                                      num_seqs=12, seq_len=10, batch_size=4, seed=2, figures=False), progress=False)
    by = {r["panel"]: r for r in summary["panels"]}
    assert all(by[k]["locality_se"] is not None and by[k]["locality_se"] >= 0 for k in ("b", "i"))
    G = by["b"]["noise_groups"]
    assert G >= 2 and "locality_se" not in by["a"]
    # by hand: the leave-one-group-out maps' localities, and the jackknife formula
    g = torch.Generator().manual_seed(0)
    sums, counts = torch.rand(4, 9, 9, generator=g, dtype=torch.float64), torch.tensor([3, 2, 2, 1])
    loo = [(sums.sum(0) - sums[k]) / (counts.sum() - counts[k]) for k in range(4)]
    vals = torch.tensor([locality(causal_view(m, include_diagonal=True), exclude_keys=(0,)) for m in loo],
                        dtype=torch.float64)
    want = float((3 / 4 * ((vals - vals.mean()) ** 2).sum()).sqrt())
    assert abs(locality_se(sums, counts) - want) < 1e-12
    assert locality_se(sums[:1], counts[:1]) is None


def test_panel_metrics_known_maps():
    S = 10
    i = torch.arange(S, dtype=torch.float64)
    toeplitz = -(i[:, None] - i[None, :]).abs()  # depends on i - j only, rises towards the diagonal
    m = panel_metrics(toeplitz)
    assert m["relativity_index"] == pytest.approx(1.0) and m["non_relativity"] == pytest.approx(0.0)
    assert m["locality"] == pytest.approx(1.0)
    absolute = i[None, :].expand(S, S) * 1.0  # depends on the key position only
    assert panel_metrics(absolute)["non_relativity"] > 0.5
    # sink-aware as scan: a raised key-0 column (the attention sink) leaves the headline relative, the
    # with-sink value beside it is not
    sink = toeplitz.clone()
    sink[:, 0] += 5.0
    m = panel_metrics(sink)
    assert m["relativity_index"] == pytest.approx(1.0) and m["sink_columns"] == [0]
    assert m["non_relativity_with_sink"] > 0.1 and m["relativity_index_with_sink"] < 0.9
    assert m["locality"] == pytest.approx(1.0) and m["locality_with_sink"] < 1.0
    assert panel_metrics(sink, exclude_keys=())["relativity_index"] == pytest.approx(m["relativity_index_with_sink"])
    # signed trend: a map rising with the key position along every diagonal reads +1
    assert panel_metrics(absolute)["diagonal_trend"] == pytest.approx(1.0)


def test_panels_bad_input(llama_dir, tmp_path, cli):
    code, _, err = cli("panels", llama_dir, "--layer", 2, "--out", tmp_path / "x", "--data", "random")
    assert code == 2 and "--layer 2" in err and not (tmp_path / "x").exists()
    code, _, err = cli("panels", tmp_path / "nope", "--out", tmp_path / "y")
    assert code == 2 and "does not exist" in err


def test_score_maps_of_a_scan(llama_dir, tmp_path):
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan

    run_scan(ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "scan"), data="random", seq_len=10,
                        num_seqs=3, figures=False), progress=False)
    s = run_score_maps(str(tmp_path / "scan"), str(tmp_path / "maps"))
    assert len(s["tables"][0]["rows"]) == 3 and s["paper"] == "kim"
    assert [l["layer"] for l in s["layers"]] == [0, 1, 2] and "from 0" in s["tables"][0]["title"]
    assert [row[1:] for row in s["tables"][0]["rows"]] == [
        [l["relativity_index"], l["non_relativity"], l["non_relativity_with_sink"], l["locality"], l["diagonal_trend"]]
        for l in s["layers"]]  # unrounded numbers, as in "layers"
    # key 0 is out of the headline numbers; the sink's weight is its own number, from the scan's probabilities
    probs = read_tensors(tmp_path / "scan" / "maps.safetensors")["probs"].double()
    for li, l in enumerate(s["layers"]):
        assert l["sink_columns"] == [0] and "relativity_index_with_sink" in l
        assert l["sink_weight"] == pytest.approx(float(probs[li, 1:, 0].mean()), abs=1e-6)
    j = s["judgement"]  # key 0 is out of the headline numbers, the sink's weight beside them
    assert j["with_sink"] == [l["non_relativity_with_sink"] for l in s["layers"]]
    assert j["sink_weight"] == [l["sink_weight"] for l in s["layers"]]
    for f in s["figures"]:
        assert (tmp_path / "maps" / f["file"]).is_file()


@pytest.mark.parametrize("arch", ["gpt2", "gemma2", "olmo2", "mixtral"])
def test_panels_read_the_adapters_capture_points(arch, tmp_path):
    """Other block layouts: panel (a) = Gram of what the attention reads (ln_1 / input_layernorm output;
    OLMo 2 has no pre-attention norm), (g) = Gram of the layer output, (h) = the next layer's (a)."""
    from transformers import AutoModelForCausalLM

    from poslens.capture.model.adapters import get_adapter
    from poslens.capture.model.load import load_model
    from poslens.data.sources import make_source
    from poslens.analysis.panels import compute_panels

    path = save_tiny(arch, tmp_path / "m")
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    ad = get_adapter(model.config)
    src = make_source("random", seq_len=12, num_seqs=4, seed=1, vocab_size=V)
    got = compute_panels(model, ad, model.config, src, 0, batch_size=2, device="cpu", progress=False)
    ids = src.batch(0, 4)
    eager = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        hs = eager(input_ids=ids, output_hidden_states=True).hidden_states
        layers = ad.decoder_layers(eager)
        norm = (lambda l, x: layers[l].ln_1(x)) if arch == "gpt2" else (
            (lambda l, x: x) if arch == "olmo2" else (lambda l, x: layers[l].input_layernorm(x)))
        g = lambda x: torch.einsum("bsd,btd->st", x.double(), x.double()) / x.shape[0]  # noqa: E731
        ref = {"a": g(norm(0, hs[0])), "g": g(hs[1]), "h": g(norm(1, hs[1]))}
    for k, want in ref.items():
        n = [p for p, _ in PANELS].index(k)
        assert torch.allclose(got[n], want, rtol=1e-4, atol=1e-4 * float(want.abs().max())), (arch, k)


def test_panels_refuse_parallel_blocks():
    from poslens.analysis.panels import compute_panels
    from poslens.capture.model.adapters import ADAPTERS
    from poslens.errors import PoslensError

    for arch in ("phi", "gpt_neox", "cohere"):  # attention and MLP in parallel: no panels (e), (f)
        with pytest.raises(PoslensError, match="in parallel"):
            compute_panels(None, ADAPTERS[arch], None, None, 0, batch_size=1, device="cpu", progress=False)
