"""Every GPU measurement of poslens in one command: prints a table last, writes JSON.

Parts (``--parts``, comma-separated; default all):

- ``env``: the device, torch version, and the two ceilings measured here (bf16 / TF32 / float32
  matrix products, device-to-device copy bandwidth).
- ``kernels``: the fused CUDA map kernels (:mod:`poslens.capture.backends.cuda_maps`) and the chunked torch
  path against a float64 reference on fresh random inputs (bf16, GQA, causal and bidirectional,
  ragged lengths); then one layer's maps at the benchmark shape, fused vs torch.
- ``scan``: a random-init Llama-3-style 1B model (16 layers, width 2048, 32 heads, 8 KV heads,
  MLP 8192: the ``--preset 1b`` shape) in bf16 at 4,096 tokens: the plain ``sdpa`` forward, the
  poslens attention without capture, and capture with every statistic / with ``scores,probs``,
  each through the fused kernels and through the torch path; overhead = time / sdpa time - 1.
  The fused and torch maps of the same tokens are compared.
- ``simulate``: ``run_simulation`` at the paper's setting (100k samples, S 50, d 64, 4 layers) and
  at 10M samples (samples/s), beside the floor: the same batched products alone.
- ``train``: training steps (bf16 autocast, AdamW) of the ``small``, ``base`` and ``1b`` presets:
  tokens/s and MFU (6N + attention FLOPs per token over the bf16 dense peak); bf16 autocast
  against float32 on the same batches; ``poslens train`` end to end on a task.
- ``cli``: ``poslens scan`` end to end on the 1B model (default statistics and ``scores,probs``).
- ``dist``: ``poslens scan`` single-process vs ``torchrun --nproc-per-node 1`` (NCCL) vs
  ``--device-map auto`` on the GPU: maps.safetensors tensors compared.

Usage::

    python benchmarks/bench_gpu.py                                  # everything, on cuda
    python benchmarks/bench_gpu.py --quick --parts scan,kernels     # a smoke run (prints only)
    python benchmarks/bench_gpu.py --device cpu --quick              # CI-sized, on the CPU

Results go to ``benchmarks/results_gpu.json`` (``--out``; a ``--quick`` run prints only unless
``--out`` is given): each part that runs replaces its own
entry there, stamped with its date and arguments, and the other parts' entries stay. A scan at a
sequence length other than the default is its own entry (``scan@32768``).

Timing: every timed region is preceded by a warm-up and ends with ``torch.cuda.synchronize()``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

PARTS = ("env", "kernels", "scan", "simulate", "train", "dist", "cli")
LOG: list[str] = []


def say(msg: str) -> None:
    print(msg, flush=True)
    LOG.append(msg)


def sync(dev) -> None:
    if str(dev).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, dev, reps: int = 1, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    sync(dev)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


# ------------------------------------------------------------------------------------------------
# env
# ------------------------------------------------------------------------------------------------
def part_env(a, dev) -> dict:
    out = {"torch": torch.__version__, "device": dev}
    if dev.startswith("cuda"):
        p = torch.cuda.get_device_properties(dev)
        out.update(gpu=p.name, sms=p.multi_processor_count, memory_gib=p.total_memory / 2**30,
                   cuda=torch.version.cuda)
        try:
            import triton

            out["triton"] = triton.__version__
        except ImportError:
            out["triton"] = None
    n = 8192 if dev.startswith("cuda") and not a.quick else 2048 if dev.startswith("cuda") else 256
    for name, dt, prec in (("bf16", torch.bfloat16, "highest"), ("tf32", torch.float32, "high"),
                           ("fp32", torch.float32, "highest")):
        m = n if name == "bf16" else n // 2
        x = torch.randn(m, m, device=dev, dtype=dt)
        y = torch.randn(m, m, device=dev, dtype=dt)
        prev = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(prec)
        t = timed(lambda: x @ y, dev, reps=5, warmup=2)
        torch.set_float32_matmul_precision(prev)
        out[f"matmul_{name}_tflops"] = 2 * m**3 / t / 1e12
        del x, y
    nbytes = 2**31 if dev.startswith("cuda") and not a.quick else 2**26
    src = torch.empty(nbytes // 4, device=dev).uniform_()
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), dev, reps=5, warmup=2)
    out["copy_gb_s"] = 2 * nbytes / t / 1e9  # bytes read + written
    del src, dst
    say(f"env: {out}")
    return out


# ------------------------------------------------------------------------------------------------
# kernels: correctness against float64 and one layer's timing
# ------------------------------------------------------------------------------------------------
def reference_maps(q, k, scaling, causal):
    """Float64 batch/head sums: scores (0 where masked), probs, slash [H, S], per-head maps."""
    q, k = q.double(), k.double()
    B, H, S, D = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) * scaling
    i = torch.arange(S, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    allowed = (j <= i) if causal else torch.ones(S, S, dtype=torch.bool, device=q.device)
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
    sm = s.masked_fill(~allowed, 0.0)
    slash = torch.stack([torch.diagonal(p, -d, 2, 3).sum(-1) for d in range(S)], -1).sum(0)  # [H, S]
    return {"scores": sm.sum((0, 1)), "probs": p.sum((0, 1)), "slash": slash, "head_scores": sm.sum(0),
            "head_probs": p.sum(0)}


def torch_pass_maps(q, k, scaling, causal, heads=(), slash=True, checked=False):
    """The same batch/head sums from the chunked torch pass (:class:`poslens.capture.backends.attnpass.AttentionPass`)
    over float32 copies of ``q``/``k``: what a layer's statistics receive on the torch backend."""
    from poslens.capture.backends import choice as backends
    from poslens.capture.backends.attnpass import AttentionPass, Layer
    from poslens.capture.backends.sums import Workspace

    B, H, S, D = q.shape
    Hk = k.shape[1]
    qf, kf = q.float().contiguous(), k.float().contiguous()
    rows = backends.rows_per_chunk(B, H, S, q.device, H // Hk)
    layer = Layer(0, qf.view(B, Hk, H // Hk, S, D), kf.transpose(2, 3), scaling, causal, None, None, list(heads),
                  rows, B)
    f32 = dict(dtype=torch.float32, device=q.device)
    out = {"scores": torch.zeros(S, S, **f32), "probs": torch.zeros(S, S, **f32)}
    if slash:
        out["slash"] = torch.zeros(H, S, **f32)
    if heads:
        out["head_scores"], out["head_probs"] = (torch.zeros(len(heads), S, S, **f32) for _ in range(2))

    def read(piece):
        r, n = piece.rows, piece.keys
        out["scores"][r, :n] = piece["logit_sum"]
        out["probs"][r, :n] = piece["weight_sum"]
        if slash:
            d = piece["diagonal_sums"]
            out["slash"][:, :d.shape[1]] += d
        if heads:
            out["head_scores"][:, r, :n] = piece["selected_logit_sums"]
            out["head_probs"][:, r, :n] = piece["selected_weight_sums"]
    needs = {"logit_sum", "weight_sum"} | ({"diagonal_sums"} if slash else set()) | (
        {"selected_logit_sums", "selected_weight_sums"} if heads else set())
    AttentionPass(layer, [(needs, read)], Workspace(), checked=checked).run()
    return out


def part_kernels(a, dev) -> dict:
    from poslens.capture.backends import cuda_maps

    cuda = dev.startswith("cuda")
    rows = []
    cases = [(2, 8, 2, 300, 64, True), (1, 4, 4, 128, 128, False), (3, 6, 3, 257, 32, True), (2, 4, 1, 1000, 64, True)]
    if a.quick:
        cases = cases[:3]
    for B, H, Hk, S, D, causal in cases:
        g = torch.Generator(device=dev).manual_seed(B * 1000 + S)
        dt = torch.bfloat16 if cuda else torch.float32
        # [B, S, H, D] transposed, as transformers hands them over
        q = (torch.randn(B, S, H, D, generator=g, device=dev) * 2).to(dt).transpose(1, 2)
        k = (torch.randn(B, S, Hk, D, generator=g, device=dev) * 2).to(dt).transpose(1, 2)
        scaling = 1 / math.sqrt(D)
        ref = reference_maps(q, k, scaling, causal)
        heads = [0, H - 1]
        variants = {"torch": lambda: torch_pass_maps(q, k, scaling, causal, heads, checked=not cuda)}
        if cuda and cuda_maps.supported(q, k):
            variants["fused"] = lambda: cuda_maps.attention_maps(q, k, scaling, causal=causal, scores=True, probs=True,
                                                                 slash=True, heads=heads)
        for name, fn in variants.items():
            got = fn()
            errs = {}
            for key in ("scores", "probs", "slash", "head_scores", "head_probs"):
                r = ref[key] if key not in ("head_scores", "head_probs") else ref[key][heads]
                x = got[key].double()
                errs[key] = float((x - r).norm() / r.norm())
                assert bool(torch.isfinite(x).all()), (name, key)
            rows.append({"case": [B, H, Hk, S, D, causal], "path": name, "rel_err": errs})
            say(f"kernels: B{B} H{H}/{Hk} S{S} D{D} causal={causal} {name}: max rel err "
                f"{max(errs.values()):.2e} ({', '.join(f'{k} {v:.1e}' for k, v in errs.items())})")
    out = {"correctness": rows}
    # one layer's maps at the benchmark shape
    B, H, Hk, S, D = (4, 32, 8, 4096, 64) if not a.quick else (2, 8, 2, 512, 64)
    if not cuda:
        B, H, Hk, S, D = 1, 4, 2, 256, 32
    g = torch.Generator(device=dev).manual_seed(1)
    dt = torch.bfloat16 if cuda else torch.float32
    q = torch.randn(B, S, H, D, generator=g, device=dev).to(dt).transpose(1, 2)
    k = torch.randn(B, S, Hk, D, generator=g, device=dev).to(dt).transpose(1, 2)
    timing = {"shape": [B, H, Hk, S, D]}
    ref_maps = None
    for stats in (("scores", "probs"), ("scores", "probs", "slash")):
        lab = ",".join(stats)

        def torch_path(stats=stats):
            with torch.no_grad():
                return torch_pass_maps(q, k, 0.125, True, slash="slash" in stats, checked=not cuda)
        if a.torch_path:
            timing[f"torch[{lab}]_ms"] = 1000 * timed(torch_path, dev, reps=3)
        if len(stats) == 3:
            ref_maps = torch_path()
    if cuda and cuda_maps.supported(q, k):
        # launch settings: time each on the benchmark shape, check it against the torch path, keep the fastest
        sweep = []
        for block, lw, mw, st in ((64, 4, 4, 2), (64, 4, 8, 2), (64, 4, 4, 3), (128, 8, 8, 2), (128, 4, 8, 3),
                                  (128, 8, 4, 2), (32, 4, 4, 2)):
            cuda_maps.CONFIG.update(block=block, lse_warps=lw, maps_warps=mw, stages=st)
            rec = {"block": block, "lse_warps": lw, "maps_warps": mw, "stages": st}
            try:
                for stats in (("scores", "probs"), ("scores", "probs", "slash")):
                    fn = (lambda stats=stats: cuda_maps.attention_maps(
                        q, k, 0.125, causal=True, scores=True, probs=True, slash="slash" in stats, heads=[]))
                    rec[f"{','.join(stats)}_ms"] = 1000 * timed(fn, dev, reps=5)
                got = cuda_maps.attention_maps(q, k, 0.125, causal=True, scores=True, probs=True, slash=True, heads=[])
                rec["max_rel_vs_torch"] = max(float((got[n] - ref_maps[n]).norm() / ref_maps[n].norm())
                                              for n in ("scores", "probs", "slash"))
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            sweep.append(rec)
            say(f"kernels: config {rec}")
        ok = [r for r in sweep if "error" not in r and r["max_rel_vs_torch"] < 1e-5]
        best = min(ok, key=lambda r: r["scores,probs,slash_ms"])
        cuda_maps.CONFIG.update({kk: best[kk] for kk in ("block", "lse_warps", "maps_warps", "stages")})
        timing["sweep"] = sweep
        timing["chosen"] = dict(cuda_maps.CONFIG)
        timing["fused[scores,probs]_ms"] = best["scores,probs_ms"]
        timing["fused[scores,probs,slash]_ms"] = best["scores,probs,slash_ms"]
        say(f"kernels: chosen {cuda_maps.CONFIG}")
    # the flash forward of the same layer, for scale
    v = torch.randn_like(q)
    timing["sdpa_forward_ms"] = 1000 * timed(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), dev, reps=5)
    flops = 2 * B * H * S * S / 2 * D  # one causal Q K^T
    timing["causal_qk_tflop"] = flops / 1e12
    out["layer_timing"] = timing
    say(f"kernels: one layer {timing}")
    return out


# ------------------------------------------------------------------------------------------------
# scan: capture overhead on the 1B model
# ------------------------------------------------------------------------------------------------
def build_llama(dev, dtype, *, layers, hidden, heads, kv_heads, inter, vocab, max_pos, seed=0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from poslens.capture.engine.attention import ATTN_NAME, register

    register()
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                      max_position_embeddings=max_pos)
    torch.manual_seed(seed)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=ATTN_NAME)
    return model.eval()


