"""Every supported decoder family, on a tiny random config, against transformers' eager attention.

Per family: (a) the captured ``probs`` equal eager ``output_attentions`` averaged over batch and
heads; (b) the model's logits with the poslens attention equal eager's; (c) the pre-RoPE q/k the
capture recovers, rotated again with the model's own ``apply_rotary_pos_emb`` and the cos/sin its
rotary module produced, give back the post-RoPE q/k the attention function received. Sliding
windows (shorter than the sequence) and Gemma 2's logit soft-capping are part of (a) and (b).
"""

from __future__ import annotations

import sys

import pytest
import torch
from archs import ARCHS, V, WINDOW, save_tiny

from poslens.capture.model.adapters import ADAPTERS, check_dispatch, get_adapter, hook_point, rope_tables
from poslens.capture.engine.attention import _QK_HOOKS, ATTN_NAME, poslens_attention, register
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import CaptureSpec
from poslens.capture.model.load import load_model
from poslens.capture.engine.loop import attach
from poslens.errors import PoslensError

S, B = 24, 2


def test_every_listed_family_has_an_adapter():
    assert set(ARCHS) == set(ADAPTERS)


# --- a test-only attention function: poslens' own, plus a record of q/k before and after RoPE ----
_REC: dict = {}


def _recording(module, query, key, value, attention_mask, **kwargs):
    from poslens.capture.engine import attention as A

    out = poslens_attention(module, query, key, value, attention_mask, **kwargs)
    cap, l = A.active_capture(module), module.layer_idx
    if cap is not None and l in cap.spec.rope_layers:
        cap.use_layer_rope(l)
        qp, kp = cap.unrotate(query.float(), key.float())
        _REC[l] = dict(q=query.detach().clone(), k=key.detach().clone(), q_pre=qp, k_pre=kp,
                       cos_sin=cap.rope_by_layer[l])
    return out


def _run(arch, path, ids):
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface

    from poslens.capture.engine.attention import _padding_only_mask

    eager = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        ref = eager(input_ids=ids, output_attentions=True, use_cache=False)
    config = AutoConfig.from_pretrained(str(path))
    ad = get_adapter(config)
    L = ad.num_layers(config)
    spec = CaptureSpec(num_layers=L, num_heads=ad.num_heads(config), num_kv_heads=ad.num_kv_heads(config),
                       head_dim=ad.head_dim(config), seq_len=S, layers=list(range(L)),
                       rope_layers=ad.rope_layers(config), chunk_elems=300, rope_layout=ad.rope_layout)
    register()
    AttentionInterface.register("poslens_test_rec", _recording)
    AttentionMaskInterface.register("poslens_test_rec", _padding_only_mask)
    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="poslens_test_rec").eval()
    cap = Capture(spec)
    handles = attach(model, ad, cap)
    _REC.clear()
    cap.begin_batch(B)
    with torch.no_grad(), cap.active():
        out = model(input_ids=ids, use_cache=False)
    cap.end_batch()
    for h in handles:
        h.remove()
    return ref, out, cap, dict(_REC), model, ad, config


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, V, (B, S), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module", params=ARCHS)
def run(request, tmp_path_factory, ids):
    torch.set_num_threads(1)
    arch = request.param
    path = save_tiny(arch, tmp_path_factory.mktemp(arch))
    return (arch, path, *_run(arch, path, ids))


def test_probs_equal_eager_output_attentions(run):
    arch, path, ref, out, cap, *_ = run
    probs = cap.means()["probs"]
    for l, a in enumerate(ref.attentions):
        err = float((probs[l] - a.double().mean(dim=(0, 1))).abs().max())
        assert err <= 1e-5, (arch, l, err)


def test_logits_equal_eager(run):
    arch, path, ref, out, *_ = run
    err = float((out.logits - ref.logits).abs().max())
    assert err <= 1e-4 * max(1.0, float(ref.logits.abs().max())), (arch, err)


