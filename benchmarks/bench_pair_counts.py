"""Benchmark: the pair counts behind locality, diagonal trends and the APS, per row length.

A score map's locality counts, in each query row, the key pairs whose score rises towards the query;
its diagonal trend counts the same along diagonals, and the jackknife repeats that for every
leave-one-group-out map. All of them come down to: for each row of ``x [N, T]``, the pairs
``j < k`` with ``x[k] > x[j]`` and with ``x[k] == x[j]``. Three ways, the same counts, timed in one
process on the same rows (float64, random values):

- **naive**: every pair compared by torch (``x[:, None, :] > x[:, :, None]`` masked to ``j < k``);
- **sort**: one value sort per row and an O(T log^2 T) count of non-inversions (numpy), the path
  without the C kernels (``POSLENS_CAPTURE_KERNEL=torch``);
- **kernel**: every pair compared in C, four doubles per instruction (``poslens.native.pair_counts``),
  the path for rows of up to ``PAIR_COUNTS_MAX_T`` entries.

The floor is one value sort of each row (``numpy.sort``): a count of pairs by comparison reads the
rows' order at least. It prints microseconds per row and the ratios, and
writes ``results_pair_counts.json``; the kernel's cap (``PAIR_COUNTS_MAX_T``) sits below the length
where the sort count overtakes it. One thread. Run:

    python benchmarks/bench_pair_counts.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402


def _per_row(fn, rows: int, min_s: float = 0.3) -> float:
    """Microseconds per row: the fastest of repeated calls (at least ``min_s`` of them in all)."""
    fn()
    best, spent = float("inf"), 0.0
    while spent < min_s:
        t0 = time.process_time()
        fn()
        dt = time.process_time() - t0
        best, spent = min(best, dt), spent + dt
    return best / rows * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="32,64,128,256,512,1024,2048")
    ap.add_argument("--pairs", type=float, default=2e7, help="pairs per timed call (rows = pairs / (T^2 / 2))")
    ap.add_argument("--json", default=_results.default_path("pair_counts"),
                    help="results file (`none`: write nothing)")
    args = ap.parse_args()
    import numpy as np
    import torch

    from poslens import native
    from poslens.metrics import neighborhood as nb

    torch.set_num_threads(1)
    if not native.available():
        sys.exit(f"the C kernels are not available here: {native.status()}")
    rows_out = []
    print(f"{'T':>6} {'naive':>10} {'sort':>10} {'kernel':>10} {'floor':>8}   kernel over sort / naive / floor"
          "  (us per row, one thread)")
    for T in (int(t) for t in args.lengths.split(",")):
        N = max(8, int(args.pairs / (T * T / 2)))
        x = torch.randn(N, T, dtype=torch.float64, generator=torch.Generator().manual_seed(T))
        xn = x.numpy()
        upper = torch.ones(T, T, dtype=torch.bool).triu_(1)

        def naive():
            for r0 in range(0, N, 64):  # bounded memory: 64 rows of T^2 comparisons at a time
                xs = x[r0:r0 + 64]
                ((xs[:, None, :] > xs[:, :, None]) & upper).sum((1, 2))
                ((xs[:, None, :] == xs[:, :, None]) & upper).sum((1, 2))

        def sort():
            os.environ[native.KERNEL_ENV] = "torch"
            try:
                return nb._sorted_pair_counts(x)
            finally:
                del os.environ[native.KERNEL_ENV]

        kernel_ok = T <= native.PAIR_COUNTS_MAX_T
        got = {"T": T, "rows": N,
               "naive_us": _per_row(naive, N), "sort_us": _per_row(sort, N),
               "kernel_us": _per_row(lambda: native.pair_counts(x), N) if kernel_ok else None,
               "floor_us": _per_row(lambda: np.sort(xn, axis=1), N)}
        if kernel_ok:  # the same counts every way
            k, s = native.pair_counts(x), sort()
            assert torch.equal(k[0], s[0]) and torch.equal(k[1], s[1])
        rows_out.append(got)
        kern = got["kernel_us"]
        ratio = (f"{got['sort_us'] / kern:5.1f}x / {got['naive_us'] / kern:5.1f}x / {kern / got['floor_us']:6.1f}x"
                 if kern else "(above PAIR_COUNTS_MAX_T: the sort count)")
        print(f"{T:>6} {got['naive_us']:>10.1f} {got['sort_us']:>10.1f} "
              f"{kern if kern is not None else float('nan'):>10.1f} {got['floor_us']:>8.2f}   {ratio}", flush=True)
    path = _results.wanted(args.json)
    if path:
        with open(path, "w") as f:
            json.dump({"meta": _results.meta(), "max_t": native.PAIR_COUNTS_MAX_T, "rows": rows_out}, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
