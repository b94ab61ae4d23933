"""Benchmark: the CLI as a thin layer over the Python functions, in time.

For ``simulate`` at the paper's setting (arXiv 2509.21042: 100,000 samples, length 50, d = 64,
4 layers) and for ``scan`` of a small random Llama, the same work four ways, each a fresh process
(interpreter start, imports, work, exit) except the first:

- **call**: the Python function alone, timed inside one warm process (the floor: no start-up);
- **python**: ``python -c "import poslens; poslens.simulate(...)"`` as a process;
- **cli**: ``poslens simulate ... --no-figures --quiet`` as a process (the same work as ``python``);
- **cli + figures**: the CLI's default, which also draws and writes the PNG figures.

The target: ``cli`` costs at most about a second more than ``python``. Rounds alternate the ways
(``--rounds``), which spreads a shared machine's drift over all of them; the table gives each way's
median and the differences. Run:

    python benchmarks/bench_api.py                 # both, 3 rounds
    python benchmarks/bench_api.py --only simulate --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

SIM = dict(samples=100_000, seq_len=50, dim=64, num_layers=4, alpha=0.0)
SCAN = dict(seq_len=256, num_seqs=16, batch_size=4)


def _tiny_model(d: str) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)


def _commands(what: str, model: str, out: str) -> dict:
    py = sys.executable
    if what == "simulate":
        kw = ", ".join(f"{k}={v!r}" for k, v in SIM.items())
        flags = ["--samples", SIM["samples"], "--seq-len", SIM["seq_len"], "--dim", SIM["dim"], "--num-layers",
                 SIM["num_layers"], "--alpha", SIM["alpha"]]
        call = f"poslens.simulate({kw}, progress=False)"
    else:
        kw = ", ".join(f"{k}={v!r}" for k, v in SCAN.items())
        flags = [model, "--data", "random", "--seq-len", SCAN["seq_len"], "--num-seqs", SCAN["num_seqs"],
                 "--batch-size", SCAN["batch_size"]]
        call = f"poslens.scan({model!r}, data='random', {kw}, progress=False)"
    flags = [str(f) for f in flags]
    return {
        "python": [py, "-c", f"import poslens; {call}"],
        "cli": [py, "-m", "poslens", what, *flags, "--out", out, "--no-figures", "--quiet"],
        "cli + figures": [py, "-m", "poslens", what, *flags, "--out", out, "--quiet"],
        "_call": call,
    }


def _time_call(call: str) -> float:
    """The function alone, in a warm process (imports and one warm-up call done first)."""
    code = (f"import time, poslens\n{call}\nt = time.perf_counter()\n{call}\n"
            "print(time.perf_counter() - t)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(p.stdout.strip().splitlines()[-1])


def _time_process(cmd: list, out: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["simulate", "scan"], help="One of the two (default: both).")
    ap.add_argument("--rounds", type=int, default=3, help="Rounds of every way (median reported).")
    ap.add_argument("--json", default=_results.default_path("api"), help="Results file ('none': no file).")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-api-")
    model = os.path.join(work, "model")
    _tiny_model(model)
    results = {}
    try:
        for what in [args.only] if args.only else ["simulate", "scan"]:
            cmds = _commands(what, model, os.path.join(work, "out"))
            times = {k: [] for k in ("call", "python", "cli", "cli + figures")}
            for r in range(args.rounds):
                times["call"].append(_time_call(cmds["_call"]))
                for way in ("python", "cli", "cli + figures"):
                    times[way].append(_time_process(cmds[way], os.path.join(work, "out")))
                print(f"{what} round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                      flush=True)
            med = {k: statistics.median(v) for k, v in times.items()}
            results[what] = {"seconds": times, "median": med,
                             "cli_minus_python_s": med["cli"] - med["python"],
                             "python_minus_call_s": med["python"] - med["call"],
                             "figures_s": med["cli + figures"] - med["cli"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'':10} {'call':>8} {'python':>8} {'cli':>8} {'cli+fig':>8}   cli − python   python − call")
    for what, r in results.items():
        m = r["median"]
        print(f"{what:10} {m['call']:8.2f} {m['python']:8.2f} {m['cli']:8.2f} {m['cli + figures']:8.2f}   "
              f"{r['cli_minus_python_s']:+11.2f} s   {r['python_minus_call_s']:+12.2f} s")
    print("(median seconds; target: cli − python at most about 1 s)")
    path = _results.wanted(args.json)
    if path:
        with open(path, "w") as f:
            json.dump({"meta": _results.meta(), "settings": {"simulate": SIM, "scan": SCAN}, "results": results}, f,
                      indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
