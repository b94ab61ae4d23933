"""The fingerprint of SmolLM2 (GGUF) against an independent eager computation on the same tokens.

transformers' own eager attention with ``output_attentions`` gives every head's weights, and hooks on
``q_proj``/``k_proj`` give the pre-RoPE queries and keys (Llama has no q/k norm); the traits are then
recomputed here with plain loops over layers, heads and pairs: the sink per head (to 1e-4), the
SlashScore of every listed slash head on text and on random tokens (to 1e-4), the RoPE frequency
shares per head, pair and band (to 1e-3) and the massive dimensions (RMS to 1e-3 relative; the
mask wherever the RMS is not within 1 % of the threshold). No poslens metric code is involved.

Select with ``-m real_model``; skipped with a reason when the model is absent.
"""

from __future__ import annotations

import math

import pytest
import torch

from real_models import real_model_file

pytestmark = pytest.mark.real_model

SEQ_LEN, NUM_SEQS = 64, 4


def _eager(model_dir, ids: torch.Tensor):
    """Per layer: attention weights ``[N, H, S, S]``, pre-RoPE q ``[N, S, H, D]`` and k ``[N, S, Hk, D]``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    qs = {l: [] for l in range(cfg.num_hidden_layers)}
    ks = {l: [] for l in range(cfg.num_hidden_layers)}
    hooks = []
    for l, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.q_proj.register_forward_hook(
            lambda m, i, o, l=l: qs[l].append(o.detach().double().reshape(o.shape[0], o.shape[1], -1, D))))
        hooks.append(layer.self_attn.k_proj.register_forward_hook(
            lambda m, i, o, l=l: ks[l].append(o.detach().double().reshape(o.shape[0], o.shape[1], -1, D))))
    att = []
    with torch.no_grad():
        for b in range(ids.shape[0]):
            out = model(input_ids=ids[b:b + 1], output_attentions=True, use_cache=False)
            att.append(torch.stack([a[0].double() for a in out.attentions]))  # [L, H, S, S]
    for h in hooks:
        h.remove()
    theta = float(getattr(cfg, "rope_theta", None) or (cfg.rope_parameters or {}).get("rope_theta"))
    del model
    return (torch.stack(att, 1), {l: torch.cat(v) for l, v in qs.items()}, {l: torch.cat(v) for l, v in ks.items()},
            theta, cfg.vocab_size)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from poslens.analysis.fingerprint import load_fingerprint, run_fingerprint, FingerprintConfig
    from poslens.capture.model.load import load_tokenizer
    from poslens.capture.model.source import model_directory
    from poslens.data.sources import make_source

    f = real_model_file("smollm2")
    out = tmp_path_factory.mktemp("fp") / "fingerprint"
    run_fingerprint(FingerprintConfig(models=[str(f)], out=str(out), seq_len=SEQ_LEN, num_seqs=NUM_SEQS,
                                      batch_size=2, figures=False), progress=False)
    result = load_fingerprint(out)
    text = make_source("stdlib", seq_len=SEQ_LEN, num_seqs=NUM_SEQS, seed=0, tokenizer=load_tokenizer(str(f)),
                       vocab_size=None).batch(0, NUM_SEQS)
    att, q, k, theta, vocab = _eager(model_directory(f), text)
    rnd = make_source("random", seq_len=SEQ_LEN, num_seqs=NUM_SEQS, seed=0, vocab_size=vocab).batch(0, NUM_SEQS)
    att_r, _, _, _, _ = _eager(model_directory(f), rnd)
    return result, att, att_r, q, k, theta


def test_sink_per_head_equals_eager(smollm2):
    result, att, att_r, *_ = smollm2
    m = result.models[0]
    L, N, H, S, _ = att.shape
    worst = 0.0
    for l in range(L):
        for h in range(H):
            for a, key in ((att, "sink_heads"), (att_r, "sink_heads_random")):
                ref = sum(a[l, n, h, i, 0].item() for n in range(N) for i in range(1, S)) / (N * (S - 1))
                worst = max(worst, abs(m["layers"][l][key][h] - ref))
            share = sum(m["layers"][l]["sink_heads"][h] > 0.3 for h in range(H)) / H
            assert m["layers"][l]["sink_share"] == pytest.approx(share, abs=1e-12)
    assert worst <= 1e-4, worst
    assert torch.allclose(result.tensors[m["name"]]["sink"].double(),
                          torch.tensor([r["sink_heads"] for r in m["layers"]], dtype=torch.float64), atol=1e-6)


def test_slash_heads_equal_eager(smollm2):
    result, att, att_r, *_ = smollm2
    m = result.models[0]
    N, S = att.shape[1], att.shape[-1]
    assert m["slash_heads"], "SmolLM2 has previous-token heads (tests/models/test_real_models.py)"
    for s in m["slash_heads"]:
        l, h, d = s["layer"], s["head"], s["delta"]
        assert 1 <= d <= 16
        for a, key in ((att, "score"), (att_r, "score_random")):
            ref = sum(a[l, n, h, i, i - d].item() for n in range(N) for i in range(d, S)) / (N * (S - d))
            assert s[key] == pytest.approx(ref, abs=1e-4), (l, h, d, key)
        assert s["score"] >= 0.3 and s["persists"] == (s["score_random"] >= 0.3)


def _bands(r: int, theta: float, S: int) -> list[str]:
    out = []
    for l in range(r // 2):
        lam = 2 * math.pi / theta ** (-2 * l / r)
        out.append("low" if lam >= S else ("high" if lam < math.sqrt(2 * math.pi * S) else "medium"))
    return out


def test_frequency_shares_equal_eager(smollm2):
    result, att, _, q, k, theta = smollm2
    m = result.models[0]
    pairs = result.tensors[m["name"]]["freq_pairs"].double()  # [L, H, r/2]
    L, H, P = pairs.shape
    D = 2 * P
    Hk = k[0].shape[2]
    labels = _bands(D, theta, SEQ_LEN)
    worst_pair = worst_band = 0.0
    for l in range(L):
        qt, kt = q[l].reshape(-1, H, D), k[l].reshape(-1, Hk, D)
        for h in range(H):
            g = h // (H // Hk)
            u = []
            for p in range(P):
                eq = (qt[:, h, p] ** 2 + qt[:, h, p + P] ** 2).mean().item()
                ek = (kt[:, g, p] ** 2 + kt[:, g, p + P] ** 2).mean().item()
                u.append(math.sqrt(eq * ek))
            tot = sum(u)
            for p in range(P):
                worst_pair = max(worst_pair, abs(pairs[l, h, p].item() - u[p] / tot))
            for band in ("high", "medium", "low"):
                ref = sum(u[p] for p in range(P) if labels[p] == band) / tot
                worst_band = max(worst_band, abs(m["layers"][l]["freq_heads"][band][h] - ref))
    assert worst_pair <= 1e-3 and worst_band <= 1e-3, (worst_pair, worst_band)


def test_massive_dims_equal_eager(smollm2):
    result, _, _, q, k, _ = smollm2
    m = result.models[0]
    t = result.tensors[m["name"]]
    for name, xs in (("massive_q", q), ("massive_k", k)):
        mask = t[name].bool()
        for l in range(mask.shape[0]):
            x = xs[l].reshape(-1, xs[l].shape[2], xs[l].shape[3])  # [tokens, heads, D]
            rms = x.pow(2).mean(0).sqrt()  # [heads, D]
            thr = 5.0 * rms.mean().item()
            clear = (rms - thr).abs() > 0.01 * thr
            assert torch.equal(mask[l][clear], (rms > thr)[clear]), (name, l)
            assert m["layers"][l][name] == int(mask[l].sum())
    listed = m["massive"]["q"][0]  # the strongest: its ratio to the layer's mean RMS
    x = q[listed["layer"]].reshape(-1, q[0].shape[2], q[0].shape[3])
    rms = x.pow(2).mean(0).sqrt()
    assert listed["ratio"] == pytest.approx((rms[listed["head"], listed["dim"]] / rms.mean()).item(), rel=1e-3)


def test_scan_numbers_passed_through(smollm2):
    """relativity, trend and APS are the text scan's own summary numbers (same code, same data: equal)."""
    from poslens.rundir.io import read_json

    result = smollm2[0]
    m = result.models[0]
    scan = read_json(result.path / m["scans"]["text"] / "summary.json")
    for r, s in zip(m["layers"], scan["layers"]):
        assert r["layer"] == s["layer"]
        for key in ("relativity_index", "diagonal_trend", "aps_mean", "aps_std"):
            assert r[key] == s.get(key), key
        assert r["rope"] is True and r["type"] == "rope"
    assert m["layer_types"] == {}  # one kind of layer: no per-type block
