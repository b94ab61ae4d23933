"""Known-answer tests of the neighbourhood analysis (arXiv 2501.00073)."""

import json
import math

import pytest
import torch

from poslens.analysis.neighborhood import collect_vectors, measure_neighborhood, use_poslens_attention
from poslens.metrics.neighborhood import self_cosine, theory_gap
from poslens.metrics import adjacency_probability_score, norm_score
from poslens.theory import running_mean_cosine

T = 16


@pytest.fixture(scope="module")
def near_zero_nope():
    """A one-layer NoPE model with N(0, 0.0002) weights: attention is uniform to ~1e-6."""
    from poslens.models.families import build_model

    torch.manual_seed(0)
    m = build_model("none", "micro", 512, init_std=0.0002, hidden=256, heads=4, kv_heads=4, layers=1, seed=0).eval()
    return use_poslens_attention(m)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 512, (16, T), generator=torch.Generator().manual_seed(0))


def test_running_mean_theory_on_iid_vectors():
    """Running means of i.i.d. vectors: cos = sqrt(min/max), norms ∝ 1/sqrt(i), APS and norm score ≈ 1."""
    g = torch.Generator().manual_seed(1)
    v = torch.randn(8, 32, 4096, generator=g, dtype=torch.float64)
    i = torch.arange(1, 33, dtype=torch.float64)
    y = v.cumsum(1) / i[None, :, None]
    cos = self_cosine(y).mean(0)
    assert torch.allclose(cos, running_mean_cosine(32), atol=0.03)
    ratio = y.norm(dim=-1).mean(0) * i.sqrt()  # constant when norms fall as 1/sqrt(i)
    assert float(ratio.std() / ratio.mean()) < 0.02
    assert float(norm_score(y.norm(dim=-1)).mean()) > 0.95
    assert float(adjacency_probability_score(self_cosine(y)).mean()) > 0.95
    # the same vectors without the running mean carry no order: chance level
    assert abs(float(adjacency_probability_score(self_cosine(v)).mean()) - 0.5) < 0.05


def test_first_layer_aps_causal_vs_bidirectional(near_zero_nope, ids):
    c = measure_neighborhood(near_zero_nope, ids)
    b = measure_neighborhood(near_zero_nope, ids, bidirectional=True)
    # layer 0 = embeddings of random tokens: chance; layer 1 = running mean: APS ≈ 1
    assert abs(float(c["aps"][0].mean()) - 0.5) < 0.05
    assert float(c["aps"][1].mean()) > 0.98
    # bidirectional: every position attends to the same uniform mean, so no order (APS ≈ 0.5)
    assert abs(float(b["aps"][1].mean()) - 0.5) < 0.06
    # the measured mean cosine map matches sqrt(min/max) (uniform causal attention)
    assert theory_gap(c["cosine"][1]) < 0.02
    assert theory_gap(b["cosine"][1]) > 0.2  # and the control does not
    # norms fall as 1/sqrt(i): norm * sqrt(i) is flat; the norm score is ≈ 1
    i = torch.arange(1, T + 1, dtype=torch.float64)
    r = c["norms"][1] * i.sqrt()
    assert float(r.std() / r.mean()) < 0.03
    assert float(c["norm_score"][1].mean()) > 0.98
    assert c["aps"].shape == (2, ids.shape[0]) and c["resid_aps"].shape == (2, ids.shape[0])


def test_collect_vectors_matches_model_and_sdpa(near_zero_nope, ids):
    """The poslens attention leaves outputs unchanged, and the last residual vector is the model's."""
    v = collect_vectors(near_zero_nope, ids[:2])
    out = near_zero_nope(input_ids=ids[:2], output_hidden_states=True)
    assert torch.allclose(v["resid"][0], out.hidden_states[0].float())
    assert v["attn"][1].shape == (2, T, 256)


def test_aps_is_sensitive_to_shuffling(near_zero_nope, ids):
    """Permuting positions of the layer-1 vectors destroys the pattern (the metric can fail)."""
    x = collect_vectors(near_zero_nope, ids)["attn"][1]
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(0))
    assert float(adjacency_probability_score(self_cosine(x[:, perm])).mean()) < 0.75


def _save(model, path):
    model.save_pretrained(path)
    return path


