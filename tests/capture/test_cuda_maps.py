"""The fused map kernels (:mod:`poslens.capture.backends.cuda_maps`) against a float64 reference, and the fused
capture against the chunked torch path.

The kernels' logic runs on every machine where Triton is installed: under Triton's interpreter
(``TRITON_INTERPRET=1``) they take CPU tensors. The interpreter must be asked for before the kernels
are built, and this process's kernels must stay compiled for the CUDA tests, so the interpreted runs
happen in a child process (this file run as a script), once per session; the comparisons happen
here. The interpreter runs every tile in numpy, so its cases are small (one or two tiles a side)
while still covering GQA, causal and bidirectional masks, head dims 16 and 32, lengths that are not
multiples of the tile, float32/bf16/fp16 inputs and every statistic combination, and a layer's capture
through the Triton backend against its torch path.

The interpreter never compiles, so Triton also compiles both kernels for an sm_90 GPU ahead of time
(no GPU needed). With CUDA the compiled kernels run larger cases (the GPU machine; a CPU-only suite
skips them). Inputs are random queries and keys in transformers' transposed layout.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

#: relative Frobenius error allowed against float64: float32 sums of a few hundred terms. ``sink_heads``
#: is read from a float32 base-2 log-sum-exp, whose rounding grows with the logits' magnitude.
TOL = {"sink_heads": 5e-6}
TOL_DEFAULT = 2e-6

ALL = {"scores": True, "probs": True, "slash": True}
#: every combination of the kernels' outputs (each one its own specialisation of the kernels)
COMBOS = [ALL, {"scores": True, "probs": False, "slash": False}, {"scores": False, "probs": True, "slash": False},
          {"scores": False, "probs": False, "slash": True}, {"scores": True, "probs": True, "slash": False}]


def reference_maps(q, k, scaling, causal):
    """Float64 batch/head sums: scores (0 where masked), probs, slash ``[H, S]``, per-head maps,
    sink_heads ``[H, S]`` (``sum_b A_bh[i, 0]``)."""
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
            "head_probs": p.sum(0), "sink_heads": p[..., 0].sum(0)}


def expected_names(combo: dict, heads: list[int]) -> set[str]:
    """The keys :func:`~poslens.capture.backends.cuda_maps.attention_maps` returns for these switches."""
    names = {n for n, on in combo.items() if on}
    if heads:
        names |= {"head_scores", "head_probs"}
    if combo["probs"] or combo["slash"]:
        names.add("sink_heads")
    return names


def check_maps(got: dict, ref: dict, combo: dict, heads: list[int], label) -> None:
    assert set(got) == expected_names(combo, heads), (label, sorted(got))
    for n, x in got.items():
        r = ref[n][heads] if n.startswith("head_") else ref[n]
        assert x.dtype == torch.float32 and x.shape == r.shape, (label, n, x.dtype, tuple(x.shape))
        err = float((x.double().cpu() - r.cpu()).norm() / r.norm())
        assert err < TOL.get(n, TOL_DEFAULT), (label, n, combo, err)


def make_inputs(B, H, Hk, S, D, dtype, seed, device="cpu"):
    """Queries ``[B, H, S, D]`` and keys ``[B, Hk, S, D]`` as transposed views of ``[B, S, H, D]``."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = (torch.randn(B, S, H, D, generator=g, device=device) * 2).to(dtype).transpose(1, 2)
    k = (torch.randn(B, S, Hk, D, generator=g, device=device) * 2).to(dtype).transpose(1, 2)
    return q, k


