"""Benchmark: data-parallel ``poslens scan`` (1 vs N processes) and ``--device-map auto`` on a large model.

Part 1, scaling: the same random-weight Llama-architecture model and the same ``--data random``
sequences are scanned by one process and by ``torchrun --nproc-per-node N`` (CPU: gloo, each
process limited to ``--threads`` threads; CUDA: NCCL, one GPU per process). Throughput is the
scan loop's tokens/s from ``summary.json`` (tokens of all ranks / the slowest rank's loop time;
model loading and process start-up excluded, and reported separately as wall time).
Scaling efficiency = tps_N / (N x tps_1). The maps of the N-process run are checked against the
one-process run (max relative difference, expected <= 1e-6).

Part 2, large model (CUDA only unless ``--big-bytes`` is given): a randomly initialised Llama whose
weights exceed ``--big-fraction`` (default 0.34) of GPU 0's memory is saved and scanned
in-process with ``--device-map auto``; reports weight size, tokens/s and peak GPU memory.

Usage::

    python benchmarks/bench_distributed.py                        # CPU: 1 vs 2 processes, 1 thread each
    python benchmarks/bench_distributed.py --device cuda --procs 1,2,4 --big   # GPUs + the large model
    python benchmarks/bench_distributed.py --big --big-bytes 2e8  # try the large-model path on CPU

The machine may be shared: the script prints the load average before and after; compare numbers
from the same run only.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

MODEL = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, vocab_size=4096)


def build_model(path: str, max_pos: int, **overrides) -> str:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(**{**MODEL, **overrides}, max_position_embeddings=max_pos)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def scan_cmd(procs: int, model: str, out: str, args) -> list[str]:
    opts = ["--data", "random", "--seq-len", str(args.seq_len), "--num-seqs", str(args.num_seqs), "--batch-size",
            str(args.batch_size), "--device", args.device, "--no-figures", "--quiet",
            "--checkpoint-every", "1000000"]
    if procs == 1:
        return [sys.executable, "-m", "poslens", "scan", model, "--out", out, *opts]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "localhost:0", "-m", "poslens", "scan", model, "--out", out, *opts]


def run_scaling(args, tmp: str) -> dict:
    model = build_model(os.path.join(tmp, "model"), args.seq_len)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    results = {}
    for p in args.procs:
        out = os.path.join(tmp, f"run{p}")
        t0 = time.time()
        res = subprocess.run(scan_cmd(p, model, out, args), env=env, capture_output=True, text=True)
        wall = time.time() - t0
        if res.returncode != 0:
            sys.exit(f"{p}-process scan failed:\n{res.stderr[-3000:]}")
        thr = json.load(open(os.path.join(out, "summary.json")))["throughput"]
        results[p] = {"tokens": thr["tokens"], "loop_s": thr["seconds"], "tokens_per_s": thr["tokens_per_s"],
                      "wall_s_incl_startup": wall}
        print(f"  {p} process(es): {thr['tokens_per_s']:.0f} tokens/s (loop {thr['seconds']:.1f} s, "
              f"wall incl. start-up {wall:.1f} s)", flush=True)
    base = results[args.procs[0]]
    from poslens.rundir.io import read_tensors

    ref = read_tensors(os.path.join(tmp, f"run{args.procs[0]}", "maps.safetensors"))
    for p, r in results.items():
        r["efficiency"] = r["tokens_per_s"] / (p / args.procs[0] * base["tokens_per_s"])
        got = read_tensors(os.path.join(tmp, f"run{p}", "maps.safetensors"))
        r["max_rel_diff_vs_first"] = max(
            float((got[k].double() - ref[k].double()).abs().max() / ref[k].double().abs().max().clamp_min(1e-30))
            for k in ref)
    return results


def run_big(args, tmp: str) -> dict:
    """A random Llama whose weights exceed a fraction of GPU 0's memory, scanned with --device-map auto."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan

    cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.big_bytes:
        target = float(args.big_bytes)
    elif cuda:
        target = args.big_fraction * torch.cuda.get_device_properties(0).total_memory
    else:
        sys.exit("--big needs a GPU (or --big-bytes to exercise the path on CPU)")
    dtype = torch.bfloat16 if cuda else torch.float32
    h, inter, heads, kv, vocab = args.big_hidden, int(args.big_hidden * 3.5), args.big_hidden // 128, 8, 32000
    if h < 1024:  # small targets (CPU trial): keep head_dim 64
        heads, kv, inter = max(1, h // 64), max(1, h // 64), int(h * 3.5)
    kv = min(kv, heads)
    bpe = torch.finfo(dtype).bits // 8
    per_layer = (2 * h * h + 2 * h * (h // heads) * kv + 3 * h * inter + 2 * h) * bpe
    embed = 2 * vocab * h * bpe
    layers = max(1, math.ceil((target - embed) / per_layer))
    cfg = LlamaConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=args.big_seq_len)
    path = os.path.join(tmp, "big")
    t0 = time.time()
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(path)
    del model
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    build_s = time.time() - t0
    share = (f" = {100 * weight_bytes / torch.cuda.get_device_properties(0).total_memory:.0f}% of GPU 0's memory"
             if cuda else "")
    print(f"  large model: {layers} layers, hidden {h}, {weight_bytes / 2**30:.2f} GiB of weights{share}, "
          f"built and saved in {build_s:.0f} s", flush=True)
    summary = run_scan(ScanConfig(model_dir=path, out=os.path.join(tmp, "bigrun"), data="random",
                                  seq_len=args.big_seq_len, num_seqs=args.big_num_seqs, batch_size=1,
                                  figures=False, device="cuda" if cuda else "cpu",
                                  dtype="bf16" if cuda else "fp32", device_map="auto"), progress=False)
    cfgj = json.load(open(os.path.join(tmp, "bigrun", "config.json")))
    res = {"layers": layers, "hidden": h, "weight_gib": weight_bytes / 2**30,
           "gpu_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
           "devices": sorted({str(v) for v in (cfgj["device_map"] or {}).values()}),
           "tokens_per_s": summary["throughput"]["tokens_per_s"], "seq_len": args.big_seq_len,
           "peak_cuda_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
    print(f"  --device-map auto over {res['devices']}: {res['tokens_per_s']:.1f} tokens/s at {args.big_seq_len} "
          f"tokens" + (f", peak GPU memory {res['peak_cuda_gib']:.1f} GiB" if cuda else ""), flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (one GPU per process)")
    ap.add_argument("--procs", default="1,2", help="process counts to compare (the first is the baseline)")
    ap.add_argument("--threads", type=int, default=1, help="threads per process (OMP_NUM_THREADS)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--num-seqs", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--big", action="store_true", help="also scan a large random model with --device-map auto")
    ap.add_argument("--big-fraction", type=float, default=0.34, help="weights / GPU 0 memory")
    ap.add_argument("--big-bytes", type=float, default=None, help="weight bytes instead of a fraction (CPU trial)")
    ap.add_argument("--big-hidden", type=int, default=4096)
    ap.add_argument("--big-seq-len", type=int, default=1024)
    ap.add_argument("--big-num-seqs", type=int, default=4)
    ap.add_argument("--json", default=_results.default_path("distributed"),
                    help="write the results here (default: benchmarks/results_distributed.json; 'none': print only)")
    args = ap.parse_args()
    args.procs = [int(p) for p in args.procs.split(",")]
    report = {"device": args.device, "threads_per_process": args.threads, "seq_len": args.seq_len,
              "num_seqs": args.num_seqs, "batch_size": args.batch_size, "model": MODEL, "load_before": load()}
    print(f"load average before: {report['load_before']} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="poslens-bench-dist-") as tmp:
        if not args.skip_scaling:
            print(f"scaling: {args.num_seqs} x {args.seq_len} tokens, batch {args.batch_size}, device {args.device}, "
                  f"{args.threads} thread(s) per process")
            report["scaling"] = run_scaling(args, tmp)
            for p, r in report["scaling"].items():
                print(f"  {p} process(es): efficiency {r['efficiency']:.2f} "
                      f"(max relative map difference vs {args.procs[0]}: {r['max_rel_diff_vs_first']:.1e})")
        if args.big:
            report["big_model"] = run_big(args, tmp)
    report["load_after"] = load()
    print(f"load average after: {report['load_after']}")
    if _results.wanted(args.json):
        with open(args.json, "w") as f:
            json.dump({**_results.meta(), **report}, f, indent=2)


if __name__ == "__main__":
    main()