def test_cli_writes_run_dir(cli, tmp_path, near_zero_nope):
    mdir = _save(near_zero_nope, tmp_path / "m")
    out = tmp_path / "run"
    code, stdout, err = cli("neighborhood", mdir, "--out", out, "--seq-len", 12, "--num-seqs", 4, "--batch-size", 2,
                            "--bidirectional", "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    c = json.loads((out / "config.json").read_text())
    assert c["command"] == "neighborhood" and "versions" in c and c["bidirectional"] is True
    assert s["paper"] == "neighborhood" and s["tables"][0]["rows"] and s["readings"] == []
    assert {f["file"] for f in s["figures"]} <= {p.name for p in out.iterdir()}
    assert s["layers"][1]["aps_mean"] > 0.95 and abs(s["layers"][1]["bidirectional_aps_mean"] - 0.5) < 0.15
    # one layer convention: the embeddings by name, then decoder layers from 0, in summary, table and readings
    assert [l["layer"] for l in s["layers"]] == ["embeddings", 0] == s["layer_info"]["indices"]
    assert [r[0] for r in s["tables"][0]["rows"]] == ["embeddings", 0]
    assert "from 0" in s["tables"][0]["title"] and "from 0" in s["layer_info"]["convention"]
    j = s["judgement"]
    assert (j["layer"], j["aps"], j["embeddings_aps"]) == (0, s["layers"][1]["aps_mean"], s["layers"][0]["aps_mean"])
    assert "best_layer" not in j and j["adjacency"] == "clear"  # one decoder layer: no highest or last layer
    assert j["mask"] == "creates"  # causal ≈ 1, bidirectional ≈ chance
    assert (out / "neighborhood.safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.partial")]
    # an existing run directory is refused without --overwrite, and nothing is written for bad input
    code, _, err = cli("neighborhood", mdir, "--out", out, "--quiet")
    assert code == 2 and "--overwrite" in err
    code, _, err = cli("neighborhood", mdir, "--out", tmp_path / "bad", "--seq-len", 2, "--quiet")
    assert code == 2 and "--seq-len" in err and not (tmp_path / "bad").exists()
    code, _, err = cli("neighborhood", tmp_path / "missing", "--out", tmp_path / "bad2", "--quiet")
    assert code == 2 and "does not exist" in err


def test_theory_gap_is_zero_for_theory():
    assert theory_gap(running_mean_cosine(10)) == 0.0
    assert math.isfinite(theory_gap(torch.eye(10)))


def test_cli_chars_source(cli, tmp_path):
    from poslens.models.families import build_model
    from poslens.data.tokenizer import char_tokenizer

    tok = char_tokenizer()
    m = build_model("none", "micro", len(tok), init_std=0.0002, hidden=64, heads=2, kv_heads=2, layers=1, seed=0)
    mdir = tmp_path / "cm"
    m.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    out = tmp_path / "run"
    code, _, err = cli("neighborhood", mdir, "--out", out, "--chars", "0123456789", "--seq-len", 10, "--num-seqs", 3,
                       "--no-figures", "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert s["source"]["kind"] == "chars" and s["source"]["bos"] == tok.bos_token_id and s["layers"][1]["aps_mean"] > 0.9
    code, _, err = cli("neighborhood", mdir, "--out", tmp_path / "x", "--chars", "01", "--data", "stdlib", "--quiet")
    assert code == 2 and "--chars" in err


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "cohere"])
def test_collect_vectors_uses_the_adapters_capture_points(arch, tmp_path):
    """attn_z (head outputs before the output projection) rebuilds the layer output through the model's own
    modules: sequential GPT-2 and the parallel-residual GPT-NeoX and Cohere blocks."""
    from poslens.capture.model.load import load_model
    from tests.capture.test_capture import V, save_tiny

    path = save_tiny(arch, tmp_path / "m")
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    x = torch.randint(3, V, (2, 10), generator=torch.Generator().manual_seed(0))
    v = collect_vectors(model, x)
    with torch.no_grad():
        hs = model(input_ids=x, output_hidden_states=True).hidden_states
        h0, z = hs[0], v["attn"][1]
        if arch == "gpt2":
            blk = model.transformer.h[0]
            mid = h0 + blk.attn.c_proj(z)
            rebuilt = mid + blk.mlp(blk.ln_2(mid))
        elif arch == "gpt_neox":
            blk = model.gpt_neox.layers[0]
            rebuilt = h0 + blk.attention.dense(z) + blk.mlp(blk.post_attention_layernorm(h0))
        else:
            blk = model.model.layers[0]
            rebuilt = h0 + blk.self_attn.o_proj(z) + blk.mlp(blk.input_layernorm(h0))
    assert torch.allclose(v["resid"][0], h0) and torch.allclose(v["resid"][1], hs[1], atol=1e-6)
    assert torch.allclose(rebuilt, hs[1], atol=1e-5), arch
    assert len(v["attn"]) == 4  # embeddings + 3 layers
