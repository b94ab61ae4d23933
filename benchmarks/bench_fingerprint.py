"""Wall-clock time of ``poslens fingerprint`` on the SmolLM2 and Gemma 3 GGUF files at its default sizes.

The goal: within 5 minutes on an idle 2-core CPU for both models together. The command
runs as a user runs it, one process (``python -m poslens fingerprint SMOLLM2 GEMMA3 --out DIR``),
and is timed from start to exit; the breakdown reads each scan's own timings from its summary
(model loading and writing included in ``wall_s``), the rest being the traits, figures and page.
The load average before the run is printed beside the figure: on a busy machine the time is an
upper bound, and the process's CPU time (user + sys, which other processes' load does not inflate)
brackets what an idle machine would take: between CPU time / threads and CPU time.

    python benchmarks/bench_fingerprint.py               # default sizes, 2 threads
    python benchmarks/bench_fingerprint.py --seq-len 128 --num-seqs 16 --json none
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

GOAL_S = 300.0


def screenshot(page: str, png: str, screens: float, tmp: str) -> None:
    """The page's top in headless Chromium (Debian's ``chromium``), scaled to 900 px wide."""
    from pathlib import Path

    from PIL import Image

    full = os.path.join(tmp, "full.png")
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,9000", f"--screenshot={full}", Path(page).resolve().as_uri()],
                   check=True, capture_output=True, timeout=180)
    im = Image.open(full).convert("RGB")
    px = im.load()
    bottom = max((y for y in range(0, im.height, 10)
                  if any(px[x, y] != (255, 255, 255) for x in range(0, im.width, 7))), default=0)
    top = im.crop((0, 0, im.width, min(bottom, int(screens * 1000))))
    top = top.resize((900, round(top.height * 900 / top.width)), Image.LANCZOS)
    top.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)
    print(f"page about {bottom / 1000:.1f} screens of 1,000 px; wrote {png}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=None, help="default: the command's own")
    ap.add_argument("--num-seqs", type=int, default=None, help="default: the command's own")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="smollm2,gemma3", help="names of `poslens models list`")
    ap.add_argument("--json", default=_results.default_path("fingerprint"), help="results file ('none': no file)")
    ap.add_argument("--out", default=None, help="keep the fingerprint in this directory (default: a temporary one)")
    ap.add_argument("--screenshot", default=None, help="PNG of the page's top in headless Chromium (900 px wide)")
    ap.add_argument("--screens", type=float, default=2.5, help="1,000-px screens the screenshot shows")
    args = ap.parse_args()

    from poslens.models import realmodels

    paths = []
    for name in args.models.split(","):
        p = realmodels.path(name)
        if p is None:
            sys.exit(f"bench_fingerprint: model {name} absent; run `python -m poslens models fetch` first.")
        paths.append(str(p))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-fingerprint-") as tmp:
        out = args.out or os.path.join(tmp, "fp")
        if args.out and os.path.exists(out):
            sys.exit(f"bench_fingerprint: --out {out} exists; choose a new directory.")
        cmd = [sys.executable, "-m", "poslens", "fingerprint", *paths, "--out", out, "--quiet",
               "--threads", str(args.threads)]
        if args.seq_len:
            cmd += ["--seq-len", str(args.seq_len)]
        if args.num_seqs:
            cmd += ["--num-seqs", str(args.num_seqs)]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        total = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        with open(os.path.join(out, "fingerprint.json")) as f:
            summary = json.load(f)
        parts = []
        for m in summary["models"]:
            for kind in ("text", "random"):
                with open(os.path.join(out, m["scans"][kind], "summary.json")) as f:
                    tp = json.load(f)["throughput"]
                parts.append({"model": m["name"], "scan": kind, "wall_s": tp["wall_s"], "forward_s": tp["seconds"],
                              "tokens": tp["tokens"]})
        if args.screenshot:
            screenshot(os.path.join(out, "fingerprint.html"), args.screenshot, args.screens, tmp)
    scans = sum(p["wall_s"] for p in parts)
    print(f"poslens fingerprint {' '.join(m['name'] for m in summary['models'])}: "
          f"{summary['num_seqs']} × {summary['seq_len']} tokens per scan, {args.threads} threads")
    print(f"load average before the run: {load_before[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    for p in parts:
        print(f"  {p['model']:<30} {p['scan']:<6} scan {p['wall_s']:6.1f} s (capture {p['forward_s']:5.1f} s)")
    print(f"  traits, figures, page and process start: {total - scans:6.1f} s")
    print(f"total {total:.1f} s; goal {GOAL_S:.0f} s: {'met' if total <= GOAL_S else 'missed'} "
          f"({total / GOAL_S:.2f} of the budget)")
    # CPU time does not grow with other processes' load: on an idle machine with `threads` cores the
    # wall time is at least cpu / threads, and at most cpu (if nothing ran in parallel)
    print(f"CPU time (user + sys) {cpu:.1f} s: on an idle {args.threads}-core CPU the run takes between "
          f"{cpu / args.threads:.0f} and {cpu:.0f} s")
    path = _results.wanted(args.json)
    if path:
        with open(path, "w") as f:
            json.dump({"meta": _results.meta(), "goal_s": GOAL_S, "total_s": total, "load_average_before": load_before[0],
                       "seq_len": summary["seq_len"], "num_seqs": summary["num_seqs"], "threads": args.threads,
                       "models": [m["name"] for m in summary["models"]], "scans": parts,
                       "rest_s": total - scans, "cpu_s": cpu}, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