# ------------------------------------------------------------------------------------------------
# under Triton's interpreter, on the CPU
# ------------------------------------------------------------------------------------------------
#: (B, H, Hk, S, D, causal, dtype, block): two tiles a side, S not a multiple of the tile
INTERPRETED = {
    "gqa2-causal-fp32-d16": (1, 2, 1, 23, 16, True, torch.float32, 16),
    "mha-bidir-bf16-d32-batch2": (2, 2, 2, 19, 32, False, torch.bfloat16, 16),
    "gqa3-causal-bf16-d32-tile32": (1, 3, 1, 45, 32, True, torch.bfloat16, 32),
    "gqa2-bidir-fp16-d16": (1, 2, 1, 20, 16, False, torch.float16, 16),
}
#: the case whose every output combination runs: (combination, with per-head maps)
COMBO_CASE = "gqa2-causal-fp32-d16"
COMBO_CALLS = [(ALL, True), (ALL, False), (COMBOS[1], True), (COMBOS[2], False), (COMBOS[3], False), (COMBOS[4], True)]


def _interpreted_calls() -> list[tuple[str, dict, list[int]]]:
    """``(case, combination, heads)`` of every interpreted kernel call, in the order the child runs them."""
    calls = []
    for name, (B, H, *_rest) in INTERPRETED.items():
        for combo, with_heads in (COMBO_CALLS if name == COMBO_CASE else [(ALL, True)]):
            calls.append((name, combo, [0, H - 1] if with_heads else []))
    return calls


def _scaling(D: int) -> float:
    return 1.1 / math.sqrt(D)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """The kernels' outputs for every interpreted call, run by a child process under the interpreter."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (`pip install triton`): the kernels' interpreter checks need it")
    tmp = tmp_path_factory.mktemp("interpret")
    inputs = {name: make_inputs(B, H, Hk, S, D, dt, seed=S + block)
              for name, (B, H, Hk, S, D, causal, dt, block) in INTERPRETED.items()}
    torch.save(inputs, tmp / "inputs.pt")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, __file__, str(tmp / "inputs.pt"), str(tmp / "outputs.pt")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"the interpreted kernels failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return inputs, torch.load(tmp / "outputs.pt")


@pytest.mark.parametrize("name", list(INTERPRETED))
def test_interpreted_kernels_match_float64(name, interpreted):
    inputs, out = interpreted
    q, k = inputs[name]
    causal = INTERPRETED[name][5]
    ref = reference_maps(q, k, _scaling(q.shape[-1]), causal)
    calls = [(i, c) for i, c in enumerate(_interpreted_calls()) if c[0] == name]
    assert calls
    for i, (_, combo, heads) in calls:
        check_maps(out["maps"][i], ref, combo, heads, (name, i))


def test_the_interpreter_takes_cpu_tensors(interpreted):
    """The child's kernels were the interpreter's, and :func:`supported` accepted CPU tensors there;
    this process's kernels take CPU tensors only if it runs under the interpreter too."""
    from poslens.capture.backends import cuda_maps

    _, out = interpreted
    assert out["interpreted"] and out["supported_cpu"]
    q, k = make_inputs(1, 2, 1, 8, 16, torch.float32, seed=0)
    assert cuda_maps.supported(q, k) == cuda_maps.interpreted()


