"""Benchmark: the streaming simulator against the papers' approach and against the GEMM floor.

Three whole processes on the same samples, at the paper's setting by default (arXiv 2509.21042:
100,000 samples, length 50, d = 64, 4 layers, alpha = 0):

- **naive**: the authors' approach: materialise every sample, keep every layer's scores, weights
  and outputs, average at the end (torch's own threads);
- **poslens**: :func:`poslens.simulator.run_simulation` (chunks on single-threaded workers);
- **GEMM floor**: the same batched products alone (per layer and chunk ``Y Y^T`` and ``A Y``, on
  the same workers), no sampling, normalisation, softmax or statistics: what no implementation
  of this model can beat with these kernels.

Each runs in its own subprocess so its peak resident memory (ru_maxrss) is its own; "process" is
the wall time of the whole process (interpreter, ``import torch``, work, exit), "compute" the
part after the imports. One table with the ratios is printed. Run:

    python benchmarks/bench_simulate.py                    # paper setting, CPU (naive needs ~15 GB)
    python benchmarks/bench_simulate.py --samples 20000    # smaller: naive needs ~3 GB
    python benchmarks/bench_simulate.py --device cuda --samples 1000000 --skip-naive
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

T_START = time.perf_counter()


def _naive(args) -> dict:
    """The authors' approach: materialise all samples, keep every layer's tensors, mean at the end."""
    import torch

    from poslens.simulator import RNG_BLOCK, SimConfig, sample_inputs

    torch.set_num_threads(args.threads)
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
    return {"seconds": time.perf_counter() - t0, "scores": scores, "probs": probs}


def _streaming(args) -> dict:
    import torch

    from poslens.simulator import SimConfig, run_simulation

    cfg = SimConfig(samples=args.samples, seq_len=args.seq_len, dim=args.dim, layers=args.layers, alpha=args.alpha,
                    device=args.device)
    t0 = time.perf_counter()
    res = run_simulation(cfg, workers=args.threads)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0, "scores": res.scores, "probs": res.probs}


def _floor(args) -> dict:
    """The batched products alone, chunk by chunk, on the same single-threaded workers."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from poslens.simulator import SimConfig, auto_chunk

    cfg = SimConfig(samples=args.samples, seq_len=args.seq_len, dim=args.dim, layers=args.layers, device=args.device)
    dev = torch.device(args.device)
    N, S, d = auto_chunk(cfg), cfg.seq_len, cfg.dim
    sizes = [min(N, args.samples - i) for i in range(0, args.samples, N)]
    local = threading.local()

    def products(n):
        if not hasattr(local, "bufs"):
            g = torch.Generator(device=dev).manual_seed(0)
            y = torch.nn.functional.normalize(torch.randn(N, S, d, generator=g, device=dev), dim=-1)
            p = torch.softmax(torch.randn(N, S, S, generator=g, device=dev), -1)
            local.bufs = (y, p, torch.empty(N, S, S, device=dev), torch.empty(N, S, d, device=dev))
        y, p, s, o = (t[:n] for t in local.bufs)
        for _ in range(cfg.layers):
            torch.bmm(y, y.transpose(1, 2), out=s)
            torch.bmm(p, y, out=o)

    workers = 1 if dev.type == "cuda" else args.threads
    if dev.type == "cpu":
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(products, sizes))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0}


def _child(args) -> None:
    import resource

    t_import = time.perf_counter()
    import torch

    import poslens.simulate  # noqa: F401  (counted as start-up, like import torch)

    imports = time.perf_counter() - t_import
    out = {"naive": _naive, "poslens": _streaming, "floor": _floor}[args.mode](args)
    if "scores" in out:
        from safetensors.torch import save_file

        save_file({"scores": out["scores"].float().cpu().contiguous(),
                   "probs": out["probs"].float().cpu().contiguous()}, args.tensors)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    gpu_peak = torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else 0
    print(json.dumps({"seconds": out["seconds"], "imports": imports, "peak_rss_mb": ru.ru_maxrss / 1024,
                      "gpu_peak_mb": gpu_peak / 2**20}))


