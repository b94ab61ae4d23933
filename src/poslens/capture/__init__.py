"""Capture engine: scan any Hugging Face causal LM for positional structure.

Public entry points:

- :func:`poslens.capture.scan.run_scan` (``ScanConfig`` -> summary dict, writes a run directory);
- :class:`poslens.capture.attention.Capture` / ``CaptureSpec`` and :func:`register` for callers that
  drive their own forwards (e.g. a distributed driver that shards sequences and all-reduces
  ``capture.accs``);
- :func:`poslens.capture.sources.make_source` for deterministic, index-addressable sequences.
"""

from poslens.capture.attention import ATTN_NAME, Capture, CaptureSpec, accumulator_shapes, register
from poslens.capture.scan import ScanConfig, attach, load_model, plan_scan, run_scan
from poslens.capture.sources import make_source

__all__ = ["ATTN_NAME", "Capture", "CaptureSpec", "ScanConfig", "accumulator_shapes", "attach", "load_model",
           "make_source", "plan_scan", "register", "run_scan"]