def part_scan(a, dev) -> dict:
    from poslens.capture.engine.loop import attach
    from poslens.capture.model.adapters import get_adapter
    from poslens.capture.engine.spec import ALL_STATS, CaptureSpec
    from poslens.capture.engine.attention import ATTN_NAME
    from poslens.capture.engine.capture import Capture

    cuda = dev.startswith("cuda")
    if cuda and not a.quick:
        shape = dict(layers=16, hidden=2048, heads=32, kv_heads=8, inter=8192, vocab=8192)
        S, B, nb = a.seq_len, a.batch_size, a.batches
    elif cuda:
        shape = dict(layers=4, hidden=1024, heads=16, kv_heads=4, inter=2816, vocab=8192)
        S, B, nb = 1024, 2, 2
    else:
        shape = dict(layers=2, hidden=128, heads=4, kv_heads=2, inter=256, vocab=512)
        S, B, nb = 128, 2, 2
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build_llama(dev, dtype, max_pos=S, **shape)
    ad = get_adapter(model.config)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, shape["vocab"], (B, S), generator=g).to(dev) for _ in range(nb + 1)]
    L = shape["layers"]
    out = {"model": shape, "seq_len": S, "batch_size": B, "timed_batches": nb, "dtype": str(dtype),
           "map_size": a.map_size, "variants": {}}
    kw = {"use_cache": False, "logits_to_keep": 1}

    def run_plain(impl):
        model.set_attn_implementation(impl)

        def step(ids):
            with torch.no_grad():
                model(input_ids=ids, **kw)
        return step, None

    def run_capture(stats, kernel):
        model.set_attn_implementation(ATTN_NAME)
        # "fused" is the default choice on CUDA (the Triton kernels wherever they take a layer)
        os.environ["POSLENS_CAPTURE_KERNEL"] = "auto" if kernel == "fused" else kernel
        spec = CaptureSpec(num_layers=L, num_heads=shape["heads"], num_kv_heads=shape["kv_heads"],
                           head_dim=shape["hidden"] // shape["heads"], seq_len=S, layers=list(range(L)),
                           rope_layers=ad.rope_layers(model.config), reservoir=256, stats=frozenset(stats),
                           map_size=a.map_size)
        cap = Capture(spec, device=dev)
        handles = attach(model, ad, cap)
        seen = [0]

        def step(ids):
            cap.begin_batch(ids.shape[0], seq_start=seen[0])
            seen[0] += ids.shape[0]
            with torch.no_grad(), cap.active():
                model(input_ids=ids, **kw)
            cap.end_batch()
        return step, (cap, handles)

    variants = [("sdpa", lambda: run_plain("sdpa")), ("poslens-off", lambda: run_plain(ATTN_NAME))]
    kernels = (["fused", "torch"] if a.torch_path else ["fused"]) if cuda else ["torch"]
    for kern in kernels:
        variants.append((f"all/{kern}", lambda kern=kern: run_capture(ALL_STATS, kern)))
        variants.append((f"scores,probs/{kern}", lambda kern=kern: run_capture(("scores", "probs"), kern)))
    if cuda:  # where the time of "all" goes
        for st in (("slash",), ("cosine", "attn_cosine"), ("qk", "dim_logit")):
            variants.append((f"{','.join(st)}/fused", lambda st=st: run_capture(st, "fused")))
    keep = {}
    for name, make in variants:
        step, state = make()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            step(batches[0])  # warm-up (kernel compilation, allocator)
            sync(dev)
            t0 = time.perf_counter()
            for ids in batches[1:]:
                step(ids)
            sync(dev)
        except Exception as e:  # one variant's failure leaves the others' numbers
            import traceback

            traceback.print_exc()
            out["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            say(f"scan: {name} FAILED {type(e).__name__}: {str(e)[:300]}")
            if state is not None:
                for h in state[1]:
                    h.remove()
            os.environ.pop("POSLENS_CAPTURE_KERNEL", None)
            continue
        dt = (time.perf_counter() - t0) / nb
        rec = {"s_per_batch": dt, "tokens_per_s": B * S / dt}
        if cuda:
            rec["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["variants"][name] = rec
        if state is not None:
            cap, handles = state
            for h in handles:
                h.remove()
            if name.startswith("all/"):
                keep[name] = {k: v.cpu().float() for k, v in cap.means().items()}
            del cap
        os.environ.pop("POSLENS_CAPTURE_KERNEL", None)
        base = out["variants"].get("sdpa", {}).get("s_per_batch")
        ov = f"  overhead {100 * (dt / base - 1):+.1f}%" if base and name != "sdpa" else ""
        say(f"scan: {name:20s} {1000 * dt:9.1f} ms/batch  {B * S / dt:10,.0f} tok/s{ov}"
            + (f"  peak {rec['peak_gib']:.1f} GiB" if cuda else ""))
    base = out["variants"]["sdpa"]["s_per_batch"]
    for name, rec in out["variants"].items():
        if "s_per_batch" in rec:
            rec["overhead"] = rec["s_per_batch"] / base - 1
    if "all/fused" in keep and "all/torch" in keep:
        diffs = {}
        for kname, ref in keep["all/torch"].items():
            x = keep["all/fused"][kname]
            fin = torch.isfinite(ref)
            diffs[kname] = float((x[fin] - ref[fin]).abs().max()) if bool(fin.any()) else 0.0
        out["fused_vs_torch_max_abs"] = diffs
        say(f"scan: fused vs torch path, max |diff| of the means: {diffs}")
    del model
    if cuda:
        torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------------------------------------
# simulate
# ------------------------------------------------------------------------------------------------
def part_simulate(a, dev) -> dict:
    from poslens.simulator import SimConfig, auto_chunk, run_simulation

    out = {}
    sizes = [100_000, 10_000_000] if dev.startswith("cuda") and not a.quick else [20_000]
    if not dev.startswith("cuda"):
        sizes = [2_000]
    for n in sizes:
        cfg = SimConfig(samples=n, seq_len=50, dim=64, layers=4, device=dev)
        run_simulation(SimConfig(samples=1000, seq_len=50, dim=64, layers=4, device=dev))  # warm-up
        sync(dev)
        t0 = time.perf_counter()
        res = run_simulation(cfg)
        sync(dev)
        dt = time.perf_counter() - t0
        out[f"samples_{n}"] = {"seconds": dt, "samples_per_s": n / dt, "chunk": auto_chunk(cfg)}
        say(f"simulate: {n:,} samples  {dt:.2f} s  {n / dt:,.0f} samples/s  (chunk {auto_chunk(cfg)})")
        del res
    # floor: the same batched products alone (per layer: Q Q^T and A Y, float32) on one chunk
    cfg = SimConfig(samples=100_000, seq_len=50, dim=64, layers=4, device=dev)
    N, S, d = auto_chunk(cfg), 50, 64
    x = torch.randn(N, S, d, device=dev)
    p = torch.randn(N, S, S, device=dev)
    s = torch.empty(N, S, S, device=dev)

    def products():
        for _ in range(4):
            torch.bmm(x, x.transpose(1, 2), out=s)
            torch.bmm(p, x)
    t = timed(products, dev, reps=5)
    out["gemm_floor_samples_per_s"] = N / t
    out["gemm_floor_tflops"] = 4 * (2 * N * S * S * d * 2) / t / 1e12
    say(f"simulate: floor (the batched products alone): {N / t:,.0f} samples/s, {out['gemm_floor_tflops']:.1f} TFLOP/s")
    return out


# ------------------------------------------------------------------------------------------------
# train
# ------------------------------------------------------------------------------------------------
def part_train(a, dev) -> dict:
    import bench_train

    from poslens.models.families import build_model

    cuda = dev.startswith("cuda")
    out = {"runs": []}
    peak = bench_train.peak_tflops(dev, None) if cuda else None
    out["peak_bf16_tflops"] = peak
    plan = [("small", 64, 512), ("base", 32, 1024), ("1b", 8, 2048)] if cuda and not a.quick else [("micro", 4, 64)]
    for preset, batch, seq in plan:
        r = bench_train.bench_loop("rope", preset, "sdpa", batch, seq, 8192 if cuda else 256, dev,
                                   warmup=3, steps=a.train_steps if cuda else 2)
        if peak:
            r["mfu"] = r["model_tflops"] / peak
        out["runs"].append(r)
        say(f"train: {preset:6s} B{batch} S{seq}: {r['tokens_per_second']:,.0f} tok/s  {r['model_tflops']:.1f} TFLOP/s"
            + (f"  MFU {100 * r['mfu']:.1f}%" if peak else "") + (f"  peak {r.get('peak_mem_gib', 0):.1f} GiB"))
        if cuda:
            torch.cuda.empty_cache()
    # bf16 autocast vs float32 on the same batches and initial weights
    import torch.nn.functional as F

    preset = "small" if cuda else "micro"
    vocab, B, S, steps = (8192, 16, 256, 30) if cuda else (256, 4, 32, 5)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, vocab, (B, S + 1), generator=g).to(dev) for _ in range(4)]
    curves = {}
    for mode in ("fp32", "bf16"):
        model = build_model("rope", preset, vocab, seed=0).to(dev).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for t in range(steps):
            x = data[t % len(data)]
            ctx = torch.autocast("cuda", dtype=torch.bfloat16) if (mode == "bf16" and cuda) else torch.autocast(
                "cpu", enabled=False)
            with ctx:
                logits = model(input_ids=x[:, :-1]).logits
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        curves[mode] = losses
        del model, opt
    rel = max(abs(x - y) / abs(y) for x, y in zip(curves["bf16"], curves["fp32"]))
    out["autocast"] = {"fp32": curves["fp32"], "bf16": curves["bf16"], "max_rel_diff": rel,
                       "finite": all(math.isfinite(v) for v in curves["bf16"]),
                       "decreasing": curves["bf16"][-1] < curves["bf16"][0]}
    say(f"train: bf16 autocast vs fp32 ({steps} steps, same batches): loss {curves['bf16'][0]:.3f} -> "
        f"{curves['bf16'][-1]:.3f} vs {curves['fp32'][0]:.3f} -> {curves['fp32'][-1]:.3f}, max rel diff {rel:.3%}")
    # `poslens train` end to end on a task
    r = bench_train.bench_end_to_end("rope", "small" if cuda else "micro", dev, None, 100 if cuda else 3)
    out["end_to_end"] = r
    say(f"train: poslens train (copy task, small, 100 steps) {r['tokens_per_second']:,.0f} tok/s")
    return out


