"""Benchmark: what capture costs over the forward it observes, and against the papers' approach.

For each model, five methods run on the same random tokens, each in its own fresh subprocess (so
its peak RSS is its own), one thread by default. ``sdpa`` and both ``poslens`` rows run under the
allocator settings the CLI makes (``poslens.runtime.configure_allocator``: freed memory reused, not
unmapped), so the floor and the capture run alike; ``sdpa:system-malloc`` and ``eager`` run under
glibc's defaults, as a plain transformers process does. Each process first runs one full batch,
untimed (first-call costs, and every buffer and heap page at its size for the timed batches):

- ``sdpa``: the plain ``sdpa`` forward without capture: the floor no capture can beat;
- ``sdpa:system-malloc``: the same under glibc's default allocator settings (a plain transformers
  process), to show what the allocator settings alone change;
- ``poslens scores,probs``: ``--stats scores,probs`` (the mean score and weight maps);
- ``poslens all``: every statistic, with the ``--reservoir 256`` sample, as a default ``poslens scan``;
- ``poslens.scan() all``: the whole call a Python user makes, ``poslens.scan(model_dir, data=tokens)``
  with every statistic on the timed batches' tokens: the model loaded from its directory, the
  capture loop, the summary's readings and the run directory written (``finalize``, whose CPU time
  is also given apart, "final s"), figures off, under glibc's default allocator settings as in any
  Python process (the library leaves the allocator alone). Its process runs no warm-up batch: a
  user's call pays its first-call costs. The model's transformers code is imported before the
  timing, as the floor's process imports it before its own (a cost of any transformers model, once
  per process; its CPU time is printed beside the ratio);
- ``eager``: the papers' approach: eager attention with ``output_attentions=True`` (``B x H x S^2``
  per layer kept by the forward) and the pre-softmax scores kept as their patched
  ``eager_attention_forward`` did, reduced per batch to the same maps with the same arithmetic.

Models: the benchmark model (random-init Llama: 4 layers, hidden 512, 8 heads x 64, MLP
1,408, 40 x 1,024 tokens in batches of 20, fp32) and SmolLM2-135M (30 layers, 9 heads, 3 KV heads)
at 8 x 1,024 tokens in batches of 4, from the dequantised GGUF cache (``--smollm DIR``; skipped
when absent).

The poslens rows use the fused CPU kernels (:mod:`poslens.native`) where they build (the run prints
which, and ``cpu_kernels`` in the results file records it); ``POSLENS_CAPTURE_KERNEL=torch`` measures
the torch path instead.

Times are the process's CPU time (user + sys, ``getrusage``) over the timed batches, which on a
one-thread run is the work done whatever else the machine runs; wall time is printed beside it.
What a scan does once at its end, whatever its length (reading the means out of the float64 sums,
as ``release_means`` does for the scan's finalize), is timed apart ("final s").
Overhead = CPU time over the ``sdpa`` row's minus 1; "vs eager" = eager's CPU time / the row's;
sys share = sys / (user + sys). Below the table, each model's whole ``poslens.scan()`` call is given
as a ratio to the plain forward of the same tokens under the same allocator settings (the
``sdpa:system-malloc`` row, else ``sdpa``), with finalize's share of the call and both sys shares;
``--whole-call`` adds SmolLM2 at more lengths with these two rows alone (by default 16 x 256 and
2 x 4,096 tokens, the latter with ``--map-size 1024``), so the whole call is paired with its floor at
256, 1,024 and 4,096 tokens in one run. Usage::

    python benchmarks/bench_scan.py                     # both models (about 15 minutes on an idle 2-core CPU)
    python benchmarks/bench_scan.py --no-smollm         # the benchmark model only
    python benchmarks/bench_scan.py --json out.json     # every number elsewhere (default: benchmarks/results_scan.json)
    python benchmarks/bench_scan.py --interleaved 8     # also the paired in-process measurement
    python benchmarks/bench_scan.py --no-smollm --seq-len 256 --bench-batch 4x2 --json none  # a quick look

``--interleaved N`` adds a second measurement per model: the floor and both poslens rows in ONE
process, batch after batch on the same tokens (N rounds, the order reversed every other round,
each method warmed up on one full batch first). On a shared virtual machine a fixed workload's CPU
time moves by about 10 % from minute to minute and from process to process, so a ratio of two processes a
minute apart carries that noise; pairs of batches seconds apart and on the same tokens carry less
of it. Its table gives each row's CPU time per batch (median), the overhead as the ratio of the
rounds' totals, the median and range of the per-round ratios, the ratio of the fastest rounds
(the least disturbed by other work on the host), and the same at a finer grain: each decoder
layer's fastest round (thread CPU time, the capture's work for that layer included), summed with
the fastest round of the rest of the batch ("fastest layers"). Noise from the host only adds time,
and a layer call lasts a fraction of a second, so its minimum over the rounds is far less
disturbed than a whole batch's; it is an estimate for a quiet host, printed beside the totals.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

BENCH = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=8, vocab_size=8192)
METHODS = ("sdpa", "sdpa:system-malloc", "poslens:scores,probs", "poslens:all", "scan:all", "eager")
#: the row of one whole ``poslens.scan()`` call (model loading, capture loop, finalize, run directory)
WHOLE_CALL = "scan:all"
#: the floor again under glibc's default allocator settings; ``sdpa`` and ``poslens`` run under the
#: CLI's (``poslens.runtime.configure_allocator``), as ``poslens scan`` does
SYSTEM_MALLOC = "sdpa:system-malloc"
#: methods run under glibc's defaults: the second floor, the papers' approach as a plain process
#: runs it, and the whole ``poslens.scan()`` call as a Python process makes it (the library leaves the
#: allocator alone; the CLI sets it) (under the CLI's settings its many differently sized B x H x S^2 tensors fragment the
#: heap that is never trimmed: peak RSS 11.4 GB instead of 6.7 GB on the benchmark model, 20 GB
#: instead of 11 GB on SmolLM2)
SYSTEM_MALLOC_METHODS = (SYSTEM_MALLOC, "eager", WHOLE_CALL)


def build_bench_model(path: str) -> str:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**BENCH, max_position_embeddings=4096)).save_pretrained(path)
    return path


def find_smollm() -> str | None:
    """The dequantised SmolLM2-135M directory in the GGUF cache (a llama config with 30 layers), if any."""
    for d in sorted(glob.glob(os.path.expanduser("~/.cache/poslens/gguf/*/"))):
        try:
            with open(os.path.join(d, "config.json")) as f:
                c = json.load(f)
        except (OSError, ValueError):
            continue
        if c.get("model_type") == "llama" and c.get("num_hidden_layers") == 30 and c.get("hidden_size") == 576:
            return d
    return None


# ------------------------------------------------------------------------------------------------
# worker (one method, fresh process)
# ------------------------------------------------------------------------------------------------
def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args) -> dict:
    import resource

    from poslens.runtime import configure_allocator

    malloc = "system" if args.worker in SYSTEM_MALLOC_METHODS else ("poslens" if configure_allocator() else "system")
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoConfig

    from poslens.data.sources import make_source

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    B, nb = args.batch_size, args.batches
    src = make_source("random", seq_len=args.seq_len, num_seqs=args.warmup + B * nb, seed=0, vocab_size=vocab)
    dev = args.device
    cuda = dev.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    out = {"method": args.worker, "seq_len": args.seq_len, "batch_size": B, "batches": nb, "threads": args.threads,
           "malloc": malloc}
    try:
        kind, _, stats = args.worker.partition(":")
        if kind == "scan":
            out.update(_whole_call(args, src, stats), peak_rss_mb=_peak_rss_mb(), tokens=B * nb * args.seq_len)
            return out
        run = {"eager": _run_eager, "poslens": _run_poslens, "sdpa": _run_sdpa}[kind]
        step, finish = run(args.model, dtype, dev, stats or None)
        step(src.batch(0, args.warmup).to(dev))  # warm-up (not timed): first-call costs, buffers
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for b in range(nb):
            s = args.warmup + b * B
            step(src.batch(s, s + B).to(dev))
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        finish()  # once per scan, whatever its length: timed apart from the batches
        if cuda:
            torch.cuda.synchronize()
        ru2 = resource.getrusage(resource.RUSAGE_SELF)
        user, sys_ = ru1.ru_utime - ru0.ru_utime, ru1.ru_stime - ru0.ru_stime
        fin = (ru2.ru_utime - ru1.ru_utime) + (ru2.ru_stime - ru1.ru_stime)
        out.update(ok=True, wall_s=wall, cpu_s=user + sys_, user_s=user, sys_s=sys_, finish_cpu_s=fin,
                   peak_rss_mb=_peak_rss_mb(), tokens=B * nb * args.seq_len)
        if cuda:
            out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    except (MemoryError, RuntimeError) as e:
        out.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", peak_rss_mb=_peak_rss_mb())
    return out


def _cpu_s(ru) -> float:
    return ru.ru_utime + ru.ru_stime


def _whole_call(args, src, stats: str) -> dict:
    """One ``poslens.scan()`` call from Python on the timed batches' tokens, as a user makes it (the
    model given by its directory, figures off, the run directory in a temporary folder): its wall and
    CPU time (user + sys, ``getrusage``), and those of ``finalize`` within it, timed by wrapping the
    scan module's ``finalize`` (None where the module has none)."""
    import resource

    import poslens
    from poslens.capture.scan import run as scan_module

    B, nb = args.batch_size, args.batches
    tokens = src.batch(args.warmup, args.warmup + B * nb)
    fin: dict = {}
    inner = getattr(scan_module, "finalize", None)

    def timed_finalize(*a, **kw):
        ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            fin.update(finish_cpu_s=_cpu_s(ru1) - _cpu_s(ru0), finish_wall_s=time.perf_counter() - t0)

    # the model's code imported first, untimed, as the floor's process imports it before its timing:
    # transformers' modeling modules pull in torch._dynamo, torch.distributed.tensor and sympy (about
    # 2-4 CPU-s), a cost of any transformers model, once per process (recorded apart: import_cpu_s)
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    ru_i = resource.getrusage(resource.RUSAGE_SELF)
    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(args.model))]
    imported = _cpu_s(resource.getrusage(resource.RUSAGE_SELF)) - _cpu_s(ru_i)
    if inner is not None:
        scan_module.finalize = timed_finalize
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            poslens.scan(args.model, data=tokens, batch_size=B, stats=stats or "all", device=args.device,
                         out=os.path.join(tmp, "run"), figures=False, progress=False, threads=args.threads,
                         map_size=args.map_size if args.map_size < args.seq_len else 0)
            wall = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        if inner is not None:
            scan_module.finalize = inner
    user, sys_ = ru1.ru_utime - ru0.ru_utime, ru1.ru_stime - ru0.ru_stime
    return {"ok": True, "wall_s": wall, "cpu_s": user + sys_, "user_s": user, "sys_s": sys_,
            "finish_cpu_s": fin.get("finish_cpu_s"), "finish_wall_s": fin.get("finish_wall_s"), "import_cpu_s": imported}


