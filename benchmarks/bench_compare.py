"""Cost of ``poslens compare`` (two variants at one length) against one ``poslens scan`` of the same shape,
the goal being at most 2.1x the scan's time and at most 1.2x its peak memory.

Both run as fresh processes on the same model, data and thread count, alternating (scan, compare,
scan, compare, ...) so that drift on the machine falls on both; each process reports its own CPU time
(user + sys), wall time and peak resident memory. The scan takes every statistic (the default), the
comparison its own readings on both sides (by default the model against itself: the cost does not
depend on what the variant changes). The load average before the run is printed: on a busy machine
the times are upper bounds.

    python benchmarks/bench_compare.py                               # SmolLM2, 16 x 256, 2 threads
    python benchmarks/bench_compare.py --seq-len 1024 --num-seqs 8 --variant rope-scaling=yarn:4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

TIME_GOAL, MEMORY_GOAL = 2.1, 1.2

#: runs one poslens command in this process and prints its CPU, wall time and peak memory as JSON
_CHILD = r"""
import json, resource, sys, time
t = time.perf_counter()
from poslens.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    if e.code not in (0, None):
        raise
r = resource.getrusage(resource.RUSAGE_SELF)
print("BENCH " + json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": r.ru_utime + r.ru_stime,
                             "sys_s": r.ru_stime, "peak_bytes": r.ru_maxrss * 1024}))
"""


#: the plain forwards of the same sequences in this process: keeping one logit (what a scan runs) and every
#: logit (what the loss of a comparison needs: the LM head over every position), CPU seconds each
_FLOOR = r"""
import json, sys, time, torch
from poslens.capture.model.load import load_model, load_tokenizer
from poslens.data.sources import make_source
path, S, N, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 4, int(sys.argv[4])
torch.set_num_threads(T)
m = load_model(path, dtype=torch.float32, device="cpu")
ids = make_source("stdlib", seq_len=S, num_seqs=N, tokenizer=load_tokenizer(path),
                  vocab_size=m.config.vocab_size).batch(0, N)
out = {}
with torch.no_grad():
    for name, kw in (("keep_one", {"logits_to_keep": 1}), ("all_logits", {})):
        m(input_ids=ids[:B], use_cache=False, **kw)
        t = time.process_time()
        for s in range(0, N, B):
            m(input_ids=ids[s:s + B], use_cache=False, **kw)
        out[name] = time.process_time() - t
print("BENCH " + json.dumps(out))
"""


def _floor(model: str, seq_len: int, num_seqs: int, threads: int) -> dict:
    p = subprocess.run([sys.executable, "-c", _FLOOR, model, str(seq_len), str(num_seqs), str(threads)],
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"the plain forwards failed:\n{p.stderr[-2000:]}")
    return json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("BENCH "))[6:])


def _run(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{p.stderr[-2000:]}")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("BENCH "))
    return json.loads(line[6:])


def main() -> None:
    from poslens.models import realmodels

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model path (default: SmolLM2's GGUF from `poslens models fetch`)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--num-seqs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=2, help="alternating (scan, compare) pairs")
    ap.add_argument("--variant", action="append", default=[], help="variant of side B (default: none)")
    ap.add_argument("--json", default=_results.default_path("compare"), help="results file ('none': no file)")
    args = ap.parse_args()
    model = args.model or str(realmodels.path("smollm2") or "")
    if not model:
        raise SystemExit("no model: run `python -m poslens models fetch` or pass --model")
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")
    common = ["--seq-len", str(args.seq_len), "--num-seqs", str(args.num_seqs), "--threads", str(args.threads),
              "--no-figures", "--quiet"]
    scans, compares = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.pairs):
            scans.append(_run(["scan", model, "--out", f"{tmp}/scan{k}", *common]))
            compares.append(_run(["compare", model, "--out", f"{tmp}/compare{k}", *common,
                                  *[x for v in args.variant for x in ("--variant", v)]]))
            print(f"pair {k + 1}: scan {scans[-1]['cpu_s']:.1f} CPU-s ({scans[-1]['wall_s']:.1f} s wall, "
                  f"{scans[-1]['peak_bytes'] / 2**30:.2f} GiB), compare {compares[-1]['cpu_s']:.1f} CPU-s "
                  f"({compares[-1]['wall_s']:.1f} s wall, {compares[-1]['peak_bytes'] / 2**30:.2f} GiB)")
    floor = _floor(model, args.seq_len, args.num_seqs, args.threads)
    head = max(0.0, floor["all_logits"] - floor["keep_one"])
    print(f"plain forwards: {floor['keep_one']:.1f} CPU-s keeping one logit (a scan's), {floor['all_logits']:.1f} "
          f"with every logit (a comparison's, for the loss): the LM head over every position costs {head:.1f} CPU-s "
          "per side")
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    t_ratio = med(compares, "cpu_s") / med(scans, "cpu_s")
    w_ratio = med(compares, "wall_s") / med(scans, "wall_s")
    m_ratio = med(compares, "peak_bytes") / med(scans, "peak_bytes")
    print(f"compare / scan: {t_ratio:.2f}x CPU time, {w_ratio:.2f}x wall time (goal {TIME_GOAL}x: "
          f"{'met' if t_ratio <= TIME_GOAL else 'missed'}); {m_ratio:.2f}x peak memory (goal {MEMORY_GOAL}x: "
          f"{'met' if m_ratio <= MEMORY_GOAL else 'missed'})")
    # the comparison's own work beside the two LM-head passes over every position a scan does not run
    own_ratio = (med(compares, "cpu_s") - 2 * head) / med(scans, "cpu_s")
    print(f"compare without the two LM-head passes of its loss / scan: {own_ratio:.2f}x CPU time")
    out = _results.wanted(args.json)
    if out:
        with open(out, "w") as f:
            json.dump({"meta": _results.meta(), "load_before": load, "model": os.path.basename(model),
                       "seq_len": args.seq_len, "num_seqs": args.num_seqs, "threads": args.threads,
                       "variants": args.variant, "scans": scans, "compares": compares, "cpu_ratio": t_ratio,
                       "wall_ratio": w_ratio, "memory_ratio": m_ratio, "plain_forward_cpu_s": floor, "lm_head_cpu_s": head,
                       "cpu_ratio_without_lm_head": own_ratio, "time_goal": TIME_GOAL,
                       "memory_goal": MEMORY_GOAL}, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