def test_pre_rope_round_trip_through_the_models_rotary(run):
    arch, path, ref, out, cap, rec, model, ad, config = run
    if not ad.rope_layers(config):
        assert not rec and arch == "gpt2"
        return
    apply = sys.modules[type(model).__module__].apply_rotary_pos_emb  # the model's own rotation
    assert set(rec) == ad.rope_layers(config)
    for l, r in rec.items():
        cos, sin = r["cos_sin"]
        n = cos.shape[-1]
        qp, kp = r["q_pre"], r["k_pre"]
        q2, k2 = apply(qp[..., :n], kp[..., :n], cos, sin)  # partial rotary: the suffix passes through
        q2 = torch.cat([q2, qp[..., n:]], dim=-1)
        k2 = torch.cat([k2, kp[..., n:]], dim=-1)
        tol = 1e-5 * float(r["q"].abs().max())
        assert torch.allclose(q2, r["q"], atol=tol, rtol=0), (arch, l)
        assert torch.allclose(k2, r["k"], atol=1e-5 * float(r["k"].abs().max()), rtol=0), (arch, l)
        # the un-rotation is not the identity (position 0 aside, RoPE moved the vectors)
        assert not torch.allclose(qp[:, :, 1:, :n], r["q"][:, :, 1:, :n], atol=1e-3), (arch, l)


def test_sliding_window_and_softcap_reach_every_statistic(run):
    """Keys outside a layer's window get no probability, no score and no dim_logit share."""
    arch, path, ref, out, cap, rec, model, ad, config = run
    m = cap.means()
    i = torch.arange(S)
    far = (i[:, None] - i[None, :]) >= WINDOW
    windows = [cap.windows.get(l) for l in range(ad.num_layers(config))]
    if arch in ("mistral", "mixtral", "starcoder2"):
        assert windows == [WINDOW, WINDOW]
    if arch in ("qwen2_moe", "gemma2", "gemma3_text"):  # layer 0 sliding, layer 1 global
        assert windows == [WINDOW, None]
    if arch == "qwen2":  # sliding from max_window_layers = 1 on
        assert windows == [None, WINDOW]
    for l, w in enumerate(windows):
        if w is None:
            continue
        assert float(m["probs"][l][far].abs().max()) == 0.0
        assert float(m["scores"][l][far].abs().max()) == 0.0
        assert float(m["scores"][l][(~far) & (i[:, None] >= i[None, :])].abs().min()) > 0.0
    if arch == "gemma2":  # captured logits are soft-capped: |score| <= cap, and some reach near it
        assert float(m["scores"].abs().max()) <= 3.0 + 1e-6


def test_dim_logit_sums_to_mean_visible_score(run):
    """dim_logit summed over dimensions = mean logit (raw, before any soft-cap) over visible pairs."""
    arch, path, ref, out, cap, rec, model, ad, config = run
    if arch in ("gemma2",) or not rec:
        return  # soft-capped logits are not a sum over dimensions; gpt2 records nothing
    m = cap.means()
    i = torch.arange(S)
    for l, r in rec.items():
        att = model.model.layers[l].self_attn if hasattr(model, "model") else None
        scaling = getattr(att, "scaling", None) if att is not None else None
        if scaling is None:
            continue
        q, k = r["q"].double(), r["k"].double()
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        logit = q @ k.transpose(-1, -2) * scaling
        vis = i[:, None] >= i[None, :]
        w = cap.windows.get(l)
        if w is not None:
            vis &= (i[:, None] - i[None, :]) < w
        direct = logit[..., vis].mean(dim=(0, 2))
        assert torch.allclose(m["dim_logit"][l].sum(-1), direct, atol=1e-5, rtol=1e-5), (arch, l)


def test_rope_tables_are_the_models_own(run):
    arch, path, ref, out, cap, rec, model, ad, config = run
    rope = rope_tables(model, ad, config)
    if arch == "gpt2":
        assert rope is None
        return
    for l, kind in enumerate(rope["layer_kind"]):
        if l not in ad.rope_layers(config):
            assert kind is None
            continue
        t = rope["kinds"][kind]
        cos = cap.rope_by_layer[l][0][0]  # [S, r] of the first sequence
        r = t["rotary_dim"]
        assert cos.shape[-1] == r
        f = torch.tensor(t["inv_freq"], dtype=torch.float64)
        ang = torch.arange(S, dtype=torch.float64)[:, None] * f
        want = torch.cat([ang, ang], -1) if ad.rope_layout == "half" else ang.repeat_interleave(2, -1)
        assert torch.allclose(cos.double(), want.cos() * t["attention_scaling"], atol=1e-5), (arch, l)
    if arch == "gemma3_text":  # two tables: local base 1e4, global base 1e6 / 8 (linear scaling)
        loc, glob = rope["kinds"]["sliding_attention"], rope["kinds"]["full_attention"]
        assert abs(loc["inv_freq"][1] / 1e4 ** (-2 / 16) - 1) < 1e-6
        assert abs(glob["inv_freq"][1] / (1e6 ** (-2 / 16) / 8) - 1) < 1e-6