def _run_sdpa(model_dir, dtype, dev, stats):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(dev).eval()

    def step(ids):
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    step.model = model
    return step, lambda: None


def _run_poslens(model_dir, dtype, dev, stats):
    """As ``poslens scan --stats STATS`` drives it: the registered attention, the capture attached, one
    forward per batch (the scan's own bookkeeping, checkpoints and summary are not timed)."""
    import torch
    from transformers import AutoConfig

    from poslens.capture.engine.capture import Capture
    from poslens.capture.engine.spec import CaptureSpec
    from poslens.capture.model.load import load_model
    from poslens.capture.engine.loop import attach
    from poslens.capture.model.adapters import get_adapter
    from poslens.capture.engine.spec import parse_stats
    from poslens.capture.engine.loop import forward, forward_kwargs

    config = AutoConfig.from_pretrained(model_dir)
    ad = get_adapter(config)
    model = load_model(model_dir, dtype=dtype, device=dev)
    kw = forward_kwargs(model)
    state = {}

    def step(ids):
        if "cap" not in state:  # the capture of the first (warm-up) batch is discarded
            L = ad.num_layers(config)
            spec = CaptureSpec(num_layers=L, num_heads=ad.num_heads(config), num_kv_heads=ad.num_kv_heads(config),
                               head_dim=ad.head_dim(config), seq_len=ids.shape[1], layers=list(range(L)),
                               rope_layers=ad.rope_layers(config), reservoir=256, stats=parse_stats(stats),
                               rope_layout=ad.rope_layout)
            state["cap"] = Capture(spec, device=dev)
            attach(model, ad, state["cap"])
        forward(model, ids, capture=state["cap"], kwargs=kw)

    step.model = model
    return step, lambda: state["cap"].release_means(torch.float32)  # as the scan's finalize reads them