# ------------------------------------------------------------------------------------------------
# dist: torchrun (NCCL) and --device-map auto equal the single-process scan
# ------------------------------------------------------------------------------------------------
def part_dist(a, dev) -> dict:
    from safetensors.torch import load_file

    cuda = dev.startswith("cuda")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        mdir = os.path.join(tmp, "model")
        model = build_llama("cpu", torch.float32, layers=4, hidden=256, heads=8, kv_heads=2, inter=512, vocab=512,
                            max_pos=1024)
        model.save_pretrained(mdir)
        del model
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        common = [mdir, "--data", "random", "--seq-len", "512" if cuda else "64", "--num-seqs", "8", "--batch-size",
                  "2", "--no-figures", "--quiet", "--dtype", "fp32"]
        runs = {"single": [sys.executable, "-m", "poslens", "scan", *common, "--device", dev]}
        if cuda:
            runs["torchrun"] = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "-m",
                                "poslens", "scan", *common, "--device", "cuda"]
            runs["device_map"] = [sys.executable, "-m", "poslens", "scan", *common, "--device-map", "auto"]
        maps = {}
        for name, cmd in runs.items():
            o = os.path.join(tmp, name)
            t0 = time.perf_counter()
            p = subprocess.run(cmd + ["--out", o], env=env, capture_output=True, text=True)
            dt = time.perf_counter() - t0
            out[name] = {"rc": p.returncode, "seconds": dt, "stderr_tail": p.stderr[-800:]}
            if p.returncode == 0:
                maps[name] = load_file(os.path.join(o, "maps.safetensors"))
            say(f"dist: {name:10s} rc={p.returncode} {dt:.1f} s" + ("" if p.returncode == 0 else f"  {p.stderr[-300:]}"))
        for name in ("torchrun", "device_map"):
            if name in maps and "single" in maps:
                diff = {k: float((maps[name][k].double() - v.double()).nan_to_num().abs().max())
                        for k, v in maps["single"].items()}
                out[f"{name}_max_abs_diff"] = diff
                say(f"dist: {name} vs single, max |diff| over tensors: {max(diff.values()):.3e} "
                    f"(worst {max(diff, key=diff.get)})")
    return out


