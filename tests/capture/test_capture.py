"""Exactness of the capture engine on tiny random models of every supported architecture.

Each model is built from a config with random weights, saved with ``save_pretrained`` and
loaded back with ``from_pretrained`` exactly as ``poslens scan`` does. The reference is transformers'
eager attention with ``output_attentions=True`` (the papers' approach) and direct float64
computations from the post-RoPE q/k recorded by a test-only attention function.
"""

from __future__ import annotations

import archs
import pytest
import torch

from poslens.capture.model.adapters import get_adapter
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import CaptureSpec
from poslens.capture.engine.attention import register
from poslens.capture.model.load import load_model
from poslens.capture.engine.loop import attach
from poslens.metrics.rank import rank_measures
from poslens.metrics.slash import slash_profile, top_slash_heads

S, B = 12, 3
V = archs.V
WINDOW = archs.WINDOW  # the tiny models' sliding window, shorter than S


ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "smollm3", "gpt2"]


def tiny_config(arch: str):
    return archs.tiny_config(arch, layers=3, hidden=32, positions=64)


def save_tiny(arch: str, path, seed: int = 0):
    """3 layers, hidden 32 (every family: tests/test_architectures.py, configs in tests/archs.py)."""
    return archs.save_tiny(arch, path, seed, layers=3, hidden=32, positions=64)


# --- a test-only attention function recording post-RoPE q/k and the output -------------------
_RECORD: dict = {}


def _recording_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):

    out, w = _EAGER(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    _RECORD[module.layer_idx] = (query.detach().clone(), key.detach().clone(), out.detach().clone(), scaling)
    return out, w


def _eager_fn():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS["sdpa"]


_EAGER = None


def run_reference(path, ids):
    """Eager forward with output_attentions/hidden_states, and a recorded sdpa forward."""
    global _EAGER
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    eager = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        ref = eager(input_ids=ids, output_attentions=True, output_hidden_states=True, use_cache=False)
    _EAGER = _eager_fn()
    AttentionInterface.register("poslens_test_record", _recording_attention)
    AttentionMaskInterface.register("poslens_test_record", sdpa_mask)
    rec_model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="poslens_test_record").eval()
    _RECORD.clear()
    with torch.no_grad():
        rec_model(input_ids=ids, use_cache=False)
    return ref, dict(_RECORD)


def run_capture(path, ids, *, layers=None, heads=(), no_rope_layers=(), bidirectional=False, chunk_elems=200):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    ad = get_adapter(config)
    L = ad.num_layers(config)
    spec = CaptureSpec(num_layers=L, num_heads=ad.num_heads(config), num_kv_heads=ad.num_kv_heads(config),
                       head_dim=ad.head_dim(config), seq_len=ids.shape[1], layers=list(layers or range(L)),
                       rope_layers=ad.rope_layers(config), heads=list(heads), no_rope_layers=set(no_rope_layers),
                       bidirectional=bidirectional, chunk_elems=chunk_elems)
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    cap = Capture(spec)
    handles = attach(model, ad, cap)
    cap.begin_batch(ids.shape[0])
    with torch.no_grad(), cap.active():
        out = model(input_ids=ids, use_cache=False)
    cap.end_batch()
    for h in handles:
        h.remove()
    return out, cap, model, ad, config


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, V, (B, S), generator=g)


@pytest.fixture(scope="module", params=ARCHS)
def arch_run(request, tmp_path_factory, ids):
    arch = request.param
    path = save_tiny(arch, tmp_path_factory.mktemp(arch))
    ref, rec = run_reference(path, ids)
    out, cap, model, ad, config = run_capture(path, ids, heads=[(1, 0), (2, 3)])
    return arch, ref, rec, out, cap, model, ad, config


def _direct_scores(rec, layer):
    q, k, _, scaling = rec[layer]
    q, k = q.double(), k.double()
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    return (q @ k.transpose(-1, -2) * scaling)  # [B, H, S, S]