def _run_eager(model_dir, dtype, dev, stats):
    """The papers' approach: eager attention, output_attentions, the pre-softmax scores kept.

    The recording function is transformers' ``eager_attention_forward`` with one line added, as the
    papers patched it: the scaled ``q k^T`` it computes anyway is kept (no second matmul). The maps
    (scores, probs, slash profiles, hidden-state cosine maps and norms) are then reduced per batch
    with poslens's arithmetic (float32 sums, float64 accumulation), so the comparison measures the
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
#: the rows of the interleaved measurement (one process, batch by batch)
INTERLEAVED = ("sdpa", "poslens:scores,probs", "poslens:all")


def _layer_clocks(model, sink: list) -> list:
    """Thread CPU time of every decoder layer call appended to ``sink[i]``. Registered after the
    capture's own hooks (the warm-up batch attached them), first among the pre-hooks and last among
    the post-hooks, so a layer's time holds the capture's work for it: its attention statistics and
    its residual-stream cosines (layer 0's also the embeddings')."""
    import time

    handles = []
    for i, layer in enumerate(model.model.layers):
        t0 = [0.0]

        def pre(mod, args, t0=t0):
            t0[0] = time.thread_time()

        def post(mod, args, out, i=i, t0=t0):
            sink[i].append(time.thread_time() - t0[0])

        handles.append(layer.register_forward_pre_hook(pre, prepend=True))
        handles.append(layer.register_forward_hook(post))
    return handles


def interleaved_worker(args) -> dict:
    """The floor and both poslens rows in one process: per round, one batch of the same tokens
    through each (order reversed every other round), CPU time of each step (``getrusage``), and of
    each decoder layer in it (:func:`_layer_clocks`)."""
    import resource

    from poslens.runtime import configure_allocator

    malloc = "poslens" if configure_allocator() else "system"
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoConfig

    from poslens.data.sources import make_source

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    B, rounds = args.batch_size, args.batches
    src = make_source("random", seq_len=args.seq_len, num_seqs=B * (rounds + 1), seed=0, vocab_size=vocab)
    runs = {}
    for m in INTERLEAVED:
        kind, _, stats = m.partition(":")
        runs[m] = {"poslens": _run_poslens, "sdpa": _run_sdpa}[kind](args.model, torch.float32, "cpu", stats or None)
    for m in INTERLEAVED:  # warm-up on one full batch each (buffers at their size; not timed)
        runs[m][0](src.batch(0, B))
    layers = {m: [[] for _ in runs[m][0].model.model.layers] for m in INTERLEAVED}
    for m in INTERLEAVED:
        _layer_clocks(runs[m][0].model, layers[m])
    cpu = {m: [] for m in INTERLEAVED}
    for r in range(rounds):
        ids = src.batch(B * (r + 1), B * (r + 2))
        for m in (INTERLEAVED if r % 2 == 0 else INTERLEAVED[::-1]):
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            runs[m][0](ids)
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu[m].append((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime))
    return {"method": "interleaved", "ok": True, "batch_size": B, "rounds": rounds, "threads": args.threads,
            "malloc": malloc, "cpu_s": cpu, "layer_cpu_s": layers}


def fastest_parts(cpu: list, layers: list) -> float:
    """A row's CPU time per batch from its least disturbed parts: each decoder layer's fastest round,
    summed, plus the fastest round of the rest of the batch (embedding lookup, final norm, logits)."""
    rest = [t - sum(lay[r] for lay in layers) for r, t in enumerate(cpu)]
    return sum(min(lay) for lay in layers) + min(rest)


def interleaved_table(results: list[dict]) -> str:
    """Per model and row: median CPU s per batch, the overhead as the ratio of the rounds' totals
    (minus 1), the median per-round ratio, the ratio of the fastest rounds and the range."""
    head = (f"{'model':<26}{'method':<22}{'CPU s/batch':>12}{'over sdpa (totals)':>20}{'median round':>14}"
            f"{'fastest':>9}{'fastest layers':>16}{'range':>16}")
    lines = [head, "-" * len(head)]
    for e in results:
        r = e.get("interleaved")
        if not r:
            continue
        if not r.get("ok"):
            lines.append(f"{e['model']:<26}  failed: {r.get('error', '?')[:80]}")
            continue
        base = r["cpu_s"]["sdpa"]
        lay = r.get("layer_cpu_s")
        base_parts = fastest_parts(base, lay["sdpa"]) if lay else None
        for m in INTERLEAVED:
            ts = r["cpu_s"][m]
            name = "sdpa (floor)" if m == "sdpa" else m.replace(":", " ")
            ratios = [100 * (t / b - 1) for t, b in zip(ts, base)]
            tot = 100 * (sum(ts) / sum(base) - 1)
            fastest = 100 * (min(ts) / min(base) - 1)
            parts = f"{100 * (fastest_parts(ts, lay[m]) / base_parts - 1):>+15.1f}%" if lay else f"{'-':>16}"
            lines.append(f"{e['model']:<26}{name:<22}{_median(ts):>12.2f}{tot:>+19.1f}%{_median(ratios):>+13.1f}%"
                         f"{fastest:>+8.1f}%{parts}{min(ratios):>+8.0f} … {max(ratios):+.0f}")
    lines.append("One process per model, batch after batch on the same tokens (each round: one batch through every "
                 "row, order reversed every other round); CPU s/batch: median user + sys of one batch; over sdpa "
                 "(totals): the row's CPU time summed over the rounds over the floor's, minus 1; median round / "
                 "range: the per-round ratios; fastest: the row's fastest round over the floor's fastest, minus 1 "
                 "(noise from other work on the host only adds time, so the fastest rounds are the least "
                 "disturbed; an estimate for a quiet host, not a bound); fastest layers: the same at a finer "
                 "grain, each decoder layer's fastest round (thread CPU time, the capture's work for the layer "
                 "included) summed with the fastest round of the rest of the batch, over the floor's.")
    return "\n".join(lines)


def run_worker(method, model, seq_len, batch_size, batches, warmup, device, threads, map_size: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--model", model, "--seq-len", str(seq_len),
           "--batch-size", str(batch_size), "--batches", str(batches), "--warmup", str(warmup), "--device", device,
           "--threads", str(threads), "--map-size", str(map_size)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"method": method, "ok": False, "error": f"worker exited {p.returncode}: {p.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def _median(v: list[float]) -> float:
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def table(results: list[dict]) -> str:
    """One table: per model, the floor (sdpa), poslens with two statistic sets, and eager. With several
    rounds (``--repeats``) each number is the median over rounds, and the overhead is the median of the
    per-round ratios (each run over the floor of its own round), its range beside it."""
    rounds_n = max(len(e["rounds"]) for e in results) if results else 1
    head = (f"{'model':<26}{'method':<22}{'CPU s':>8}{'wall s':>8}{'over sdpa':>10}"
            + (f"{'range':>14}" if rounds_n > 1 else "") + f"{'vs eager':>9}{'peak RSS':>10}{'sys/CPU':>8}"
            + f"{'final s':>8}")
    lines = [head, "-" * len(head)]
    for entry in results:
        rounds = [{r["method"]: r for r in runs} for runs in entry["rounds"]]
        for m in METHODS:
            rs = [rd[m] for rd in rounds if m in rd]
            if not rs:
                continue
            name = {"sdpa": "sdpa (floor)", "eager": "eager attentions", SYSTEM_MALLOC: "sdpa, glibc malloc",
                    WHOLE_CALL: "poslens.scan() all"}.get(m, m.replace(":", " "))
            ok = [r for r in rs if r.get("ok")]
            if not ok:
                lines.append(f"{entry['model']:<26}{name:<22}  failed: {rs[0].get('error', '?')[:60]}")
                continue
            # paired per round: the row's CPU time over the floor's (and eager's over the row's) of the same round
            over = [100 * (rd[m]["cpu_s"] / rd["sdpa"]["cpu_s"] - 1) for rd in rounds
                    if rd.get(m, {}).get("ok") and rd.get("sdpa", {}).get("ok")]
            vs = [rd["eager"]["cpu_s"] / rd[m]["cpu_s"] for rd in rounds
                  if rd.get(m, {}).get("ok") and rd.get("eager", {}).get("ok")]
            cpu, wall = _median([r["cpu_s"] for r in ok]), _median([r["wall_s"] for r in ok])
            rss = _median([r["peak_rss_mb"] for r in ok]) / 1024
            sys_share = _median([100 * r["sys_s"] / r["cpu_s"] for r in ok])
            over_s = f"{_median(over):+.0f} %" if over else "-"
            span = (f"{min(over):+.0f} … {max(over):+.0f}" if len(over) > 1 else "") if rounds_n > 1 else None
            vs_s = f"{_median(vs):.2f}x" if vs else "-"
            fin = [r["finish_cpu_s"] for r in ok
                   if r.get("finish_cpu_s") is not None and m.startswith(("poslens", "scan"))]
            fin_s = f"{_median(fin):.2f}" if fin else "-"
            lines.append(f"{entry['model']:<26}{name:<22}{cpu:>8.1f}{wall:>8.1f}{over_s:>10}"
                         + (f"{span:>14}" if span is not None else "") + f"{vs_s:>9}{rss:>8.2f} G{sys_share:>7.1f}%"
                         + f"{fin_s:>8}")
    lines.append("CPU s: user + sys of the timed batches (threads: see header); over sdpa: CPU time over the plain "
                 "forward's under the CLI's allocator settings (the 'glibc malloc' and eager rows run under glibc's "
                 "defaults, so theirs include what the settings save the floor); vs "
                 "eager: eager's CPU time / the row's (throughput ratio); peak RSS of the whole process; sys/CPU: "
                 "share of CPU time spent in the kernel (page faults of large temporaries); final s: CPU time of "
                 "the means read once at the end of a scan, whatever its length (not in CPU s); for "
                 "poslens.scan(), the whole call from Python (model loading, capture, finalize, run directory; no "
                 "warm-up batch), its final s the finalize within it (in CPU s)."
                 + (f" {rounds_n} rounds: medians; over sdpa and vs eager paired within each round (methods in "
                    "alternating order), range = the rounds' lowest and highest overhead." if rounds_n > 1 else ""))
    lines += whole_call_lines(results)
    lines += memory_lines(results)
    return "\n".join(lines)


def memory_lines(results: list[dict]) -> list[str]:
    """Per model with an eager row: eager's peak RSS over the scan's (the loop, ``poslens all``, and the
    whole call), beside eager's over the plain forward's under the same allocator settings: no capture
    runs below the forward it observes, so that ratio bounds what any scan can reach (medians)."""
    lines = []
    for entry in results:
        peak: dict = {}
        for runs in entry["rounds"]:
            for r in runs:
                if r.get("ok"):
                    peak.setdefault(r["method"], []).append(r["peak_rss_mb"] / 1024)
        if "eager" not in peak:
            continue
        p = {m: _median(v) for m, v in peak.items()}
        parts = [f"{label} {p[m]:.2f} GB: eager / it = {p['eager'] / p[m]:.2f}x"
                 for m, label in (("poslens:all", "poslens all (CLI allocator)"), ("sdpa", "its floor"),
                                  (WHOLE_CALL, "poslens.scan() (glibc)"), (SYSTEM_MALLOC, "its floor"))
                 if m in p]
        lines.append(f"{entry['model']}: peak RSS, eager {p['eager']:.2f} GB; " + "; ".join(parts))
    return lines


def whole_call_lines(results: list[dict]) -> list[str]:
    """Per model: the whole ``poslens.scan()`` call's CPU time over the plain forward's of the same
    tokens under the same allocator settings (glibc's: the ``sdpa:system-malloc`` row where it ran,
    else ``sdpa``; medians over rounds, each ratio within its round), and finalize's share of the call."""
    lines = []
    for entry in results:
        rounds = [{r["method"]: r for r in runs} for runs in entry["rounds"]]
        floor = SYSTEM_MALLOC if any(rd.get(SYSTEM_MALLOC, {}).get("ok") for rd in rounds) else "sdpa"
        pairs = [(rd[WHOLE_CALL], rd[floor]) for rd in rounds
                 if rd.get(WHOLE_CALL, {}).get("ok") and rd.get(floor, {}).get("ok")]
        if not pairs:
            continue
        ratio = _median([c["cpu_s"] / f["cpu_s"] for c, f in pairs])
        share = [100 * c["finish_cpu_s"] / c["cpu_s"] for c, _ in pairs if c.get("finish_cpu_s") is not None]
        fin = (f"; finalize {_median([c['finish_cpu_s'] for c, _ in pairs if c.get('finish_cpu_s') is not None]):.2f} s"
               f" CPU, {_median(share):.1f} % of the call") if share else ""
        imp = [c["import_cpu_s"] for c, _ in pairs if c.get("import_cpu_s") is not None]
        imp = f"; the model's transformers code imported before it, untimed as in the floor's process: " \
              f"{_median(imp):.1f} s CPU" if imp else ""
        sys_c = _median([100 * c["sys_s"] / c["cpu_s"] for c, _ in pairs])
        sys_f = _median([100 * f["sys_s"] / f["cpu_s"] for _, f in pairs])
        maps = f" (--map-size {entry['map_size']})" if entry.get("map_size") else ""
        lines.append(f"{entry['model']}{maps}: poslens.scan() = {ratio:.2f}x the plain forward's CPU time "
                     f"({_median([c['cpu_s'] for c, _ in pairs]):.1f} s against "
                     f"{_median([f['cpu_s'] for _, f in pairs]):.1f} s, {floor} row); sys {sys_c:.1f} % of the "
                     f"call's CPU against {sys_f:.1f} % of the forward's{fin}{imp}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=METHODS + ("interleaved",), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=20, help=argparse.SUPPRESS)
    ap.add_argument("--batches", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--seq-len", default="1024",
                    help="tokens per sequence (both models); a comma-separated list runs every length in turn, "
                         "one table row group per model and length (e.g. 256,1024,4096)")
    ap.add_argument("--map-size", type=int, default=0, metavar="N",
                    help="the whole poslens.scan() call's --map-size at lengths above N (default 0: full maps)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1: CPU time is the work)")
    ap.add_argument("--bench-batch", default="20x2", help="benchmark model: BATCHxBATCHES timed (default 20x2 = 40 seqs)")
    ap.add_argument("--smollm", default=None, help="SmolLM2-135M model directory (default: found in the GGUF cache)")
    ap.add_argument("--smollm-batch", default="4x2",
                    help="SmolLM2: BATCHxBATCHES timed (default 4x2); a comma-separated list: one per --seq-len")
    ap.add_argument("--whole-call", default="256:4x4,4096:1x2", metavar="LEN:BxN,...",
                    help="SmolLM2 at more lengths, the whole poslens.scan() call and its floor only (default "
                         "256:4x4,4096:1x2, the 4,096 row with --map-size 1024 unless --map-size is given; 'none': "
                         "off); lengths also in --seq-len are skipped")
    ap.add_argument("--no-smollm", action="store_true", help="the benchmark model only")
    ap.add_argument("--no-bench-model", action="store_true", help="SmolLM2 only (the benchmark model not run)")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of every method per model, in alternating order (default 1); the table gives "
                         "medians and the overhead's range: the floor itself moves between runs")
    ap.add_argument("--interleaved", type=int, default=0, metavar="N",
                    help="also measure the floor and both poslens rows in one process, N rounds of one batch "
                         "each on the same tokens (default 0: off)")
    ap.add_argument("--json", default=_results.default_path("scan"),
                    help="write every number here (default: benchmarks/results_scan.json; 'none': print only)")
    args = ap.parse_args()
    try:
        lengths = [int(x) for x in str(args.seq_len).split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seq-len: whole numbers separated by commas, got {args.seq_len!r}")
    if not lengths or min(lengths) < 1:
        ap.error(f"--seq-len: one or more lengths of at least 1, got {args.seq_len!r}")
    args.seq_len = lengths[0]  # a worker runs one length
    if args.worker == "interleaved":
        try:
            print(json.dumps(interleaved_worker(args)))
        except (MemoryError, RuntimeError) as e:
            print(json.dumps({"method": "interleaved", "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))
        return
    if args.worker:
        print(json.dumps(worker(args)))
        return
    methods = [m.strip() for m in args.methods.split(";" if ";" in args.methods else ",")]
    methods = _join_stats(methods)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"--methods: unknown {bad}; choose from {', '.join(METHODS)}")
    if args.repeats < 1:
        ap.error(f"--repeats: must be at least 1, got {args.repeats}")
    if args.interleaved < 0:
        ap.error(f"--interleaved: must be 0 (off) or a number of rounds, got {args.interleaved}")
    if args.interleaved and args.device != "cpu":
        ap.error("--interleaved: measures CPU time, so --device cpu only")
    smollm = None if args.no_smollm else (args.smollm or find_smollm())
    if not args.no_smollm and (smollm is None or not os.path.isfile(os.path.join(smollm, "config.json"))):
        print(f"SmolLM2-135M not found ({smollm or '~/.cache/poslens/gguf'}); pass --smollm DIR or --no-smollm. "
              "Running the benchmark model only.", file=sys.stderr)
        smollm = None
    results = []
    t_start = time.time()
    from poslens import native

    print(f"bench_scan: {args.threads} thread(s), {os.cpu_count()} CPUs, device {args.device}, seq_len "
          f"{','.join(map(str, lengths))}, poslens CPU kernels: {native.status()}", flush=True)
    smollm_batches = args.smollm_batch.split(",")
    if len(smollm_batches) not in (1, len(lengths)):
        ap.error(f"--smollm-batch: one BATCHxBATCHES or one per --seq-len ({len(lengths)}), got {args.smollm_batch!r}")
    extra = _whole_call_lengths(ap, args.whole_call, lengths) if smollm else []
    with tempfile.TemporaryDirectory() as tmp:
        bench = None if args.no_bench_model else build_bench_model(os.path.join(tmp, "bench"))
        models = [(n, "bench 4L h512 8x64", bench, args.bench_batch, methods, args.map_size) for n in lengths] \
            if bench else []
        if smollm:
            models += [(n, "SmolLM2-135M", smollm, smollm_batches[i % len(smollm_batches)], methods, args.map_size)
                       for i, n in enumerate(lengths)]
            whole = [m for m in (SYSTEM_MALLOC, WHOLE_CALL) if m in methods]
            models += [(n, "SmolLM2-135M", smollm, bb, whole, args.map_size or (1024 if n > 1024 else 0))
                       for n, bb in extra if whole]
        for seq_len, base, path, bb, row_methods, map_size in models:
            name = base if len(lengths) == 1 and not extra else f"{base} @{seq_len}"
            B, nb = (int(x) for x in bb.lower().split("x"))
            warm = B  # one full batch: the timed batches find every buffer and heap page at its size
            rounds = []
            for k in range(args.repeats):
                runs = []
                for m in (row_methods if k % 2 == 0 else row_methods[::-1]):  # alternate: none always runs first
                    r = run_worker(m, path, seq_len, B, nb, warm, args.device, args.threads, map_size)
                    runs.append(r)
                    print(json.dumps({"model": name, "round": k, **r}), flush=True)
                rounds.append(runs)
            entry = {"model": name, "model_dir": path if path == smollm else "random init (BENCH)", "seq_len": seq_len,
                     "map_size": map_size if 0 < map_size < seq_len else 0,
                     "batch_size": B, "batches": nb, "runs": rounds[0], "rounds": rounds}
            if args.interleaved and row_methods is methods:
                entry["interleaved"] = run_worker("interleaved", path, seq_len, B, args.interleaved, warm,
                                                  args.device, args.threads)
                print(json.dumps({"model": name, **entry["interleaved"]}), flush=True)
            results.append(entry)
    print(f"\n{','.join(map(str, lengths))} tokens per sequence, {args.threads} thread(s); "
          f"total {time.time() - t_start:.0f} s")
    print(table(results))
    if args.interleaved:
        print()
        print(interleaved_table(results))
    if _results.wanted(args.json):
        with open(args.json, "w") as f:
            json.dump({**_results.meta(), "threads": args.threads, "seq_len": lengths[0] if len(lengths) == 1 else lengths,
                       "map_size": args.map_size, "device": args.device,
                       "cpu_count": os.cpu_count(), "cpu_kernels": native.status(), "results": results}, f, indent=1)


def _whole_call_lengths(ap, spec: str, lengths: list[int]) -> list[tuple[int, str]]:
    """``--whole-call``: ``[(length, "BxN"), ...]`` not already in ``lengths``."""
    if spec.strip().lower() in ("", "none"):
        return []
    out = []
    for part in spec.split(","):
        n, _, bb = part.strip().partition(":")
        try:
            B, nb = (int(x) for x in bb.lower().split("x"))
            n = int(n)
        except ValueError:
            ap.error(f"--whole-call: LEN:BATCHxBATCHES separated by commas (e.g. 256:4x4), got {part!r}")
        if min(n, B, nb) < 1:
            ap.error(f"--whole-call: positive numbers, got {part!r}")
        if n not in lengths:
            out.append((n, f"{B}x{nb}"))
    return out


def _join_stats(parts: list[str]) -> list[str]:
    """``poslens:scores,probs`` split at its comma by the method list: glue stat names back on."""
    out: list[str] = []
    for p in parts:
        if out and out[-1].startswith("poslens:") and p and ":" not in p and p not in METHODS:
            out[-1] += "," + p
        elif p:
            out.append(p)
    return out


if __name__ == "__main__":
    main()