# ------------------------------------------------------------------------------------------------
# cli: `poslens scan` end to end on the 1B model (loading, loop, finalize, files, figures)
# ------------------------------------------------------------------------------------------------
def part_cli(a, dev) -> dict:
    cuda = dev.startswith("cuda")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        mdir = os.path.join(tmp, "model")
        if cuda and not a.quick:
            shape, S, n, bs = dict(layers=16, hidden=2048, heads=32, kv_heads=8, inter=8192, vocab=8192), a.seq_len, 8, 4
        else:
            shape, S, n, bs = dict(layers=2, hidden=128, heads=4, kv_heads=2, inter=256, vocab=512), 128, 4, 2
        model = build_llama(dev, torch.bfloat16 if cuda else torch.float32, max_pos=S, **shape)
        model.save_pretrained(mdir)
        del model
        if cuda:
            torch.cuda.empty_cache()
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for label, extra in (("scores,probs", ["--stats", "scores,probs"]), ("all", [])):
            o = os.path.join(tmp, label.replace(",", "_"))
            cmd = [sys.executable, "-m", "poslens", "scan", mdir, "--out", o, "--data", "random", "--seq-len", str(S),
                   "--num-seqs", str(n), "--batch-size", str(bs), "--device", dev, "--quiet", *extra]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            dt = time.perf_counter() - t0
            rec = {"rc": p.returncode, "wall_s": dt, "stderr_tail": p.stderr[-600:]}
            if p.returncode == 0:
                summ = json.loads(Path(o, "summary.json").read_text())
                rec["throughput"] = summ.get("throughput")
                rec["files_mb"] = {f.name: round(f.stat().st_size / 2**20, 1) for f in Path(o).iterdir()}
                rec["layer0"] = {k: summ["layers"][0].get(k) for k in ("relativity_index", "locality", "aps")}
            out[label] = rec
            tp = rec.get("throughput") or {}
            say(f"cli: poslens scan --stats {label}: rc={p.returncode} wall {dt:.1f} s, loop "
                f"{tp.get('tokens_per_s') or 0:,.0f} tok/s" + ("" if p.returncode == 0 else f"  {p.stderr[-300:]}"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--batches", type=int, default=3, help="timed batches per scan variant")
    ap.add_argument("--map-size", type=int, default=0, help="scan part: --map-size block maps (0: full maps)")
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--no-torch-path", dest="torch_path", action="store_false",
                    help="on CUDA, skip the chunked torch path (time the fused kernels only)")
    ap.add_argument("--out", default=None,
                    help="JSON file whose entries the parts that run replace (default: benchmarks/results_gpu.json; "
                         "--quick: print only; 'none': print only)")
    a = ap.parse_args(argv)
    torch.set_num_threads(min(8, os.cpu_count() or 1) if a.device.startswith("cuda") else 1)
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {bad}; choose from {PARTS}")
    out = None if a.out in ("", "none") or (a.out is None and a.quick) else Path(a.out or HERE / "results_gpu.json")
    res = json.loads(out.read_text()) if out is not None and out.exists() else {}
    for p in parts:
        t0 = time.perf_counter()
        try:
            part = globals()[f"part_{p}"](a, a.device)
        except Exception as e:  # keep the other parts' numbers
            import traceback

            traceback.print_exc()
            part = {"error": f"{type(e).__name__}: {e}"}
            say(f"{p}: FAILED {type(e).__name__}: {str(e)[:300]}")
        key = p if p != "scan" or a.seq_len == 4096 else f"scan@{a.seq_len}"
        res[key] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv[1:],
                    "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device,
                    "torch": torch.__version__, "wall_s": time.perf_counter() - t0, "result": part}
        if out is not None:
            out.write_text(json.dumps(res, indent=1, default=str))
    print("\n==== summary ====")
    for line in LOG:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