def test_capture_points(run):
    """resid_pre(0) = embeddings, resid_post(l) = hidden_states[l + 1], attn_z feeds attn_out."""
    arch, path, ref, out, cap, rec, model, ad, config = run
    got = {}
    hs = []
    for l in range(ad.num_layers(config)):
        for p in ("resid_pre", "attn_z", "attn_out", "resid_post", "mlp_in", "mlp_out"):
            hs.append(hook_point(model, ad, p, l, lambda x, k=(p, l): got.__setitem__(k, x.detach().clone())))
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        o = model(input_ids=ids, use_cache=False, output_hidden_states=True)
    for h in hs:
        h.remove()
    L = ad.num_layers(config)
    assert torch.allclose(got[("resid_pre", 0)], o.hidden_states[0])
    for l in range(L - 1):  # the last entry of hidden_states is after the final norm
        assert torch.allclose(got[("resid_post", l)], o.hidden_states[l + 1], atol=1e-6)
    proj = ad._get(ad.attention_module(model, 0), ad.out_proj_path)
    assert torch.allclose(proj(got[("attn_z", 0)]), got[("attn_out", 0)], atol=1e-6)
    assert got[("attn_z", 0)].shape[-1] == ad.num_heads(config) * ad.head_dim(config)


def test_generic_adapter_and_custom_attention_error(tmp_path, ids):
    """An unlisted model type that dispatches through AttentionInterface works with a warning; one whose
    attention never calls the registered function is refused by the dry run."""
    import transformers as tf

    path = save_tiny("llama", tmp_path / "m")
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    model.config.model_type = "my_llama"
    with pytest.warns(UserWarning, match="generic"):  # PoslensWarning, shown as one line
        ad = get_adapter(model.config)
    assert ad.generic and check_dispatch(model, ad) == {"windows": [None, None], "scaling": [0.25, 0.25]}
    cap_layers = ad.decoder_layers(model)
    assert len(cap_layers) == 2 and ad.rotary_module(model) is not None

    class Custom(torch.nn.Module):  # custom attention: computes its own output, never dispatches
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, hidden_states, **kw):
            return self.inner.o_proj(hidden_states * 0 + hidden_states), None

    for layer in model.model.layers:
        layer.self_attn = Custom(layer.self_attn)
    with pytest.raises(PoslensError, match="my_llama.*bypasses transformers' AttentionInterface"):
        check_dispatch(model, ad)
    eager = tf.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager")
    with pytest.raises(PoslensError, match="not the registered function"):
        check_dispatch(eager, get_adapter(eager.config))
    assert ATTN_NAME == "poslens"


def test_llama3_scaled_rope_bands_use_the_models_frequencies(tmp_path):
    """A llama3-scaled RoPE: the scan records the scaled inv_freq of the model's rotary module, and the
    RoPE bands come from it (they differ from the unscaled base^(-2l/r) recomputation)."""
    import json

    from transformers import AutoModelForCausalLM, LlamaConfig

    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.metrics.rank import band_contributions
    from poslens.rope import frequency_bands, inv_freq
    from poslens.rundir.io import read_tensors

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64})
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(tmp_path / "m"))
    run_scan(ScanConfig(model_dir=str(tmp_path / "m"), out=str(tmp_path / "r"), data="random", seq_len=24, num_seqs=2,
                        batch_size=2, figures=False, reservoir=0), progress=False)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    table = summary["rope"]["kinds"]["default"]
    scaled = torch.tensor(table["inv_freq"], dtype=torch.float64)
    assert table["rope_type"] == "llama3" and table["rotary_dim"] == 16
    assert torch.allclose(scaled, model.model.rotary_emb.inv_freq.double(), rtol=1e-6)
    plain = inv_freq(16, 10000.0)
    assert scaled[0] == pytest.approx(float(plain[0]), rel=1e-6)  # the highest frequency is kept
    assert float(scaled[-1]) == pytest.approx(float(plain[-1]) / 8, rel=1e-6)  # low frequencies divided by 8
    labels, labels_plain = frequency_bands(16, None, 24, theta=scaled), frequency_bands(16, 10000.0, 24)
    assert labels != labels_plain  # pair 1: wavelength 19.9 unscaled (medium), ~26 scaled (low at 24 tokens)
    dl = read_tensors(tmp_path / "r" / "maps.safetensors")["dim_logit"]
    for l, row in enumerate(summary["layers"]):
        want = band_contributions(dl[l], 16, 10000.0, 24, inv_freq=table["inv_freq"])
        wrong = band_contributions(dl[l], 16, 10000.0, 24)
        for b in ("high", "medium", "low"):
            assert row["band_logit"][b] == pytest.approx(want[b].tolist(), abs=1e-6)
        assert any(abs(x - y) > 1e-6 for b in ("medium", "low")
                   for x, y in zip(row["band_logit"][b], wrong[b].tolist()))
    assert summary["attention"]["windows"] == [None, None]


