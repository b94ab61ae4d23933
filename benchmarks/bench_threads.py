"""Benchmark: how much a competing busy process slows poslens, under torch's default threads and
under the poslens thread policy (:mod:`poslens.runtime`).

Two workloads, each timed in its own process, alone and while this script runs a competitor (one
busy Python loop, pinned to no CPU):

- **simulate**: :func:`poslens.simulator.run_simulation` at S 50, d 64, 4 layers. Under "torch
  default" the chunks run one after another with torch's intra-op threads (the way the simulator
  worked before the policy); under "poslens" they run on single-threaded workers, one per CPU.
- **train**: training steps (forward, backward, AdamW) of a small RoPE model (``tiny`` preset,
  random tokens), as ``poslens train`` runs them. Under "torch default" torch picks the threads
  and OpenMP spins while it waits; under "poslens" the CLI's start-up sets
  ``OMP_WAIT_POLICY=PASSIVE`` and ``--threads 0`` picks the CPUs not busy elsewhere.

The slowdown is (time with the competitor) / (time alone). What the lost CPU share predicts: on C
CPUs one busy process takes between 1/(T+1) of our T threads' CPUs (the scheduler is fair per
thread) and one whole CPU, so a perfectly parallel run slows between (T+1)/T and C/(C-1): 1.5x to
2x on 2 CPUs. Spinning threads make it 10x or more.

    python benchmarks/bench_threads.py                      # both workloads, both policies
    python benchmarks/bench_threads.py --samples 50000 --steps 40
    python benchmarks/bench_threads.py --workloads simulate
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

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", "src"))


# ------------------------------------------------------------------------------------------------
# children: one workload under one policy, printing one JSON line
# ------------------------------------------------------------------------------------------------
def _child(args) -> None:
    if args.policy == "poslens":
        from poslens.runtime import configure_process

        configure_process()  # what the poslens CLI does first: before torch is imported
    import torch

    from poslens.runtime import available_cpus, default_threads

    if args.policy == "poslens":
        # simulate: one single-threaded worker per CPU (they never wait for each other)
        threads = available_cpus() if args.workload == "simulate" else default_threads()
    else:
        threads = torch.get_num_threads()
    out = {"threads": threads, "cpus": available_cpus(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    out.update((_simulate if args.workload == "simulate" else _train)(args, threads))
    print(json.dumps(out))


def _simulate(args, threads: int) -> dict:
    import torch

    from poslens.simulator import SimConfig, run_simulation

    cfg = SimConfig(samples=args.samples, seq_len=50, dim=64, layers=4, device="cpu")
    if args.policy == "poslens":
        t0 = time.perf_counter()
        run_simulation(cfg)  # workers: one per CPU, single-threaded inside torch
        return {"seconds": time.perf_counter() - t0, "workers": None}
    # torch default: one chunk after another, each operation on torch's intra-op threads
    from poslens.simulator import RNG_BLOCK, _chunk_sums, auto_chunk, layer_buffers

    torch.set_num_threads(threads)
    chunk = auto_chunk(cfg)
    bufs = layer_buffers(cfg, chunk, "cpu")
    S = cfg.seq_len
    neg = torch.zeros(S, S).masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    n_blocks = -(-cfg.samples // RNG_BLOCK)
    t0 = time.perf_counter()
    for b in range(0, n_blocks, chunk // RNG_BLOCK):
        nb = min(chunk // RNG_BLOCK, n_blocks - b)
        _chunk_sums(cfg, b, nb, b * RNG_BLOCK, min(chunk, cfg.samples - b * RNG_BLOCK), bufs, None, neg)
    return {"seconds": time.perf_counter() - t0}


def _train(args, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    from poslens.models.families import build_model

    torch.set_num_threads(threads)
    vocab, batch, seq = 2048, args.batch_size, args.seq_len
    model = build_model("rope", args.preset, vocab, seed=0, max_positions=seq)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq + 1), generator=g)

    def step():
        logits = model(input_ids=x[:, :-1]).logits
        F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dt = time.perf_counter() - t0
    return {"seconds": dt, "tokens_per_second": batch * seq * args.steps / dt}


# ------------------------------------------------------------------------------------------------
# parent
# ------------------------------------------------------------------------------------------------
COMPETITOR = "while True:\n    pass\n"


def _run(args, workload: str, policy: str) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--workload", workload, "--policy", policy,
           "--samples", str(args.samples), "--steps", str(args.steps), "--preset", args.preset,
           "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        print(f"{workload}/{policy} failed (exit {p.returncode}):\n{p.stderr[-1500:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="simulate,train", help="comma-separated: simulate, train")
    ap.add_argument("--samples", type=int, default=20_000, help="simulate: samples")
    ap.add_argument("--steps", type=int, default=20, help="train: timed steps (after 2 warm-up steps)")
    ap.add_argument("--preset", default="tiny", help="train: model size preset")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--json", default=_results.default_path("threads"),
                    help="write the results here (default: benchmarks/results_threads.json; 'none': print only)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return

    rows = []
    for workload in args.workloads.split(","):
        for policy in ("torch default", "poslens"):
            pol = "torch" if policy == "torch default" else "poslens"
            alone = _run(args, workload, pol)
            hog = subprocess.Popen([sys.executable, "-c", COMPETITOR])
            try:
                time.sleep(1.0)  # let it become a busy, runnable process
                loaded = _run(args, workload, pol)
            finally:
                hog.kill()
                hog.wait()
            rows.append({"workload": workload, "policy": policy, "alone": alone, "competitor": loaded})
            print(f"  {workload:8s} {policy:13s} done", file=sys.stderr)

    try:
        load = " load average %.2f %.2f %.2f at the end;" % os.getloadavg()
    except OSError:
        load = ""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"setting: {cpus} CPUs;{load} simulate {args.samples:,} samples (S 50, d 64, 4 layers); train "
          f"{args.steps} steps, preset {args.preset}, batch {args.batch_size} x {args.seq_len} tokens; "
          f"competitor: one busy Python loop")
    head = (f"{'workload':9s} {'policy':14s} {'threads alone/comp.':>19s} {'alone s':>8s} {'with comp. s':>12s} "
            f"{'slowdown':>9s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        a, c = r["alone"], r["competitor"]
        if not a or not c:
            print(f"{r['workload']:9s} {r['policy']:14s} failed")
            continue
        print(f"{r['workload']:9s} {r['policy']:14s} {str(a['threads']) + ' / ' + str(c['threads']):>19s} "
              f"{a['seconds']:8.2f} {c['seconds']:12.2f} {c['seconds'] / a['seconds']:8.1f}x")
    print(f"expected from the CPU share one busy process takes on {cpus} CPUs: "
          f"{(cpus + 1) / cpus:.1f}x to {cpus / max(cpus - 1, 1):.1f}x (see the docstring)")
    if _results.wanted(args.json) and not args.child:
        with open(args.json, "w") as fh:
            json.dump({**_results.meta(), "setting": vars(args), "cpus": cpus, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
