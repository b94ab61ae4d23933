"""Cause: rich draws 24 bits from Python's global ``random`` generator when first imported (its style
ids), and the first ``poslens.scan`` of a process imports it for the progress bar. A call of poslens
leaves the caller's global random stream as it found it. Run in a fresh process: rich is imported
by the time the suite gets here."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import random, sys
import torch
import poslens
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
assert "rich" not in sys.modules
random.seed(5); expected = [random.random() for _ in range(3)]
random.seed(5)
poslens.scan(m, data=torch.randint(3, 60, (2, 8)), progress=False, threads=1)
assert "rich" in sys.modules
got = [random.random() for _ in range(3)]
print("SAME" if got == expected else f"CHANGED {got} {expected}")
"""


def test_a_scan_leaves_the_global_random_stream_as_it_was(tiny):
    p = subprocess.run([sys.executable, "-c", CHILD, str(tiny)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "SAME", p.stdout