def test_gemma3_scan_records_two_tables_and_windows(tmp_path):
    """End to end on Gemma 3: per-layer-type RoPE tables and windows in summary.json, whole-map metrics
    without the unseen entries, bands of each layer from its own table."""
    import json

    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.metrics.diagonal import causal_view, window_view
    from poslens.metrics import relativity_index
    from poslens.metrics.rank import band_contributions
    from poslens.rundir.io import read_tensors

    path = save_tiny("gemma3_text", tmp_path / "m")
    run_scan(ScanConfig(model_dir=str(path), out=str(tmp_path / "r"), data="random", seq_len=S, num_seqs=2,
                        batch_size=2, figures=False, reservoir=0), progress=False)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    maps = read_tensors(tmp_path / "r" / "maps.safetensors")
    assert summary["attention"]["windows"] == [WINDOW, None]
    assert summary["rope"]["layer_kind"] == ["sliding_attention", "full_attention"]
    assert [r["sliding_window"] for r in summary["layers"]] == [WINDOW, None]
    sc = window_view(causal_view(maps["scores"][0].double()), WINDOW)
    # the noise grid is the whole map: the headline index is noise-corrected, the plain one kept beside it
    assert summary["layers"][0]["relativity_index_noise_corrected"] is True
    plain = summary["layers"][0]["relativity_index_uncorrected"]
    assert plain == pytest.approx(relativity_index(sc, exclude_keys=(0,)))
    assert summary["layers"][0]["relativity_index_with_sink"] == pytest.approx(relativity_index(sc))
    assert plain != pytest.approx(relativity_index(causal_view(maps["scores"][0].double())))
    for l, kind in enumerate(["sliding_attention", "full_attention"]):
        want = band_contributions(maps["dim_logit"][l], None, None, S, inv_freq=summary["rope"]["kinds"][kind]["inv_freq"])
        for b, v in want.items():
            assert summary["layers"][l]["band_logit"][b] == pytest.approx(v.tolist(), abs=1e-6)


def test_rope_decomposition_uses_the_recorded_frequencies():
    from poslens.metrics.ropefit import rope_decomposition
    from poslens.rope import inv_freq

    g = torch.Generator().manual_seed(0)
    D = 16
    x = torch.randn(D, 3, generator=g, dtype=torch.float64)
    gram = x @ x.T
    dl = torch.randn(D, generator=g, dtype=torch.float64)
    kw = dict(rotary_dim=D, base=10000.0, scaling=0.25, seq_len=S)
    same = rope_decomposition(gram, gram, dl, **kw)
    own = rope_decomposition(gram, gram, dl, **kw, theta=inv_freq(D, 10000.0).tolist())
    assert torch.allclose(same.logit, own.logit)  # recorded = recomputed when nothing is scaled
    scaled = inv_freq(D, 10000.0) / 8
    dec = rope_decomposition(gram, gram, dl, **kw, theta=scaled.tolist(), attention_scaling=1.2)
    assert torch.allclose(dec.theta, scaled) and not torch.allclose(dec.logit, same.logit)
    assert float(dec.A.sum()) == pytest.approx(1.44 * float(same.A.sum()))  # amplitudes carry scaling^2


