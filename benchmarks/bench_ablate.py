"""Time of ``poslens ablate`` with ``rope-off`` one layer at a time on SmolLM2 (the GGUF model) at 32 x 256
stdlib tokens, the goal being at most 5 minutes on a 2-core CPU.

Three ways to the same numbers, in one run on the same loaded model:

- **naive**: every condition runs the whole model (``replay=False``): one full forward per layer and
  batch, plus the unmodified one;
- **ours**: the layers before the ablated one replayed from the unmodified forward (the default);
- **floor**: the plain forwards ours cannot avoid, timed with no intervention and no capture: the
  unmodified forward of every batch (full logits, P), plus, per layer l, the layers from l on (the
  fraction (L - l) / L of the body, B: a plain forward that keeps one logit) and the whole LM head
  over the positions a loss reads (Hd, timed alone): ``P + B (L + 1) / 2 + L Hd``; each pass is the
  median of three rounds. The per-token losses themselves are not in the floor;
  their CPU time (the log-softmax of the plain pass's logits, once per condition) is printed apart,
  with ours over the floor plus them.

Each prints its wall and CPU time; both runs must give the same losses bit for bit; ours over the
floor is given in both. The load average before the run is printed: on a busy machine the times are
upper bounds.

**Peak memory** (``--memory``, on by default): ``poslens ablate`` and ``poslens scan`` of the same shape
(the same model, tokens, batch size and threads; the scan with its default statistics and no
figures), each the command itself in a fresh process (the CLI's allocator settings), its peak RSS
read from ``wait4``; the goal is at most 1.2 times the scan's.

    python benchmarks/bench_ablate.py                     # SmolLM2, 32 x 256, 2 threads
    python benchmarks/bench_ablate.py --num-seqs 8 --json none
    python benchmarks/bench_ablate.py --seq-len 128 --num-seqs 4 --skip-naive --json none   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

GOAL_S = 300.0
#: goals of issue 50: ours at most this many times the floor (CPU time), its peak RSS at most this many
#: times a scan's of the same shape
GOAL_FLOOR = 1.10
GOAL_MEMORY = 1.2
#: rounds of each floor pass (medians)
ROUNDS = 3


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_mb(argv: list[str]) -> float:
    """Peak RSS (MB) of one command in a fresh process (``wait4``: that process's own, not its siblings')."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-m", "poslens", *argv], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace").strip()
    p.stderr.close()
    if p.returncode:
        sys.exit(f"poslens {' '.join(argv[:1])} failed ({p.returncode}): {err.splitlines()[-1] if err else ''}")
    return ru.ru_maxrss / 1024


