"""The fused CUDA map kernels against a float64 reference and against the chunked torch path.

Runs only where CUDA and Triton are present (the GPU machine; CI skips it). Inputs are fresh
random bf16/fp16/fp32 queries and keys in transformers' transposed layout, with GQA, causal and
bidirectional masks, lengths that are not multiples of the tile, every statistic combination.
"""

from __future__ import annotations

import math

import pytest
import torch

from poslens.capture import attention as att

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _reference(q, k, scaling, causal):
    q, k = q.double(), k.double()
    B, H, S, D = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) * scaling
    i = torch.arange(S, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    allowed = (j <= i) if causal else torch.ones(S, S, dtype=torch.bool, device=q.device)
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
    sm = s.masked_fill(~allowed, 0.0)
    slash = torch.stack([torch.diagonal(p, -d, 2, 3).sum(-1) for d in range(S)], -1).sum(0)
    return {"scores": sm.sum((0, 1)), "probs": p.sum((0, 1)), "slash": slash, "head_scores": sm.sum(0),
            "head_probs": p.sum(0)}


@pytest.mark.parametrize("B,H,Hk,S,D,causal,dtype", [
    (2, 8, 2, 300, 64, True, torch.bfloat16),
    (1, 4, 4, 130, 128, False, torch.float16),
    (3, 6, 3, 257, 32, True, torch.float32),
    (1, 2, 1, 64, 16, True, torch.bfloat16),
])
@pytest.mark.parametrize("block", [64, 128])
def test_fused_maps_match_float64(B, H, Hk, S, D, causal, dtype, block, monkeypatch):
    from poslens.capture import cuda_maps

    if not cuda_maps.supported(torch.empty(1, 1, 1, D, device="cuda", dtype=dtype), torch.empty(1, 1, 1, D)):
        pytest.skip("triton not importable")
    monkeypatch.setitem(cuda_maps.CONFIG, "block", block)
    g = torch.Generator(device="cuda").manual_seed(S + block)
    q = (torch.randn(B, S, H, D, generator=g, device="cuda") * 2).to(dtype).transpose(1, 2)
    k = (torch.randn(B, S, Hk, D, generator=g, device="cuda") * 2).to(dtype).transpose(1, 2)
    scaling = 1.1 / math.sqrt(D)
    ref = _reference(q, k, scaling, causal)
    heads = [0, H - 1]
    combos = [{"scores": True, "probs": True, "slash": True}]
    if (S, block) == (300, 64):  # every combination once (each is its own compiled kernel)
        combos += [{"scores": True, "probs": False, "slash": False}, {"scores": False, "probs": True, "slash": False},
                   {"scores": False, "probs": False, "slash": True}, {"scores": True, "probs": True, "slash": False}]
    for combo in combos:
        for hs in ((heads, []) if len(combos) > 1 else (heads,)):
            got = cuda_maps.attention_maps(q, k, scaling, causal=causal, heads=hs, **combo)
            names = [n for n, on in combo.items() if on] + (["head_scores", "head_probs"] if hs else [])
            assert set(got) == set(names)
            for n in names:
                r = ref[n][heads] if n.startswith("head_") else ref[n]
                err = float((got[n].double() - r).norm() / r.norm())
                assert err < 2e-6, (n, combo, err)


def rope_cos_sin(S, D, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = torch.arange(S, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)[None]
    return emb.cos(), emb.sin()


def test_capture_on_cuda_equals_capture_on_cpu():
    """The whole observe_attention and observe_hidden (fused maps, the whole-batch q/k Grams and
    reservoir, TF32 products of the bf16 values, the all-pairs APS count) against the CPU capture of the
    same bf16 values."""
    B, H, Hk, S, D = 2, 8, 2, 200, 64
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(B, S, H, D, generator=g) * 2).to(torch.bfloat16).transpose(1, 2)
    k = (torch.randn(B, S, Hk, D, generator=g) * 2).to(torch.bfloat16).transpose(1, 2)
    out = torch.randn(B, S, H, D, generator=g).to(torch.bfloat16).transpose(1, 2)
    hid = torch.randn(B, S, 256, generator=g).to(torch.bfloat16)
    res = {}
    for dev in ("cpu", "cuda"):
        spec = att.CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=[0],
                               heads=[(0, 3)], reservoir=16, rope_layers={0})
        cap = att.Capture(spec, device=dev)
        cos, sin = rope_cos_sin(S, D)
        cap.rope_cos_sin = (cos.to(dev), sin.to(dev))
        cap.begin_batch(B)
        cap.observe_attention(0, q.to(dev).float() if dev == "cpu" else q.to(dev), k.to(dev).float() if dev == "cpu"
                              else k.to(dev), out.to(dev), 0.125)
        cap.observe_hidden(0, hid.to(dev))
        cap.end_batch()
        res[dev] = {n: v.cpu() for n, v in cap.means().items()}
    for n, v in res["cpu"].items():
        torch.testing.assert_close(res["cuda"][n], v, rtol=1e-4, atol=2e-5, msg=n)


def _bf16_inputs(B, H, Hk, S, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(B, S, H, D, generator=g, device="cuda") * 2).to(torch.bfloat16).transpose(1, 2)
    k = (torch.randn(B, S, Hk, D, generator=g, device="cuda") * 2).to(torch.bfloat16).transpose(1, 2)
    v = torch.randn(B, S, Hk, D, generator=g, device="cuda").to(torch.bfloat16).transpose(1, 2)
    return q, k, v


@pytest.mark.parametrize("map_size", [0, 16])
def test_fused_capture_equals_the_torch_path_on_cuda(map_size, monkeypatch):
    """Every statistic through the fused kernels, with and without --map-size block maps (f = 13 does not
    divide S = 200), against the chunked torch path on the same CUDA inputs and output."""
    B, H, Hk, S, D = 2, 8, 2, 200, 64
    q, k, v = _bf16_inputs(B, H, Hk, S, D, 5)
    scaling = 0.125
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
    hid = torch.randn(B, S, 256, device="cuda").to(torch.bfloat16)
    res = {}
    for mode in ("torch", "auto"):
        monkeypatch.setenv("POSLENS_CAPTURE_KERNEL", mode)
        spec = att.CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=Hk, head_dim=D, seq_len=S, layers=[0],
                               heads=[(0, 3)], map_size=map_size)
        cap = att.Capture(spec, device="cuda")
        cap.begin_batch(B)
        cap.observe_attention(0, q, k, out, scaling)
        cap.observe_hidden(0, hid)
        cap.end_batch()
        res[mode] = {n: t.cpu() for n, t in cap.means().items()}
    M = -(-S // -(-S // map_size)) if map_size else S
    assert res["auto"]["scores"].shape == (1, M, M)
    assert ("probs_key0" in res["auto"]) == bool(map_size)
    for n, t in res["torch"].items():
        torch.testing.assert_close(res["auto"][n], t, rtol=1e-4, atol=2e-5, msg=n)
