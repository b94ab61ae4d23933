"""Benchmark: streaming simulator vs the papers' approach (every layer's full tensors kept).

Both compute the same statistics (per-layer mean pre-softmax scores and attention weights) at
the paper's setting (arXiv 2509.21042: 100,000 samples, length 50, d = 64, 4 layers, alpha = 0)
on the same samples. Each runs in its own subprocess so its peak resident memory (ru_maxrss) is
its own; the ratio is printed. Run:

    python benchmarks/bench_simulate.py            # paper setting, CPU
    python benchmarks/bench_simulate.py --device cuda --samples 1000000   # GPU: samples/s

The naive run needs ~14 GB of RAM at the paper's setting.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _naive(args) -> dict:
    """The authors' approach: materialise all samples, keep every layer's tensors, mean at the end."""
    import torch

    from poslens.simulate import RNG_BLOCK, SimConfig, sample_inputs

    cfg = SimConfig(samples=args.samples, seq_len=args.seq_len, dim=args.dim, layers=args.layers, alpha=args.alpha)
    dev = torch.device(args.device)
    t0 = time.perf_counter()
    n_blocks = -(-cfg.samples // RNG_BLOCK)
    X = torch.cat([sample_inputs(cfg, b, dev) for b in range(n_blocks)])[: cfg.samples]
    S = cfg.seq_len
    mask = torch.ones(S, S, dtype=torch.bool, device=dev).triu(1)
    kept = {"inputs": X, "scores": [], "probs": [], "outputs": []}
    x = X
    for _ in range(cfg.layers):
        y = torch.nn.functional.normalize(x, dim=-1)
        s = y @ y.transpose(-1, -2)
        p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
        x = p @ y + x
        kept["scores"].append(s)
        kept["probs"].append(p)
        kept["outputs"].append(x)
    scores = torch.stack([s.double().mean(0) for s in kept["scores"]]).masked_fill(mask, float("nan"))
    probs = torch.stack([p.double().mean(0) for p in kept["probs"]])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "scores": scores, "probs": probs}


def _streaming(args) -> dict:
    import torch

    from poslens.simulate import SimConfig, run_simulation

    cfg = SimConfig(samples=args.samples, seq_len=args.seq_len, dim=args.dim, layers=args.layers, alpha=args.alpha,
                    device=args.device)
    res = run_simulation(cfg)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"seconds": res.seconds, "scores": res.scores, "probs": res.probs}


def _child(args) -> None:
    import resource

    import torch

    torch.set_num_threads(args.threads)
    out = (_naive if args.mode == "naive" else _streaming)(args)
    from safetensors.torch import save_file

    save_file({"scores": out["scores"].float().cpu().contiguous(), "probs": out["probs"].float().cpu().contiguous()},
              args.tensors)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gpu_peak = torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else 0
    print(json.dumps({"seconds": out["seconds"], "peak_rss_mb": peak_kb / 1024, "gpu_peak_mb": gpu_peak / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--seq-len", type=int, default=50)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-naive", action="store_true", help="only time the streaming simulator (e.g. on a GPU)")
    ap.add_argument("--mode", choices=["naive", "streaming"], help=argparse.SUPPRESS)
    ap.add_argument("--tensors", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        _child(args)
        return

    import tempfile

    import torch
    from safetensors.torch import load_file

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        modes = ["streaming"] + ([] if args.skip_naive else ["naive"])
        for mode in modes:
            cmd = [sys.executable, __file__, "--mode", mode, "--tensors", f"{tmp}/{mode}.safetensors"]
            for k in ("samples", "seq_len", "dim", "layers", "alpha", "device", "threads"):
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
                results[mode] = None
                continue
            results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
            results[mode]["process_seconds"] = time.perf_counter() - t0
            results[mode]["tensors"] = load_file(f"{tmp}/{mode}.safetensors")
    s = results["streaming"]
    print(f"setting: samples={args.samples} seq_len={args.seq_len} dim={args.dim} layers={args.layers} "
          f"device={args.device} threads={args.threads}")
    print(f"streaming : {s['seconds']:8.2f} s  peak RSS {s['peak_rss_mb']:8.0f} MB  "
          f"({args.samples / s['seconds']:,.0f} samples/s)" + (f"  GPU peak {s['gpu_peak_mb']:.0f} MB" if s["gpu_peak_mb"] else ""))
    n = results.get("naive")
    if n:
        print(f"naive     : {n['seconds']:8.2f} s  peak RSS {n['peak_rss_mb']:8.0f} MB  "
              f"({args.samples / n['seconds']:,.0f} samples/s)")
        print(f"ratio     : {n['seconds'] / s['seconds']:.1f}x less wall time, "
              f"{n['peak_rss_mb'] / s['peak_rss_mb']:.1f}x lower peak memory")
        diff = (s["tensors"]["scores"] - n["tensors"]["scores"]).abs().nan_to_num(0).max().item()
        pdiff = (s["tensors"]["probs"] - n["tensors"]["probs"]).abs().max().item()
        print(f"same statistics: max |scores diff| = {diff:.2e}, max |probs diff| = {pdiff:.2e}")


if __name__ == "__main__":
    main()