def test_scan_of_unlisted_architectures(cli, tmp_path):
    """OPT (not on the list, dispatches through AttentionInterface, no RoPE): scanned by the generic adapter,
    probs equal eager. BLOOM (custom ALiBi attention code): a one-line error, non-zero exit, nothing written."""
    import transformers as tf

    from poslens.data.sources import make_source
    from poslens.rundir.io import read_tensors

    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(tf.OPTConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
        max_position_embeddings=64, word_embed_proj_dim=32)).save_pretrained(str(tmp_path / "opt"))
    tf.AutoModelForCausalLM.from_config(tf.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4)
                                        ).save_pretrained(str(tmp_path / "bloom"))
    with pytest.warns(UserWarning, match="'opt' has no adapter"):
        code, _, err = cli("scan", tmp_path / "opt", "--out", tmp_path / "r_opt", "--data", "random", "--seq-len", 10,
                           "--num-seqs", 2, "--no-figures", "--quiet", "--seed", 5)
    assert code == 0, err
    probs = read_tensors(tmp_path / "r_opt" / "maps.safetensors")["probs"]
    ids = make_source("random", seq_len=10, num_seqs=2, seed=5, vocab_size=V).batch(0, 2)
    eager = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "opt"), attn_implementation="eager").eval()
    with torch.no_grad():
        att = eager(input_ids=ids, output_attentions=True).attentions
    for l, a in enumerate(att):
        assert torch.allclose(probs[l].double(), a.double().mean((0, 1)), atol=1e-5)
    with pytest.warns(UserWarning):
        code, _, err = cli("scan", tmp_path / "bloom", "--out", tmp_path / "r_bloom", "--data", "random", "--seq-len",
                           8, "--num-seqs", 2, "--quiet")
    assert code == 2 and "'bloom' uses custom attention code" in err and "\n" not in err
    assert not (tmp_path / "r_bloom").exists()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "cohere", "phi3", "smollm3", "gpt2"])
def test_qk_capture_points_equal_the_projections(arch, tmp_path):
    """q_pre/k_pre equal the model's own q/k projections (after q_norm/k_norm; fused qkv split), in every
    layout; q_post/k_post are what the attention function receives; handles detach."""
    path = save_tiny(arch, tmp_path / "m")
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    ad = get_adapter(model.config)
    H, Hk, D = ad.num_heads(model.config), ad.num_kv_heads(model.config), ad.head_dim(model.config)
    got, proj = {}, {}
    hs = [hook_point(model, ad, p, l, lambda x, k=(p, l): got.__setitem__(k, x.detach().clone()))
          for l in range(2) for p in ("q_pre", "k_pre", "q_post")]

    def grab(name):
        return lambda _m, _a, o: proj.__setitem__(name, o.detach())
    for l in range(2):
        attn = ad.attention_module(model, l)
        if arch == "qwen3":
            hs += [attn.q_norm.register_forward_hook(grab(("q", l))), attn.k_norm.register_forward_hook(grab(("k", l)))]
        elif arch in ("phi3", "gpt2"):
            hs.append((attn.qkv_proj if arch == "phi3" else attn.c_attn).register_forward_hook(grab(("qkv", l))))
        else:
            hs += [attn.q_proj.register_forward_hook(grab(("q", l))), attn.k_proj.register_forward_hook(grab(("k", l)))]
    ids = torch.randint(3, V, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for h in hs:
        h.remove()
    B, T = ids.shape
    for l in range(2):
        if ("qkv", l) in proj:
            qkv = proj[("qkv", l)]
            q, k = qkv[..., : H * D], qkv[..., H * D: H * D + Hk * D]
        else:
            q, k = proj[("q", l)], proj[("k", l)]
        q = q.reshape(B, T, H, D).transpose(1, 2)
        k = k.reshape(B, T, Hk, D).transpose(1, 2)
        assert torch.allclose(got[("q_pre", l)], q, atol=1e-5 * float(q.abs().max())), (arch, l)
        assert torch.allclose(got[("k_pre", l)], k, atol=1e-5 * float(k.abs().max())), (arch, l)
        moved = not torch.allclose(got[("q_post", l)], q, atol=1e-4)
        assert moved == (l in ad.rope_layers(model.config)), (arch, l)  # RoPE moved them, NoPE layers not
    assert not any(ad.attention_module(model, l) in _QK_HOOKS for l in range(2))  # the handles took them out
    assert not any(k.startswith("_poslens") for m in model.modules() for k in m.__dict__)