def memory_pair(path, args) -> tuple[float, float]:
    """Peak RSS (MB) of ``poslens ablate`` and of ``poslens scan`` of the same shape, one after the other."""
    shape = ["--seq-len", str(args.seq_len), "--num-seqs", str(args.num_seqs), "--batch-size", "4",
             "--threads", str(args.threads), "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        ablate = peak_rss_mb(["ablate", str(path), "--out", os.path.join(tmp, "ablate"), *shape])
        scan = peak_rss_mb(["scan", str(path), "--out", os.path.join(tmp, "scan"), "--no-figures", *shape])
    return ablate, scan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="a name of `poslens models list`")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--num-seqs", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-naive", action="store_true", help="time ours and the floor only")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak memory of ablate and scan")
    ap.add_argument("--json", default=_results.default_path("ablate"), help="results file ('none': no file)")
    args = ap.parse_args()

    import torch

    from poslens.analysis.ablate.config import AblateConfig
    from poslens.analysis.ablate.run import run_ablate
    from poslens.capture.model.load import load_model, load_tokenizer
    from poslens.data.sources import make_source
    from poslens.models import realmodels

    torch.set_num_threads(args.threads)
    path = realmodels.path(args.model)
    if path is None:
        sys.exit(f"{args.model} absent: run `python -m poslens models fetch`")
    load = os.getloadavg()[0]
    print(f"load average before the run: {load:.2f}")
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    tok = load_tokenizer(str(path))
    L = model.config.num_hidden_layers
    src = make_source("stdlib", seq_len=args.seq_len, num_seqs=args.num_seqs, tokenizer=tok,
                      vocab_size=model.config.vocab_size)
    ids = src.batch(0, src.num_seqs)
    cfg = dict(model_dir=str(path), interventions=["rope-off"], layers="each", figures=False)

    # scipy.stats (the paired t-tests and the false discovery rate) imported before the timing, as the model's
    # code is: a cost of the process, once (recorded apart: import_cpu_s), not of an ablation
    c = _cpu()
    import scipy.stats  # noqa: F401

    import_cpu = _cpu() - c

    def timed(**kw):
        t, c = time.perf_counter(), _cpu()
        r = run_ablate(AblateConfig(**cfg, **kw), progress=False, model=model, tokenizer=tok, data=ids)
        return r, time.perf_counter() - t, _cpu() - c

    ours, ours_s, ours_cpu = timed()
    print(f"ours  (replayed prefix {ours['summary']['replayed_prefix']}): {ours_s:.1f} s wall, {ours_cpu:.1f} s CPU "
          f"(scipy.stats imported before: {import_cpu:.1f} CPU-s)")
    from poslens.reporting.readings.ablate import ablate_readings

    for line in ablate_readings(ours["summary"]):
        print(f"  {line}")
    naive_s = naive_cpu = None
    if not args.skip_naive:
        naive, naive_s, naive_cpu = timed(replay=False)
        same = all(torch.equal(ours["tensors"][k], naive["tensors"][k]) for k in ours["tensors"])
        print(f"naive (full forwards): {naive_s:.1f} s wall, {naive_cpu:.1f} s CPU; same losses: {same}")
        if not same:
            sys.exit("the two runs disagree")
    # the floor: plain forwards of the same batches, no intervention: with every logit (P) and with one (B),
    # and the LM head alone over the positions a loss reads (Hd); medians of ROUNDS rounds in alternating
    # order (one batch's pass moves by 10-20 % from run to run, and Hd counts L times)
    head = model.get_output_embeddings()
    batches = [(s, min(ids.shape[0], s + 4)) for s in range(0, ids.shape[0], 4)]
    final = [torch.randn((e - s) * (args.seq_len - 1), head.in_features) for s, e in batches]

    def plain_pass(**kw) -> tuple[float, float]:
        t, c = time.perf_counter(), _cpu()
        with torch.no_grad():
            for s, e in batches:
                model(input_ids=ids[s:e], use_cache=False, **kw)
        return time.perf_counter() - t, _cpu() - c

    def head_pass() -> tuple[float, float]:
        t, c = time.perf_counter(), _cpu()
        with torch.no_grad():
            for h in final:
                head(h)
        return time.perf_counter() - t, _cpu() - c

    passes = {"plain": plain_pass, "body": lambda: plain_pass(logits_to_keep=1), "head": head_pass}
    timings: dict = {k: [] for k in passes}
    for r in range(ROUNDS):
        for k in (list(passes) if r % 2 == 0 else list(passes)[::-1]):
            timings[k].append(passes[k]())

    def median(k: str, i: int) -> float:
        return statistics.median(t[i] for t in timings[k])

    def floor_of(i: int) -> float:
        return median("plain", i) + median("body", i) * (L + 1) / 2 + L * median("head", i)

    plain, body, head_s = median("plain", 0), median("body", 0), median("head", 0)
    plain_cpu, body_cpu, head_cpu = median("plain", 1), median("body", 1), median("head", 1)
    floor_s, floor_cpu = floor_of(0), floor_of(1)
    print(f"floor (CPU-s, medians of {ROUNDS}): plain pass {plain_cpu:.2f}, without the LM head {body_cpu:.2f}, the LM "
          f"head alone {head_cpu:.2f}: {plain_cpu:.2f} + {body_cpu:.2f} x {(L + 1) / 2} + {L} x {head_cpu:.2f} = "
          f"{floor_cpu:.1f} s CPU ({floor_s:.1f} s wall)")
    ratio_cpu = ours_cpu / floor_cpu
    # the per-token losses, which the floor leaves out: their CPU time on the plain pass's logits, once per
    # condition and the unmodified model (L + 1 times the batches)
    from poslens.analysis.ablate.losses import token_losses

    loss_cpu = 0.0
    with torch.no_grad():
        for s in range(0, ids.shape[0], 4):
            logits = model(input_ids=ids[s:s + 4], use_cache=False).logits
            c = _cpu()
            token_losses(logits, ids[s:s + 4])
            loss_cpu += _cpu() - c
            del logits
    loss_cpu *= L + 1
    print(f"the losses alone (log-softmax over the vocabulary at every position, once per condition): "
          f"{loss_cpu:.1f} s CPU; ours / (floor + losses) = {ours_cpu / (floor_cpu + loss_cpu):.2f} CPU")
    print(f"ours / floor = {ours_s / floor_s:.2f} wall, {ratio_cpu:.2f} CPU (goal {GOAL_FLOOR:.2f}: "
          f"{'met' if ratio_cpu <= GOAL_FLOOR else 'missed'})"
          + (f", naive / ours = {naive_s / ours_s:.2f}" if naive_s else "")
          + f"; goal {GOAL_S:.0f} s: {'met' if ours_s <= GOAL_S else 'missed'}")
    mem_ablate = mem_scan = None
    if not args.no_memory:
        mem_ablate, mem_scan = memory_pair(path, args)
        print(f"peak memory (fresh CLI processes): ablate {mem_ablate / 1024:.2f} GB, scan of the same shape "
              f"{mem_scan / 1024:.2f} GB: {mem_ablate / mem_scan:.2f}x (goal {GOAL_MEMORY}: "
              f"{'met' if mem_ablate <= GOAL_MEMORY * mem_scan else 'missed'})")
    out = _results.wanted(args.json)
    if out:
        with open(out, "w") as f:
            json.dump({"meta": _results.meta(), "load_before": load, "model": args.model, "layers": L,
                       "seq_len": args.seq_len, "num_seqs": args.num_seqs, "threads": args.threads,
                       "ours_s": ours_s, "ours_cpu_s": ours_cpu, "naive_s": naive_s, "naive_cpu_s": naive_cpu,
                       "plain_pass_s": plain, "body_pass_s": body, "head_pass_s": head_s, "head_pass_cpu_s": head_cpu,
                       "floor_s": floor_s, "goal_s": GOAL_S,
                       "plain_pass_cpu_s": plain_cpu, "body_pass_cpu_s": body_cpu, "floor_cpu_s": floor_cpu,
                       "ours_over_floor_cpu": ratio_cpu, "losses_cpu_s": loss_cpu, "peak_rss_ablate_mb": mem_ablate,
                       "peak_rss_scan_mb": mem_scan, "import_cpu_s": import_cpu,
                       "replayed_prefix": ours["summary"]["replayed_prefix"]}, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