def test_logits_unchanged(arch_run):
    arch, ref, rec, out, *_ = arch_run
    assert torch.allclose(out.logits, ref.logits, atol=1e-5, rtol=0), (arch, (out.logits - ref.logits).abs().max())


def test_probs_equal_eager_output_attentions(arch_run):
    arch, ref, rec, out, cap, *_ = arch_run
    probs = cap.means()["probs"]
    for l, a in enumerate(ref.attentions):
        err = (probs[l] - a.double().mean(dim=(0, 1))).abs().max()
        assert err <= 1e-5, (arch, l, float(err))


def _visible(arch, layer):
    """The (query, key) pairs a query of layer ``layer`` sees: causal, inside the sliding window of the
    tiny Mistral (every layer) and Qwen2 (layers >= max_window_layers = 1)."""
    vis = torch.ones(S, S, dtype=torch.bool).tril()
    if arch == "mistral" or (arch == "qwen2" and layer >= 1):
        i = torch.arange(S)
        vis &= (i[:, None] - i[None, :]) < WINDOW
    return vis


def test_scores_match_direct_computation(arch_run):
    arch, ref, rec, out, cap, *_ = arch_run
    scores = cap.means()["scores"]
    for l in range(len(ref.attentions)):
        direct = _direct_scores(rec, l).mean(dim=(0, 1))
        low = _visible(arch, l)  # outside the causal triangle and the sliding window: unseen, stored as 0
        err = (scores[l][low] - direct[low]).abs().max() / direct.abs().max()
        assert err <= 1e-5, (arch, l, float(err))
        assert float(scores[l][~low].abs().max()) == 0.0  # causal: never computed above the diagonal


def test_slash_equals_slash_score_of_eager(arch_run):
    arch, ref, rec, out, cap, *_ = arch_run
    slash = cap.means()["slash"]
    for l, a in enumerate(ref.attentions):
        direct = slash_profile(a).mean(0)  # [H, S]
        assert torch.allclose(slash[l], direct, atol=1e-6, rtol=0), (arch, l)


def test_per_head_maps(arch_run):
    arch, ref, rec, out, cap, *_ = arch_run
    m = cap.means()
    for n, (l, h) in enumerate([(1, 0), (2, 3)]):
        assert torch.allclose(m["head_probs"][n], ref.attentions[l][:, h].double().mean(0), atol=1e-6, rtol=0)
        direct = _direct_scores(rec, l)[:, h].mean(0)
        tri = _visible(arch, l)  # entries outside the sliding window are masked, as above the diagonal
        assert torch.allclose(m["head_scores"][n][tri], direct[tri], atol=1e-5, rtol=1e-5)


def test_hidden_state_cosine_and_norms(arch_run):
    arch, ref, rec, out, cap, *_ = arch_run
    m = cap.means()
    hs = ref.hidden_states
    for idx in range(len(hs) - 1):  # the last entry of hidden_states is after the final norm
        h = hs[idx].double()
        hn = h / h.norm(dim=-1, keepdim=True)
        direct = (hn @ hn.transpose(1, 2)).mean(0)
        assert torch.allclose(m["cosine"][idx], direct, atol=1e-5, rtol=0), (arch, idx)
        assert torch.allclose(m["norms"][idx], h.norm(dim=-1).mean(0), rtol=1e-5, atol=0), (arch, idx)


def test_attention_output_cosine(arch_run):
    arch, ref, rec, out, cap, *_ = arch_run
    m = cap.means()
    for l in range(len(ref.attentions)):
        o = rec[l][2].double()  # [B, S, H, D]
        o = o.reshape(o.shape[0], o.shape[1], -1)
        on = o / o.norm(dim=-1, keepdim=True)
        assert torch.allclose(m["attn_cosine"][l], (on @ on.transpose(1, 2)).mean(0), atol=1e-5, rtol=0), (arch, l)
        assert torch.allclose(m["attn_norms"][l], o.norm(dim=-1).mean(0), rtol=1e-5, atol=0)


