"""Training throughput of the small-model families (tokens/s; MFU on CUDA).

Measures the trainer's step (forward, backward, gradient clipping, AdamW; bf16 autocast on
CUDA) on random-token batches of fixed length, for each positional-encoding family and for two
attention implementations: ``sdpa`` (what poslens trains with) and ``eager`` (the naive
materialised-softmax path), printing the speed-up of sdpa over eager measured in the same run.
Optionally (``--end-to-end``) also runs :func:`poslens.models.train.train_model` on the copy task and
reports its own ``tokens_per_second`` (data generation, padding and logging included).

MFU = achieved model FLOP/s / peak FLOP/s, with model FLOPs per token = 6 N (N = non-embedding
parameters, plus the tied output projection) + 12 L d T (attention scores and values, T the sequence length), the
accounting of arXiv 2001.08361 / arXiv 2204.02311. The peak defaults to the dense bf16 figure of
the detected GPU (H100: 989 TFLOP/s, H200: 989, A100: 312); pass --peak-tflops to override.

    python benchmarks/bench_train.py --preset tiny --threads 2
    python benchmarks/bench_train.py --preset small --device cuda --batch-size 32 --seq-len 512
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402
import torch.nn.functional as F

from poslens.models.families import build_model, count_parameters, resolve_shape

_PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0, "4090": 165.0}


def peak_tflops(device: str, override: float | None) -> float | None:
    if override:
        return override
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    for key, val in _PEAK_BF16_TFLOPS.items():
        if key in name:
            return val
    return None


def flops_per_token(model, seq_len: int) -> float:
    cfg = model.config
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    hidden = getattr(cfg, "hidden_size", None) or cfg.n_embd
    vocab = cfg.vocab_size
    n = count_parameters(model, non_embedding=True) + vocab * hidden  # output projection counts as compute
    return 6 * n + 12 * layers * hidden * seq_len


def bench_loop(pe: str, preset: str, attn: str, batch: int, seq_len: int, vocab: int, device: str,
               warmup: int, steps: int) -> dict:
    model = build_model(pe, preset, vocab, seed=0, max_positions=max(seq_len, resolve_shape(preset).max_positions))
    model.config._attn_implementation = attn
    model.set_attn_implementation(attn) if hasattr(model, "set_attn_implementation") else None
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    amp = torch.bfloat16 if device.startswith("cuda") else None
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq_len + 1), generator=g).to(device)
    inp, tgt = x[:, :-1], x[:, 1:]

    def step():
        with (torch.autocast("cuda", dtype=amp) if amp else torch.autocast("cpu", enabled=False)):
            logits = model(input_ids=inp).logits
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), tgt.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    for _ in range(warmup):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tps = batch * seq_len * steps / dt
    out = {"pe": pe, "preset": preset, "attn": attn, "batch": batch, "seq_len": seq_len, "device": device,
           "params": count_parameters(model), "step_ms": 1000 * dt / steps, "tokens_per_second": tps,
           "model_tflops": tps * flops_per_token(model, seq_len) / 1e12}
    if device.startswith("cuda"):
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del model, opt
    return out


def bench_end_to_end(pe: str, preset: str, device: str, threads: int | None, steps: int) -> dict:
    from poslens.models.train import TrainConfig, train_model

    with tempfile.TemporaryDirectory() as d:
        s = train_model(TrainConfig(out=os.path.join(d, "m"), pe=pe, task="copy", preset=preset, steps=steps,
                                    batch_size=64, eval_every=0, eval_examples=32, checkpoint_every=0,
                                    device=device, threads=threads, progress=False))
    return {"pe": pe, "preset": preset, "task": "copy", "steps": steps, "tokens_per_second": s["tokens_per_second"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--pe", default="none,rope,learned", help="comma-separated families")
    ap.add_argument("--attn", default="sdpa,eager", help="comma-separated attention implementations")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--end-to-end", type=int, default=0, metavar="STEPS",
                    help="also time train_model on the copy task for STEPS steps (0: skip)")
    ap.add_argument("--json", dest="json_out", default=_results.default_path("train"),
                    help="write the results here (default: benchmarks/results_train.json; 'none': print only)")
    a = ap.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    if a.threads:
        torch.set_num_threads(a.threads)
    peak = peak_tflops(device, a.peak_tflops)
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else None
    print(f"device={device}{' (' + gpu + ')' if gpu else ''} threads={torch.get_num_threads()} preset={a.preset} "
          f"batch={a.batch_size} seq_len={a.seq_len} vocab={a.vocab}")
    rows = []
    for pe in a.pe.split(","):
        for attn in a.attn.split(","):
            r = bench_loop(pe, a.preset, attn, a.batch_size, a.seq_len, a.vocab, device, a.warmup, a.steps)
            if peak:
                r["mfu"] = r["model_tflops"] / peak
            rows.append(r)
            mfu = f"  MFU {100 * r['mfu']:.1f}%" if "mfu" in r else ""
            print(f"{pe:8s} {attn:6s} {r['step_ms']:9.1f} ms/step {r['tokens_per_second']:12,.0f} tok/s "
                  f"{r['model_tflops']:8.3f} TFLOP/s{mfu}", flush=True)
    by = {(r["pe"], r["attn"]): r for r in rows}
    for pe in a.pe.split(","):
        if (pe, "sdpa") in by and (pe, "eager") in by:
            print(f"{pe:8s} sdpa / eager speed-up: {by[pe, 'sdpa']['tokens_per_second'] / by[pe, 'eager']['tokens_per_second']:.2f}x")
    e2e = []
    if a.end_to_end:
        for pe in a.pe.split(","):
            r = bench_end_to_end(pe, a.preset, device, a.threads, a.end_to_end)
            e2e.append(r)
            print(f"train_model copy {pe:8s} {r['tokens_per_second']:12,.0f} tok/s (non-pad tokens, data included)")
    if _results.wanted(a.json_out):
        with open(a.json_out, "w") as f:
            json.dump({**_results.meta(), "device": device, "gpu": gpu, "threads": torch.get_num_threads(), "peak_tflops": peak,
                       "loop": rows, "end_to_end": e2e}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
