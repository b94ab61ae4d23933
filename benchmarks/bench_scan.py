"""Benchmark: poslens capture vs the papers' approach (eager attention with output_attentions=True).

Same model, same data, same run. Each method runs in its own fresh subprocess so peak memory is
its own (CPU: peak RSS from getrusage, and the increase over the RSS after loading the model;
CUDA: torch.cuda.max_memory_allocated). Both methods compute the same results: mean
pre-softmax scores and attention weights per layer, per-head slash profiles and hidden-state
self-cosine maps.

- ``eager``: the papers' approach. Attention runs through transformers' eager code with
  ``output_attentions=True`` (batch x heads x S^2 per layer kept) and, as their patched
  ``eager_attention_forward`` did, the pre-softmax scores are kept too (a registered function that
  runs the eager computation and stores the scores); means and slash profiles are taken afterwards.
- ``poslens``: the registered poslens attention function with streaming accumulators.
- ``sdpa``: the plain forward without capture, to report the fraction of forward cost capture adds.

Usage::

    python benchmarks/bench_scan.py                 # 1,024-token comparison + 4,096-token run (CPU)
    python benchmarks/bench_scan.py --device cuda   # the same on a GPU (tokens/s, capture overhead)

The 4,096-token part runs poslens under an address-space cap and the eager approach under the
same cap (it must fail: its attention tensors alone exceed the cap; the script prints how much
memory they need by construction). Ratios measured in the same run are what count: the machine
may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PRESETS = {
    # 1,024 tokens: a small Llama-architecture model (random weights)
    "small": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=8, vocab_size=8192),
    # more heads per layer (32 x head_dim 32): attention's share of the forward and eager's B x H x S^2 grow
    "heads32": dict(hidden_size=1024, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=8192),
    # per-layer shapes of real models (few layers: throughput ratios are per layer; eager's memory grows with L)
    "gpt2-shape": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=12,
                       num_key_value_heads=12, vocab_size=8192),
    "llama1b-shape": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
                          num_key_value_heads=8, vocab_size=8192),
    # 4,096 tokens: few layers, many heads, so eager's B x H x S^2 tensors exceed the machine's memory
    "wide": dict(hidden_size=2048, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=64,
                 num_key_value_heads=16, vocab_size=8192),
}


def build_model(preset: str, path: str, max_pos: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(**PRESETS[preset], max_position_embeddings=max_pos)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------------
# worker (one method, fresh process)
# ------------------------------------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args) -> dict:
    import resource

    import torch

    if args.cap_gb:
        cap = int(args.cap_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    torch.set_num_threads(args.threads)
    from poslens.capture.sources import make_source

    src = make_source("random", seq_len=args.seq_len, num_seqs=args.batch_size * (args.batches + 1), seed=0,
                      vocab_size=PRESETS[args.preset]["vocab_size"])
    dev = args.device
    cuda = dev.startswith("cuda")
    dtype = torch.float32 if not cuda else torch.bfloat16
    out = {"method": args.method, "seq_len": args.seq_len, "batch_size": args.batch_size, "device": dev}
    try:
        run = {"eager": _run_eager, "poslens": _run_poslens, "sdpa": _run_sdpa}[args.method]
        step, finish = run(args.model, dtype, dev)
        step(src.batch(0, args.batch_size).to(dev))  # warm-up batch (not timed)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        rss_loaded = _rss_mb()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for b in range(1, args.batches + 1):
            step(src.batch(b * args.batch_size, (b + 1) * args.batch_size).to(dev))
        finish()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        tokens = args.batches * args.batch_size * args.seq_len
        # tokens per CPU-second: robust to other jobs on a shared machine (exact with --threads 1;
        # with more threads it also counts the OpenMP workers' spin-waiting)
        out.update(ok=True, seconds=dt, tokens_per_s=tokens / dt, cpu_seconds=cpu, tokens_per_cpu_s=tokens / cpu,
                   peak_rss_mb=_peak_rss_mb(), rss_loaded_mb=rss_loaded)
        if cuda:
            out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    except (MemoryError, RuntimeError) as e:
        out.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", peak_rss_mb=_peak_rss_mb())
    return out


def _run_sdpa(model_dir, dtype, dev):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(dev).eval()

    def step(ids):
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    return step, lambda: None


def _run_poslens(model_dir, dtype, dev):
    import torch
    from transformers import AutoConfig

    from poslens.capture.attention import Capture, CaptureSpec
    from poslens.capture.scan import attach, load_model
    from poslens.capture.adapters import get_adapter

    config = AutoConfig.from_pretrained(model_dir)
    ad = get_adapter(config)
    model = load_model(model_dir, dtype=dtype, device=dev)
    state = {}

    def step(ids):
        if "cap" not in state:
            L = ad.num_layers(config)
            spec = CaptureSpec(num_layers=L, num_heads=ad.num_heads(config), num_kv_heads=ad.num_kv_heads(config),
                               head_dim=ad.head_dim(config), seq_len=ids.shape[1], layers=list(range(L)),
                               rope_layers=ad.rope_layers(config), reservoir=256)  # as `poslens scan`
            state["cap"] = Capture(spec, device=dev)
            attach(model, ad, state["cap"])
        cap = state["cap"]
        cap.begin_batch(ids.shape[0], seq_start=state.setdefault("seen", 0))
        state["seen"] += ids.shape[0]
        with torch.no_grad(), cap.active():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        cap.end_batch()

    def finish():
        state["cap"].means()

    return step, finish


def _run_eager(model_dir, dtype, dev):
    """The papers' approach: eager attention, output_attentions, the pre-softmax scores kept.

    The recording function is transformers' ``eager_attention_forward`` with one line added, as the
    papers patched it: the scaled ``q k^T`` it computes anyway is kept (no second matmul). The
    statistics are then reduced per batch with the same arithmetic poslens uses (float32 sums over
    batch and heads, float64 accumulation; float32 Gram products), so the comparison measures the
    approach (``B x H x S^2`` tensors per layer kept by the forward), not a slower reduction.
    """
    import torch
    from torch import nn
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.llama.modeling_llama import repeat_kv

    kept_scores: list = []

    def recording_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
        key_states = repeat_kv(key, module.num_key_value_groups)
        value_states = repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        kept_scores.append(attn_weights)  # the patch: keep the pre-softmax scores
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
        return attn_output, attn_weights

    AttentionInterface.register("paper_eager", recording_eager)
    AttentionMaskInterface.register("paper_eager", eager_mask)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="paper_eager").to(dev).eval()
    sums = {}

    def add(key, v):
        sums[key] = sums.get(key, 0) + v.to(torch.float64)

    def step(ids):
        kept_scores.clear()
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=False, output_attentions=True, output_hidden_states=True,
                        logits_to_keep=1)
            S = ids.shape[1]
            causal = torch.ones(S, S, dtype=torch.bool, device=ids.device).tril()
            for l, a in enumerate(out.attentions):
                a = a.float()
                H = a.shape[1]
                add(("scores", l), (kept_scores[l].float().sum((0, 1)) * causal) / H)
                pb = a.sum(0)  # [H, S, S]
                add(("probs", l), pb.sum(0) / H)
                add(("slash", l), torch.stack([torch.diagonal(pb, -d, 1, 2).sum(-1) / (S - d) for d in range(S)], -1))
            for l, h in enumerate(out.hidden_states):
                h = h.float()
                hn = h / h.norm(dim=-1, keepdim=True)
                add(("cosine", l), torch.bmm(hn, hn.transpose(1, 2)).sum(0))
                add(("norms", l), h.norm(dim=-1).sum(0))
        kept_scores.clear()

    return step, lambda: None


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------
def _ratios(rows: dict, device: str) -> dict | None:
    e, p, s = rows["eager"], rows["poslens"], rows["sdpa"]
    if not (e.get("ok") and p.get("ok")):
        return None
    r = {
        "throughput_x": p["tokens_per_s"] / e["tokens_per_s"],
        "peak_rss_x": e["peak_rss_mb"] / p["peak_rss_mb"],
        "peak_rss_above_loaded_x": (e["peak_rss_mb"] - e["rss_loaded_mb"]) / max(1.0, p["peak_rss_mb"] - p["rss_loaded_mb"]),
        "capture_overhead_vs_sdpa": (s["tokens_per_s"] / p["tokens_per_s"] - 1.0) if s.get("ok") else None,
        "cpu_throughput_x": p["tokens_per_cpu_s"] / e["tokens_per_cpu_s"],
        "cpu_capture_overhead_vs_sdpa": (s["tokens_per_cpu_s"] / p["tokens_per_cpu_s"] - 1.0) if s.get("ok") else None,
        # the ceiling: even free capture cannot beat the plain forward it observes
        "ceiling_throughput_x": (s["tokens_per_s"] / e["tokens_per_s"]) if s.get("ok") else None,
        "ceiling_cpu_throughput_x": (s["tokens_per_cpu_s"] / e["tokens_per_cpu_s"]) if s.get("ok") else None,
    }
    if device.startswith("cuda"):
        r["peak_cuda_x"] = e["peak_cuda_mb"] / p["peak_cuda_mb"]
    return r


def _table(results: dict) -> str:
    """One line per model: the ratios that the targets are about."""
    head = f"{'model':<15}{'heads':>6}{'poslens/eager':>15}{'ceiling':>9}{'capture':>9}{'peak mem':>10}{'above model':>13}"
    lines = [head]
    for name, entry in results.get("short", {}).items():
        r = entry.get("ratios")
        if not r:
            lines.append(f"{name:<15}  (a run failed: see the JSON lines)")
            continue
        ov = r["capture_overhead_vs_sdpa"]
        lines.append(f"{name:<15}{entry['preset']['num_attention_heads']:>6}{r['throughput_x']:>14.2f}x"
                     f"{(r['ceiling_throughput_x'] or float('nan')):>8.2f}x{(ov or 0) * 100:>8.0f}%"
                     f"{r['peak_rss_x']:>9.2f}x{r['peak_rss_above_loaded_x']:>12.1f}x")
    lines.append("poslens/eager: tokens/s ratio; ceiling: plain sdpa forward / eager (no capture can exceed it); "
                 "capture: time capture adds to the plain forward; peak mem: eager / poslens peak RSS, total and "
                 "above the loaded model")
    long = results.get("long")
    if long:
        for m in ("poslens", "eager"):
            r = long[m]
            state = (f"completed, peak RSS {r['peak_rss_mb'] / 1024:.1f} GiB" if r.get("ok")
                     else f"failed ({r.get('error', '?')[:80]})")
            lines.append(f"{results.get('long_seq_len', '')} tokens, wide model, {m}: {state}")
    return "\n".join(lines)
# ------------------------------------------------------------------------------------------------
def run_worker(method, model, preset, seq_len, batch_size, batches, device, threads, cap_gb=None) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--model", model, "--preset", preset, "--seq-len",
           str(seq_len), "--batch-size", str(batch_size), "--batches", str(batches), "--device", device,
           "--threads", str(threads)]
    if cap_gb:
        cmd += ["--cap-gb", str(cap_gb)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"method": method, "ok": False, "error": f"worker exited {p.returncode}: {p.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=["eager", "poslens", "sdpa"])
    ap.add_argument("--model")
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cap-gb", type=float, default=None)
    ap.add_argument("--long-seq-len", type=int, default=4096)
    ap.add_argument("--long-cap-gb", type=float, default=12.0,
                    help="address-space cap for the long-sequence runs (keeps the failing eager run from "
                         "taking the whole machine)")
    ap.add_argument("--skip-long", action="store_true")
    ap.add_argument("--short-presets", default="heads32,gpt2-shape,llama1b-shape,small",
                    help="comma-separated models for the three-way comparison at --seq-len (from: "
                         + ", ".join(sorted(PRESETS)) + "); the first is also used for --sweep-batches")
    ap.add_argument("--sweep-batches", default="",
                    help="comma-separated batch sizes: also run poslens and eager at each (1 timed batch) and "
                         "report peak RSS above the loaded model, to show how memory grows with batch x heads")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.worker:
        args.method = args.worker
        print(json.dumps(worker(args)))
        return

    results = {"device": args.device, "threads": args.threads, "cpu_count": os.cpu_count()}
    presets = [p.strip() for p in args.short_presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        ap.error(f"--short-presets: unknown {unknown}; choose from {sorted(PRESETS)}")
    with tempfile.TemporaryDirectory() as tmp:
        results["short"] = {}
        for sp in presets:
            path = build_model(sp, os.path.join(tmp, sp), 8192)
            rows = {}
            for method in ("sdpa", "poslens", "eager"):
                rows[method] = run_worker(method, path, sp, args.seq_len, args.batch_size, args.batches, args.device,
                                          args.threads)
                print(json.dumps({"preset": sp, **rows[method]}), flush=True)
            entry = {"preset": dict(PRESETS[sp]), "runs": rows, "ratios": _ratios(rows, args.device)}
            results["short"][sp] = entry
            print(json.dumps({"preset": sp, "ratios": entry["ratios"]}), flush=True)
        sp = presets[0]
        first = os.path.join(tmp, sp)

        if args.sweep_batches:
            sweep = []
            for bs in [int(b) for b in args.sweep_batches.split(",")]:
                row = {"batch_size": bs}
                for method in ("poslens", "eager"):
                    r = run_worker(method, first, sp, args.seq_len, bs, 1, args.device, args.threads)
                    row[method] = r
                    print(json.dumps(r), flush=True)
                if row["poslens"].get("ok") and row["eager"].get("ok"):
                    pe, ee = row["poslens"], row["eager"]
                    row["above_loaded_mb"] = {m: row[m]["peak_rss_mb"] - row[m]["rss_loaded_mb"] for m in ("poslens", "eager")}
                    row["peak_rss_x"] = ee["peak_rss_mb"] / pe["peak_rss_mb"]
                    row["throughput_x"] = pe["tokens_per_s"] / ee["tokens_per_s"]
                    row["cpu_throughput_x"] = pe["tokens_per_cpu_s"] / ee["tokens_per_cpu_s"]
                sweep.append(row)
            results["sweep"] = sweep

        if not args.skip_long:
            wide = build_model("wide", os.path.join(tmp, "wide"), 8192)
            cfgw = PRESETS["wide"]
            need = cfgw["num_hidden_layers"] * cfgw["num_attention_heads"] * args.long_seq_len**2 * 4 * 2 / 2**30
            results["long_eager_attention_tensors_gib"] = need
            results["long_seq_len"] = args.long_seq_len
            long = {}
            for method in ("poslens", "eager"):
                long[method] = run_worker(method, wide, "wide", args.long_seq_len, 1, 1, args.device, args.threads,
                                          cap_gb=args.long_cap_gb if not args.device.startswith("cuda") else None)
                print(json.dumps(long[method]), flush=True)
            results["long"] = long
    print(json.dumps(results, indent=1))
    print(_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