def test_dim_logit_sums_to_mean_causal_score(arch_run):
    arch, ref, rec, out, cap, *_ = arch_run
    m = cap.means()
    for l in range(len(ref.attentions)):
        tri = _visible(arch, l)
        direct = _direct_scores(rec, l)[..., tri].mean(dim=(0, 2))  # [H]
        assert torch.allclose(m["dim_logit"][l].sum(-1), direct, atol=1e-5, rtol=1e-5)


def test_pre_rope_queries_keys(arch_run):
    """q_gram/k_gram equal the second moments of the projections (after q/k norm where present)."""
    arch, ref, rec, out, cap, model, ad, config = arch_run
    m = cap.means()
    H, Hk, D = ad.num_heads(config), ad.num_kv_heads(config), ad.head_dim(config)
    layers = ad.decoder_layers(model)
    store = {}

    def grab(name):
        def hook(_m, _a, o):
            store[name] = o.detach().double()
        return hook

    handles = []
    for l, layer in enumerate(layers):
        attn = layer.attn if arch == "gpt2" else layer.self_attn
        if arch == "qwen3":
            handles += [attn.q_norm.register_forward_hook(grab(f"q{l}")), attn.k_norm.register_forward_hook(grab(f"k{l}"))]
        elif arch == "phi3":
            handles.append(attn.qkv_proj.register_forward_hook(grab(f"qkv{l}")))
        elif arch == "gpt2":
            handles.append(attn.c_attn.register_forward_hook(grab(f"qkv{l}")))
        else:
            handles += [attn.q_proj.register_forward_hook(grab(f"q{l}")), attn.k_proj.register_forward_hook(grab(f"k{l}"))]
    ids = torch.randint(3, V, (B, S), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)  # no capture active: plain SDPA path
    for h in handles:
        h.remove()
    for l in range(len(layers)):
        if f"qkv{l}" in store:
            qkv = store[f"qkv{l}"]
            q, k = qkv[..., : H * D], qkv[..., H * D: H * D + Hk * D]
        else:
            q, k = store[f"q{l}"], store[f"k{l}"]
        q = q.reshape(B, S, H, D)
        k = k.reshape(B, S, Hk, D)
        qg = torch.einsum("bshd,bshe->hde", q, q) / (B * S)
        kg = torch.einsum("bshd,bshe->hde", k, k) / (B * S)
        assert torch.allclose(m["q_gram"][l], qg, rtol=1e-4, atol=1e-4 * float(qg.abs().max())), (arch, l)
        assert torch.allclose(m["k_gram"][l], kg, rtol=1e-4, atol=1e-4 * float(kg.abs().max())), (arch, l)


def test_layer_subset_and_chunking_do_not_change_results(tmp_path, ids):
    path = save_tiny("llama", tmp_path / "m")
    _, full, *_ = run_capture(path, ids, chunk_elems=10**9)
    _, sub, *_ = run_capture(path, ids, layers=[2], chunk_elems=7)
    a, b = full.means(), sub.means()
    assert torch.allclose(a["probs"][2], b["probs"][0], atol=1e-12)
    assert torch.allclose(a["slash"][2], b["slash"][0], atol=1e-12)
    assert torch.allclose(a["cosine"][0], b["cosine"][0]) and torch.allclose(a["cosine"][3], b["cosine"][1])


def test_no_rope_control_equals_model_without_rotation(tmp_path, ids):
    """--no-rope-layers: attention with un-rotated q/k equals q_proj/k_proj states attended directly."""
    path = save_tiny("llama", tmp_path / "m")
    _, cap, model, ad, config = run_capture(path, ids, no_rope_layers=[0, 1, 2])
    # reference: the same model with RoPE made the identity
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        # all-zero positions: cos = 1, sin = 0; the explicit mask stops packed-sequence detection
        ref = eager(input_ids=ids, position_ids=torch.zeros_like(ids), attention_mask=torch.ones_like(ids),
                    output_attentions=True, use_cache=False)
    for l, a in enumerate(ref.attentions):
        assert torch.allclose(cap.means()["probs"][l], a.double().mean(dim=(0, 1)), atol=1e-5)


