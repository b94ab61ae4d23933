"""Known bugs planted one at a time in a scratch copy of ``src/``: each must make a test fail.

Each entry replaces one exact snippet of a module and runs the named tests against the copy; every
plant must be CAUGHT (a test fails). Nothing is ever written into the working tree. Not part of the
default test run; about a minute in all::

    python benchmarks/planted_bugs.py            # all
    python benchmarks/planted_bugs.py 5 11       # plants whose number is 5 or 11
"""
import os, shutil, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T = str(ROOT / "tests") + "/"
P = [
 ("1 rising_pair_fraction: rises of the last band of rows only", "poslens/metrics/neighborhood.py",
  "        rises += gt.reshape(B, hi - lo).sum(1)",
  "        rises = gt.reshape(B, hi - lo).sum(1)", "metrics/test_sorted_counts.py"),
 ("1b rising_pair_fraction: pairs counted with the diagonal", "poslens/metrics/neighborhood.py",
  "    pairs = (n * (n - 1) // 2).sum(1)",
  "    pairs = (n * (n + 1) // 2).sum(1)", "test_references.py"),
 ("2 kv_head_of: modulo grouping", "poslens/metrics/slash.py",
  "    return h // (num_heads // num_kv_heads)", "    return h % num_kv_heads", "test_references.py"),
 ("3 band_contributions: drops a rotary pair", "poslens/metrics/rank.py",
  "        dims = idx + [l + half for l in idx]", "        dims = idx + [l + half for l in idx[1:]]", "test_references.py"),
 ("4 frequency_bands: doubled high/medium threshold", "poslens/rope.py",
  "    mid = math.sqrt(2 * math.pi * context_len)", "    mid = 2 * math.sqrt(2 * math.pi * context_len)", "test_references.py"),
 ("4b frequency_bands: doubled low threshold", "poslens/rope.py",
  '"low" if w >= context_len', '"low" if w >= 2 * context_len', "test_references.py"),
 ("5 scan summary: APS from previous layer's cosine map", "poslens/capture/scan/finalize.py",
  '"mean_map_aps": _at(r.mean_map_aps["cosine"], li + 1),', '"mean_map_aps": _at(r.mean_map_aps["cosine"], li),', "test_references.py"),
 ("5b scan summary: per-sequence APS of previous layer", "poslens/capture/scan/finalize.py",
  '"aps_mean": aps_mean[li + 1],', '"aps_mean": aps_mean[li],', "test_references.py"),
 ("6 slash reading: inverted ratio", "poslens/metrics/judge/papers.py",
  "        ratio = num(top[\"score\"]) / base if", "        ratio = base / num(top[\"score\"]) if", "test_references.py"),
 ("7 kim_readings: flipped sign test", "poslens/metrics/judge/papers.py",
  "    elif min(locs) > TREND:", "    elif min(locs) > -TREND:", "test_references.py"),
 ("7b kim_readings: flipped far sign", "poslens/metrics/judge/papers.py",
  "    elif max(locs) < -TREND:", "    elif max(locs) < TREND:", "test_references.py"),
 ("8 persistence vs in-distribution score", "poslens/metrics/slash.py",
  '"persists": sr >= kappa}', '"persists": sr >= si}', "test_references.py"),
 ("9 persistence > kappa", "poslens/metrics/slash.py",
  '"persists": sr >= kappa}', '"persists": sr > kappa}', "test_references.py"),
 ("10 relativity_index: no noise correction", "poslens/metrics/diagonal.py",
  "    if g is not None and g.shape[0] >= 2:\n        mask = mask & _entries(g, include_diagonal)",
  "    if False:\n        mask = mask & _entries(g, include_diagonal)", "test_references.py"),
 ("11 simulator: rotated values", "poslens/simulator.py",
  "x.baddbmm_(p, y)  # residual", "x.baddbmm_(p, q)  # residual", "test_references.py"),
 ("12 diagonal_trend: sign flipped", "poslens/metrics/diagonal.py",
  "    trend = (gt - lt) / pairs", "    trend = (lt - gt) / pairs", "test_references.py"),
 ("13 locality: ties count 0", "poslens/metrics/diagonal.py",
  "    v = float(pair_fraction(rises, tied, pairs, ties=0.5))",
  "    v = float(pair_fraction(rises, tied, pairs, ties=0.0))", "test_references.py"),
 ("14 uniform_slash: off by one", "poslens/metrics/verdicts.py",
  "    return sum(1.0 / i for i in range(d + 1, n + 1)) / (n - d)", "    return sum(1.0 / i for i in range(d + 1, n + 1)) / (n - d + 1)", "test_references.py"),
 ("15 MeanAccumulator.var: biased", "poslens/capture/statistics/accumulators.py",
  "        return ((self.sumsq - n * mean * mean) / (n - 1)).clamp_min(0.0)",
  "        return ((self.sumsq - n * mean * mean) / n).clamp_min(0.0)", "capture/test_stats.py"),
 ("16 merge forgets sumsq", "poslens/capture/statistics/accumulators.py",
  "        self.add(other.sum, other.count, other.sumsq)", "        self.add(other.sum, other.count, other.sumsq * 0 if other.sumsq is not None else None)", "capture/test_stats.py"),
 ("17 cross_mean_square includes own-group products", "poslens/metrics/noise.py",
  "    off = ~torch.eye(G, dtype=torch.bool, device=\"cpu\")", "    off = torch.ones(G, G, dtype=torch.bool)", "capture/test_stats.py"),
 ("18 signflip p strict", "poslens/metrics/noise.py",
  "(t >= t_obs * (1 - 1e-12))", "(t > t_obs * (1 + 1e-12))", "capture/test_stats.py"),
 ("19 is_flat ignores groups", "poslens/metrics/diagonal.py",
  "        return p >= NOISE_P", "        return p <= NOISE_P", "test_references.py"),
 ("20 per_sequence_aps wrong subsample", "poslens/metrics/neighborhood.py",
  "    return torch.linspace(0, S - 1, max_positions, device=device).round().long()", "    return torch.arange(max_positions)", "test_references.py"),
 ("21 jackknife factor", "poslens/metrics/noise.py",
  "((G - 1) / G * ((v - v.mean()) ** 2).sum()).sqrt()", "(1 / G * ((v - v.mean()) ** 2).sum()).sqrt()", "capture/test_stats.py"),
 ("22 stderr divides by n-1", "poslens/capture/statistics/accumulators.py",
  "        return (self.var / max(self.count, 1)).sqrt()", "        return (self.var / max(self.count - 1, 1)).sqrt()", "capture/test_stats.py"),
 ("23 gram_means: the narrower last block divided by the full block size", "poslens/capture/backends/blocks.py",
  "        return out.div_(self.sizes().to(torch.float32).to(a.device)[:, None])", "        return out.div_(float(f))",
  "capture/test_capture_perf.py"),
 ("24 blocked losses: the logsumexp without its shift added back", "poslens/analysis/ablate/losses.py",
  "            out[lo:hi] = z.sub_(top).exp_().sum(1).log_().add_(top[:, 0]).sub_(picked)",
  "            out[lo:hi] = z.sub_(top).exp_().sum(1).log_().sub_(picked)", "ablate/test_ablate.py"),
]
def main(only: list[str]) -> int:
    known = {name.split(" ", 1)[0] for name, *_ in P}
    if any(o not in known for o in only):
        sys.exit(f"usage: planted_bugs.py [N ...]  (plant numbers: {', '.join(sorted(known))})")
    res = []
    for name, f, old, new, tests in P:
        if only and not any(name.startswith(o + " ") for o in only):
            continue
        d = tempfile.mkdtemp(prefix="poslens_plant_")
        shutil.copytree(ROOT / "src", d + "/src", ignore=shutil.ignore_patterns("__pycache__"))
        p = f"{d}/src/{f}"
        s = open(p).read()
        assert s.count(old) == 1, (name, s.count(old))
        open(p, "w").write(s.replace(old, new))
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", T + tests],
                           env={**os.environ, "PYTHONPATH": f"{d}/src:{T}", "PYTHONDONTWRITEBYTECODE": "1"},
                           capture_output=True, text=True, cwd=ROOT)
        shutil.rmtree(d, ignore_errors=True)
        last = r.stdout.strip().splitlines()
        fails = [l for l in last if l.startswith("FAILED")]
        res.append(bool(r.returncode))
        print(f"{'CAUGHT' if r.returncode else 'MISSED'}  {name}  {fails[:1]}", flush=True)
    print(f"{sum(res)}/{len(res)} planted bugs caught")
    return 0 if all(res) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