def test_kernels_compile_for_hopper():
    """The compiled path, on any machine: Triton lowers both kernels to an sm_90 (H100/H200) cubin
    ahead of time (the interpreter never compiles, so a kernel it runs can still fail to compile).
    The maps kernel with every output on bf16 tiles, the log-sum-exp kernel with IEEE float32 products."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (`pip install triton`)")
    from poslens.capture.backends import cuda_maps

    if cuda_maps.interpreted():
        pytest.skip("TRITON_INTERPRET=1: this process's kernels are the interpreter's")
    import triton

    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:
        pytest.skip(f"this Triton has no ahead-of-time compile API: {e}")
    lse_kernel, maps_kernel = cuda_maps._kernels()

    def compile_for_sm90(fn, pointers: dict, consts: dict):
        sig = {n: "constexpr" if n in consts else pointers.get(n, "i32") for n in fn.arg_names}
        return triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})

    f32 = "*fp32"
    maps = compile_for_sm90(maps_kernel, {"Q": "*bf16", "K": "*bf16", "LSE": f32, "SC": f32, "PR": f32, "HS": f32,
                                          "HP": f32, "SLOT": "*i32", "SL": f32, "scale": "fp32"},
                            dict(LOG2E=1 / math.log(2), D=64, BM=64, CAUSAL=True, IEEE=False, W_SC=True, W_PR=True,
                                 W_HEADS=True, W_SLASH=True, NEED_S=True, PER_HEAD=True, STAGES=2, DOT_F32=False))
    lse = compile_for_sm90(lse_kernel, {"Q": f32, "K": f32, "LSE": f32, "scale2": "fp32"},
                           dict(D=32, BM=64, CAUSAL=True, IEEE=True, DOT_F32=False))
    for k in (maps, lse):
        assert len(k.asm["cubin"]) > 0 and ".target sm_90" in k.asm["ptx"]


def _run_interpreted(inputs_path: str, outputs_path: str) -> None:
    """The child process: every interpreted call on the saved inputs, outputs saved in call order."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from poslens.capture.backends import cuda_maps

    inputs = torch.load(inputs_path)
    out = {"interpreted": cuda_maps.interpreted(), "maps": []}
    first = next(iter(inputs.values()))
    out["supported_cpu"] = cuda_maps.supported(*first)
    for name, combo, heads in _interpreted_calls():
        q, k = inputs[name]
        block, causal = INTERPRETED[name][7], INTERPRETED[name][5]
        cuda_maps.CONFIG["block"] = block
        out["maps"].append(cuda_maps.attention_maps(q, k, _scaling(q.shape[-1]), causal=causal, heads=heads, **combo))
    cuda_maps.CONFIG["block"] = 64
    c = CAPTURE_CASE
    cap_in = capture_inputs(c["B"], c["H"], c["Hk"], c["S"], c["D"], seed=5)
    out["capture"] = {m: (capture_means(*cap_in, m, "triton"), capture_means(*cap_in, m, "torch")) for m in (0, 16)}
    torch.save(out, outputs_path)


# ------------------------------------------------------------------------------------------------
# compiled, on CUDA
# ------------------------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("B,H,Hk,S,D,causal,dtype", [
    (2, 8, 2, 300, 64, True, torch.bfloat16),
    (1, 4, 4, 130, 128, False, torch.float16),
    (3, 6, 3, 257, 32, True, torch.float32),
    (1, 2, 1, 64, 16, True, torch.bfloat16),
])
@pytest.mark.parametrize("block", [64, 128])
def test_fused_maps_match_float64(B, H, Hk, S, D, causal, dtype, block, monkeypatch):
    from poslens.capture.backends import cuda_maps

    if not cuda_maps.supported(torch.empty(1, 1, 1, D, device="cuda", dtype=dtype), torch.empty(1, 1, 1, D)):
        pytest.skip("triton not importable")
    assert not cuda_maps.interpreted(), "TRITON_INTERPRET=1 is set: the CUDA tests check the compiled kernels"
    monkeypatch.setitem(cuda_maps.CONFIG, "block", block)
    q, k = make_inputs(B, H, Hk, S, D, dtype, seed=S + block, device="cuda")
    scaling = _scaling(D)
    ref = reference_maps(q, k, scaling, causal)
    heads = [0, H - 1]
    combos = COMBOS if (S, block) == (300, 64) else [ALL]  # every combination once (each compiles)
    for combo in combos:
        for hs in ((heads, []) if len(combos) > 1 else (heads,)):
            got = cuda_maps.attention_maps(q, k, scaling, causal=causal, heads=hs, **combo)
            check_maps(got, ref, combo, hs, (B, H, Hk, S, D, causal, dtype, block))