def test_no_rope_control_keeps_the_pre_rope_grams(tmp_path, ids):
    """Under --no-rope-layers attention sees un-rotated q/k, which are the pre-RoPE ones already: the
    qk statistic takes them as they are. Layer 0's input does not depend on the control, so its grams
    equal those of a scan without it (un-rotating them a second time would not)."""
    path = save_tiny("llama", tmp_path / "m")
    plain = run_capture(path, ids)[1].means()
    control = run_capture(path, ids, no_rope_layers=[0])[1].means()
    for name in ("q_gram", "k_gram"):
        torch.testing.assert_close(control[name][0], plain[name][0], rtol=1e-6, atol=1e-7)


def test_bidirectional_control(tmp_path, ids):
    path = save_tiny("llama", tmp_path / "m")
    out, cap, *_ = run_capture(path, ids, bidirectional=True)
    probs = cap.means()["probs"]
    assert float(probs[0].triu(1).sum()) > 0.1  # later keys are attended
    assert torch.allclose(probs.sum(-1), torch.ones_like(probs.sum(-1)), atol=1e-9)


def test_gpt2_scores_have_no_rope_and_smollm3_nope_layers(tmp_path):
    from transformers import AutoConfig

    p = save_tiny("smollm3", tmp_path / "s")
    ad = get_adapter(AutoConfig.from_pretrained(str(p)))
    assert ad.rope_layers(AutoConfig.from_pretrained(str(p))) == {0, 2}
    p = save_tiny("gpt2", tmp_path / "g")
    assert get_adapter(AutoConfig.from_pretrained(str(p))).rope_layers(AutoConfig.from_pretrained(str(p))) == set()


def test_accumulators_merge_equals_single_pass(tmp_path, ids):
    path = save_tiny("llama", tmp_path / "m")
    _, whole, *_ = run_capture(path, ids)
    _, a, *_ = run_capture(path, ids[:1])
    _, b, *_ = run_capture(path, ids[1:])
    a.accs.merge(b.accs)
    for k, v in whole.means().items():
        assert torch.allclose(a.accs[k].mean, v, atol=1e-6), k


def test_metrics_slash_and_rank_known_cases():
    # uniform causal attention: SlashScore(d) = mean_{i>=d} 1/(i+1)
    A = torch.tril(torch.ones(6, 6, dtype=torch.float64))
    A = A / A.sum(-1, keepdim=True)
    prof = slash_profile(A)
    assert abs(float(prof[0]) - sum(1 / (i + 1) for i in range(6)) / 6) < 1e-12
    sl = torch.zeros(2, 3, 6, dtype=torch.float64)
    sl[1, 2, 1] = 0.9
    top = top_slash_heads(sl, k=1, layer_ids=[4, 7])
    assert top == [{"layer": 7, "head": 2, "offset": 1, "score": 0.9,
                    "uniform": pytest.approx(sum(1 / i for i in range(2, 7)) / 5)}]
    u = torch.randn(8, dtype=torch.float64)
    g = torch.outer(u, u)
    r = rank_measures(g)
    assert abs(float(r["top1_energy"]) - 1) < 1e-9 and abs(float(r["effective_rank"]) - 1) < 1e-6 and int(r["n95"]) == 1
    r = rank_measures(torch.eye(4))
    assert abs(float(r["effective_rank"]) - 4) < 1e-9 and int(r["n95"]) == 4


def test_register_is_idempotent():
    from transformers import AttentionInterface

    register()
    register()
    assert "poslens" in AttentionInterface._global_mapping
