"""Closed-form checks of a finished causal scan's maps, for runs too long for a full-map reference.

    python benchmarks/check_block_scan.py RUN_DIR

Every query's attention weights sum to 1, so:

- each block row ``I`` of ``probs`` (block means, ``--map-size``) satisfies
  ``sum_J mean[I, J] * count[I, J] = rows in block I``, and so does each per-head map;
- the slash profile (the mean weight at each offset ``d``, over the ``S - d`` queries that have one)
  satisfies ``sum_d slash[h, d] * (S - d) = S`` for every layer and head;
- key 0's exact weight (``probs_key0``) lies in ``[0, 1]`` and is 1 at query 0.

Prints the largest relative deviation of each and exits 1 if one exceeds float32 accumulation
tolerance (1e-4). Full-map runs (no ``--map-size``) are checked the same way with blocks of one.
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors import safe_open

from poslens.capture.backends.blocks import BlockMaps

TOL = 1e-4


def main(run_dir: str) -> int:
    path = f"{run_dir}/maps.safetensors"
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k).double() for k in f.keys() if k in ("probs", "head_probs", "slash", "probs_key0")}
    S, fblock = int(meta["seq_len"]), int(meta.get("map_block", 1))
    blocks = BlockMaps(S, -(-S // fblock))
    counts = blocks.counts(causal=True, window=None)
    rows = blocks.sizes()
    worst = {}
    for name in ("probs", "head_probs"):
        if name in t:
            got = (t[name] * counts).sum(-1)  # [..., n]: rows' weight sums per block row
            worst[name] = float(((got - rows) / rows).abs().max())
    if "slash" in t:
        per = (t["slash"] * (S - torch.arange(S, dtype=torch.float64))).sum(-1)  # [L, H]
        worst["slash"] = float(((per - S) / S).abs().max())
    if "probs_key0" in t:
        k0 = t["probs_key0"]
        worst["probs_key0"] = max(float((-k0).clamp_min(0).max()), float((k0 - 1).clamp_min(0).max()),
                                  float((k0[:, 0] - 1).abs().max()))
    print(json.dumps({"seq_len": S, "map_block": fblock, "blocks": blocks.n,
                      "max_relative_deviation": worst}, indent=1))
    bad = {k: v for k, v in worst.items() if not v <= TOL}
    if bad or not worst:
        print(f"check_block_scan: FAILED {bad or 'no weight maps in the run'}", file=sys.stderr)
        return 1
    print("check_block_scan: every closed-form check holds")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