def rope_cos_sin(S, D, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = torch.arange(S, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)[None]
    return emb.cos(), emb.sin()


@cuda
def test_capture_on_cuda_equals_capture_on_cpu():
    """The whole observe_attention and observe_hidden (fused maps, the whole-batch q/k Grams and
    reservoir, TF32 products of the bf16 values, the all-pairs APS count) against the CPU capture of the
    same bf16 values."""
    from poslens.capture.engine import attention as att

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
    assert set(res["cuda"]) == set(res["cpu"])
    for n, v in res["cpu"].items():
        torch.testing.assert_close(res["cuda"][n], v, rtol=1e-4, atol=2e-5, msg=n)


def capture_inputs(B, H, Hk, S, D, seed, device="cpu"):
    """bf16 queries, keys, the attention output (SDPA, causal) and a hidden state, as a layer hands them over."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = (torch.randn(B, S, H, D, generator=g, device=device) * 2).to(torch.bfloat16).transpose(1, 2)
    k = (torch.randn(B, S, Hk, D, generator=g, device=device) * 2).to(torch.bfloat16).transpose(1, 2)
    v = torch.randn(B, S, Hk, D, generator=g, device=device).to(torch.bfloat16).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=CAPTURE_SCALING,
                                                           enable_gqa=True)
    hid = torch.randn(B, S, 4 * D, generator=g, device=device).to(torch.bfloat16)
    return q, k, out, hid


CAPTURE_SCALING = 0.125


def capture_means(q, k, out, hid, map_size: int, kernel: str) -> tuple[dict, str]:
    """Every statistic of one layer and one batch with ``POSLENS_CAPTURE_KERNEL=kernel``: the means (on
    the CPU) and the backend the layer took."""
    from poslens.capture.engine import attention as att

    B, H, S, D = q.shape
    before = os.environ.get("POSLENS_CAPTURE_KERNEL")
    os.environ["POSLENS_CAPTURE_KERNEL"] = kernel
    try:
        spec = att.CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=k.shape[1], head_dim=D, seq_len=S, layers=[0],
                               heads=[(0, H - 1)], map_size=map_size)
        cap = att.Capture(spec, device=q.device)
        cap.begin_batch(B)
        cap.observe_attention(0, q, k, out, CAPTURE_SCALING)
        cap.observe_hidden(0, hid)
        cap.end_batch()
        return {n: t.cpu() for n, t in cap.means().items()}, cap.backends[0][0]
    finally:
        if before is None:
            del os.environ["POSLENS_CAPTURE_KERNEL"]
        else:
            os.environ["POSLENS_CAPTURE_KERNEL"] = before


def check_fused_equals_torch(fused: dict, torch_path: dict, S: int, map_size: int) -> None:
    M = -(-S // -(-S // map_size)) if map_size else S
    assert fused["scores"].shape == (1, M, M)
    assert ("probs_key0" in fused) == bool(map_size)
    assert set(fused) == set(torch_path)
    for n, t in torch_path.items():
        torch.testing.assert_close(fused[n], t, rtol=1e-4, atol=2e-5, msg=n)


@cuda
@pytest.mark.parametrize("map_size", [0, 16])
def test_fused_capture_equals_the_torch_path_on_cuda(map_size):
    """Every statistic through the fused kernels, with and without --map-size block maps (f = 13 does not
    divide S = 200), against the chunked torch path on the same CUDA inputs and output."""
    S = 200
    inputs = capture_inputs(2, 8, 2, S, 64, seed=5, device="cuda")
    torch_path, backend = capture_means(*inputs, map_size, "torch")
    assert backend == "torch"
    fused, backend = capture_means(*inputs, map_size, "auto")
    assert backend == "triton"
    check_fused_equals_torch(fused, torch_path, S, map_size)


#: the interpreted capture: one tile of 64 rows (S = 40), block maps with f = 3 not dividing S
CAPTURE_CASE = dict(B=2, H=4, Hk=2, S=40, D=16)


@pytest.mark.parametrize("map_size", [0, 16])
def test_interpreted_capture_equals_the_torch_path(map_size, interpreted):
    """The check above on the CPU: the capture's Triton backend under the interpreter against its
    torch path, on the same bf16 inputs."""
    _, out = interpreted
    (fused, fused_backend), (torch_path, torch_backend) = out["capture"][map_size]
    assert (fused_backend, torch_backend) == ("triton", "torch")
    check_fused_equals_torch(fused, torch_path, CAPTURE_CASE["S"], map_size)


if __name__ == "__main__":
    _run_interpreted(sys.argv[1], sys.argv[2])