def _cpu_note() -> str:
    try:
        load = os.getloadavg()
        return f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end"
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--seq-len", type=int, default=50)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of every approach (torch's intra-op threads for naive, workers for the others); "
                         "0 = the CPUs this process may use")
    ap.add_argument("--skip-naive", action="store_true", help="only poslens and the floor (e.g. on a GPU)")
    ap.add_argument("--json", default=_results.default_path("simulate"),
                    help="write the results here (default: benchmarks/results_simulate.json; 'none': print only)")
    ap.add_argument("--mode", choices=["naive", "poslens", "floor"], help=argparse.SUPPRESS)
    ap.add_argument("--tensors", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        _child(args)
        return
    if not args.threads:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    import resource
    import tempfile

    import torch
    from safetensors.torch import load_file

    results = {}
    modes = ["poslens", "floor"] + ([] if args.skip_naive else ["naive"])
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    env["PYTHONPATH"] = os.path.abspath(src) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            cmd = [sys.executable, __file__, "--mode", mode, "--tensors", f"{tmp}/{mode}.safetensors"]
            for k in ("samples", "seq_len", "dim", "layers", "alpha", "device", "threads"):
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            wall = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode != 0:
                print(f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
                results[mode] = None
                continue
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res["process_seconds"] = wall
            res["cpu_seconds"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            res["sys_seconds"] = r1.ru_stime - r0.ru_stime
            if os.path.exists(f"{tmp}/{mode}.safetensors"):
                res["tensors"] = load_file(f"{tmp}/{mode}.safetensors")
            results[mode] = res

    print(f"setting: samples={args.samples:,} seq_len={args.seq_len} dim={args.dim} layers={args.layers} "
          f"alpha={args.alpha} device={args.device} threads={args.threads}; {_cpu_note()}")
    names = {"naive": "naive (materialise all)", "poslens": "poslens (streaming)", "floor": "GEMM floor (products only)"}
    ref = results.get("naive")
    head = (f"{'approach':28s} {'process s':>9s} {'compute s':>9s} {'CPU s':>7s} {'sys s':>6s} {'peak RSS MB':>11s}"
            f" {'samples/s':>10s} {'naive/this time':>15s} {'naive/this mem':>14s}")
    print(head)
    print("-" * len(head))
    for mode in ("naive", "poslens", "floor"):
        r = results.get(mode)
        if not r:
            continue
        t_ratio = f"{ref['process_seconds'] / r['process_seconds']:.1f}x" if ref else "-"
        m_ratio = f"{ref['peak_rss_mb'] / r['peak_rss_mb']:.1f}x" if ref else "-"
        print(f"{names[mode]:28s} {r['process_seconds']:9.2f} {r['seconds']:9.2f} {r['cpu_seconds']:7.1f} "
              f"{r['sys_seconds']:6.1f} {r['peak_rss_mb']:11.0f} {args.samples / r['seconds']:10,.0f} "
              f"{t_ratio:>15s} {m_ratio:>14s}" + (f"  GPU peak {r['gpu_peak_mb']:.0f} MB" if r["gpu_peak_mb"] else ""))
    s, f = results.get("poslens"), results.get("floor")
    if s and f:
        print(f"poslens compute / GEMM floor compute: {s['seconds'] / f['seconds']:.2f}x "
              f"(start-up, mostly import torch: {s['imports']:.2f} s of the poslens process)")
    if s and ref:
        diff = (s["tensors"]["scores"] - ref["tensors"]["scores"]).abs().nan_to_num(0).max().item()
        pdiff = (s["tensors"]["probs"] - ref["tensors"]["probs"]).abs().max().item()
        print(f"same statistics: max |scores diff| = {diff:.2e}, max |probs diff| = {pdiff:.2e}")
    if _results.wanted(args.json):
        with open(args.json, "w") as fh:
            json.dump({**_results.meta(), "setting": {k: getattr(args, k) for k in ("samples", "seq_len", "dim", "layers", "alpha",
                                                                 "device", "threads")},
                       "results": {k: {kk: vv for kk, vv in v.items() if kk != "tensors"} for k, v in results.items() if v}},
                      fh, indent=1)


if __name__ == "__main__":
    main()
