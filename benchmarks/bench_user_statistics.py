"""Benchmark: a user's statistic of the attention weights costs what the built-in ones cost.

A :class:`poslens.Statistic` that reads ``probs`` gets them chunk by chunk from the same attention
pass as the built-in statistics (``docs/statistics.md``), never as ``[B, H, S, S]`` tensors. This
script scans a tiny random Llama (2 layers, hidden 64, 4 heads of dimension 16) at ``--seq-len``
tokens three ways, each in a fresh process, in alternating rounds:

- **floor**: ``stats="probs"``, the built-in mean weight map alone;
- **entropy**: ``stats=["probs", AttentionEntropy()]``, the example of ``docs/python.md`` beside it;
- **reads**: a statistic of ``probs`` whose ``add`` computes nothing: what handing the chunks over
  costs, without the statistic's own arithmetic;
- **naive**: ``AttentionEntropy`` computed from whole ``[B, H, S, S]`` weights (eager attention with
  ``output_attentions=True``) beside the same ``probs`` scan: what a user statistic cost when it got
  whole tensors.

It reports each way's CPU time of a warm ``poslens.scan`` call (the fastest of ``--repeats`` calls
after an untimed first one in each of ``--rounds`` processes, the median over the processes) and the process's peak resident
memory (medians over rounds), and the ratios over the floor. The targets: at most 1.3x the time and 1.2x
the peak memory of ``probs`` alone at 1,024 tokens. Run:

    python benchmarks/bench_user_statistics.py               # 1,024 tokens, 5 rounds
    python benchmarks/bench_user_statistics.py --seq-len 2048 --rounds 5
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

CHILD = r'''
import json, resource, sys, time
import torch, poslens
from transformers import AutoModelForCausalLM

class AttentionEntropy(poslens.Statistic):
    needs = ("probs",)
    def __init__(self):
        self.sum, self.rows = {}, {}
    def add(self, layer, probs):
        p = probs.double()
        e = -(p * p.clamp_min(1e-300).log()).sum(-1)
        self.sum[layer] = self.sum.get(layer, 0) + e.sum((0, 2))
        self.rows[layer] = self.rows.get(layer, 0) + e.shape[0] * e.shape[2]
    def merge(self, other):
        for l in other.sum:
            self.sum[l] = self.sum.get(l, 0) + other.sum[l]
            self.rows[l] = self.rows.get(l, 0) + other.rows[l]
    def state_dict(self):
        return {"sum": self.sum, "rows": self.rows}
    def load_state_dict(self, state):
        self.sum, self.rows = state["sum"], state["rows"]
    def result(self):
        return {"entropy": torch.stack([self.sum[l] / self.rows[l] for l in sorted(self.sum)])}

class Reads(AttentionEntropy):  # reads the weights, computes nothing: what the delivery alone costs
    def add(self, layer, probs):
        self.rows[layer] = self.rows.get(layer, 0) + probs.shape[0] * probs.shape[2]
        self.sum[layer] = torch.zeros(probs.shape[1], dtype=torch.float64)

way, model_dir, S, N, Bsz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ids = torch.randint(3, 500, (N, S), generator=torch.Generator().manual_seed(0))
model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager" if way == "naive" else "sdpa").eval()


def once():
    if way == "naive":  # whole weights of every layer, then the same entropy
        ent = AttentionEntropy()
        with torch.no_grad():
            for s in range(0, N, Bsz):
                for l, w in enumerate(model(input_ids=ids[s:s + Bsz], output_attentions=True).attentions):
                    ent.add(l, w)
        poslens.scan(model, data=ids, stats="probs", batch_size=Bsz, progress=False, threads=None)
    else:
        stats = "probs" if way == "floor" else ["probs", AttentionEntropy() if way == "entropy" else Reads()]
        poslens.scan(model, data=ids, stats=stats, batch_size=Bsz, progress=False, threads=None)


once()  # the first call in a process pays for first touches of memory and one-time set-up: not timed
times = []
for _ in range(int(sys.argv[6])):
    t0 = time.process_time()
    once()
    times.append(time.process_time() - t0)
cpu = min(times)  # the call least disturbed by the rest of the machine
print(json.dumps({"cpu_s": cpu, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def _model(d: str) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--num-seqs", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5, help="processes per way, alternating the ways")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per process, after one untimed call")
    ap.add_argument("--ways", default="floor,reads,entropy,naive")
    ap.add_argument("--json", default=_results.default_path("user_statistics"),
                    help="results file (`none`: write nothing)")
    args = ap.parse_args()
    ways = args.ways.split(",")
    got: dict = {w: [] for w in ways}
    with tempfile.TemporaryDirectory() as tmp:
        _model(tmp)
        for r in range(args.rounds):
            for w in ways:
                out = subprocess.run([sys.executable, "-c", CHILD, w, tmp, str(args.seq_len), str(args.num_seqs),
                                      str(args.batch_size), str(args.repeats)], capture_output=True, text=True,
                                     check=True)
                got[w].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1}: {w:8s} {got[w][-1]['cpu_s']:7.2f} CPU-s  {got[w][-1]['peak_rss_mb']:7.0f} MB",
                      flush=True)
    med = {w: {k: statistics.median(x[k] for x in got[w]) for k in ("cpu_s", "peak_rss_mb")} for w in ways}
    print(f"\n{args.num_seqs} x {args.seq_len} tokens, tiny Llama, medians of {args.rounds} rounds")
    for w in ways:
        print(f"  {w:8s} {med[w]['cpu_s']:7.2f} CPU-s  {med[w]['peak_rss_mb']:7.0f} MB peak RSS")
    ratios = {}
    for w in ways:
        if w != "floor" and "floor" in med:
            ratios[w] = {"time": med[w]["cpu_s"] / med["floor"]["cpu_s"],
                         "memory": med[w]["peak_rss_mb"] / med["floor"]["peak_rss_mb"]}
            print(f"  {w} / floor: {ratios[w]['time']:.2f}x time, {ratios[w]['memory']:.2f}x peak memory")
    path = _results.wanted(args.json)
    if path:
        with open(path, "w") as f:
            json.dump({"meta": _results.meta(), "seq_len": args.seq_len, "num_seqs": args.num_seqs,
                       "medians": med, "ratios_over_floor": ratios, "rounds": got}, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
