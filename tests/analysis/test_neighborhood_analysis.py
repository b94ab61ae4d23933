"""The neighbourhood analysis' numbers (arXiv 2501.00073) against plain loops: self-cosines,
per-sequence APS and norm score of the captured vectors, means over sequences and batches, the
per-layer rows, the uniform-attention theory gap and the summary's layer naming."""

import math

import pytest
import torch

from transformers import AutoModelForCausalLM
from transformers.models.llama import modeling_llama  # noqa: F401  (loaded once, before any fork)

from archs import save_tiny
from poslens.analysis.neighborhood import (_pick_layers, build_summary, collect_vectors, layer_name, layer_rows,
                                           layer_title, measure_neighborhood,
                                           use_poslens_attention)
from poslens.errors import PoslensError
from references import brute_aps, brute_cos


def test_layer_rows_mean_and_sample_std():
    aps = torch.tensor([[0.5, 0.7, 0.9], [0.1, 0.2, 0.6]], dtype=torch.float64)
    ns = torch.tensor([[1.0, 0.0, 0.5], [0.3, 0.3, 0.3]], dtype=torch.float64)
    rows = layer_rows({"x_aps": aps, "x_norm_score": ns}, prefix="x_")
    for k in range(2):
        a, s = aps[k].tolist(), ns[k].tolist()
        ma, ms = sum(a) / 3, sum(s) / 3
        assert rows[k]["layer"] == k
        assert rows[k]["aps_mean"] == pytest.approx(ma)
        assert rows[k]["aps_std"] == pytest.approx(math.sqrt(sum((v - ma) ** 2 for v in a) / 2))
        assert rows[k]["norm_score_mean"] == pytest.approx(ms)
        assert rows[k]["norm_score_std"] == pytest.approx(math.sqrt(sum((v - ms) ** 2 for v in s) / 2), abs=1e-12)
    one = layer_rows({"aps": aps[:, :1], "norm_score": ns[:, :1]})
    assert math.isnan(one[0]["aps_std"]) and one[0]["aps_mean"] == 0.5


def test_layer_naming_and_panels():
    assert [layer_name(k) for k in range(3)] == ["embeddings", 0, 1]
    assert [layer_title(k) for k in range(3)] == ["embeddings", "layer 0", "layer 1"]
    assert _pick_layers(5) == [0, 1, 2, 3, 4]
    assert _pick_layers(7) == list(range(7))
    assert _pick_layers(31) == [0, 5, 10, 15, 20, 25, 30]
    assert _pick_layers(10, max_panels=3) == [0, 4, 9]  # 4.5 rounds half to even


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny("llama", tmp_path_factory.mktemp("m"), layers=2)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    use_poslens_attention(model)
    return model


def test_measure_neighborhood_is_the_per_sequence_count_of_the_captured_vectors(tiny):
    ids = torch.randint(3, 50, (5, 7), generator=torch.Generator().manual_seed(2))
    out = measure_neighborhood(tiny, ids, batch_size=2)  # three batches, the last one short
    K = 3  # embeddings + 2 layers
    with torch.no_grad():
        vecs = collect_vectors(tiny, ids)
    for fam, pre in (("attn", ""), ("resid", "resid_")):
        assert out[f"{pre}aps"].shape == (K, 5) and out[f"{pre}cosine"].shape == (K, 7, 7)
        for k in range(K):
            x = vecs[fam][k].to(torch.float64)
            cos = [brute_cos(x[n].tolist()) for n in range(5)]
            for n in range(5):
                assert float(out[f"{pre}aps"][k, n]) == pytest.approx(brute_aps(cos[n]), abs=1e-9)
                norms = [-math.sqrt(sum(v * v for v in r)) for r in x[n].tolist()]
                assert float(out[f"{pre}norm_score"][k, n]) == pytest.approx(
                    brute_aps([norms[:] for _ in norms]), abs=1e-9)
            mean_cos = [[sum(cos[n][i][j] for n in range(5)) / 5 for j in range(7)] for i in range(7)]
            torch.testing.assert_close(out[f"{pre}cosine"][k], torch.tensor(mean_cos, dtype=torch.float64),
                                       rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(out[f"{pre}norms"][k], x.norm(dim=-1).mean(0), rtol=1e-6, atol=1e-6)
    only = measure_neighborhood(tiny, ids[:2], families=("resid",))
    assert "resid_aps" in only and "aps" not in only
    with pytest.raises(ValueError):
        measure_neighborhood(tiny, ids, families=("mlp",))
    with pytest.raises(PoslensError):
        measure_neighborhood(tiny, ids[:, :2])
    measure_neighborhood(tiny, ids[:, :3])  # three tokens: one triple, allowed


def test_build_summary_layers_and_theory_gap(tiny):
    ids = torch.randint(3, 50, (3, 6), generator=torch.Generator().manual_seed(3))
    causal = measure_neighborhood(tiny, ids)
    bid = measure_neighborhood(tiny, ids, bidirectional=True)
    s = build_summary({"causal": causal, "bidirectional": bid}, pe="rope", model_type="llama", num_seqs=3)
    assert [l["layer"] for l in s["layers"]] == ["embeddings", 0, 1]
    for k, l in enumerate(s["layers"]):
        assert l["aps_mean"] == pytest.approx(float(causal["aps"][k].mean()))
        assert l["resid_aps_mean"] == pytest.approx(float(causal["resid_aps"][k].mean()))
        assert l["bidirectional_aps_mean"] == pytest.approx(float(bid["aps"][k].mean()))
        assert l["norm_score_mean"] == pytest.approx(float(causal["norm_score"][k].mean()))
    # the theory gap is read off decoder layer 0's output (tensor index 1), not the embeddings
    T = 6
    th = [[math.sqrt(min(i, j) / max(i, j)) for j in range(1, T + 1)] for i in range(1, T + 1)]
    c1 = causal["cosine"][1].tolist()
    diffs = [abs(c1[i][j] - th[i][j]) for i in range(T) for j in range(i)]
    assert s["theory_gap_layer0"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-9)
    assert s["seq_len"] == T and s["num_seqs"] == 3 and s["modes"] == ["causal", "bidirectional"]
    assert len(s["tables"][0]["columns"]) == 6 and len(s["tables"][0]["rows"]) == 3
    s1 = build_summary({"causal": causal})
    assert len(s1["tables"][0]["columns"]) == 4 and "bidirectional_aps_mean" not in s1["layers"][0]
