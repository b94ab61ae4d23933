"""Capture engine: run any Hugging Face causal LM and stream its attention internals into
float64 accumulators. This package imports nothing; import the module you need. A scan, by job:

- :mod:`poslens.capture.plan`: ``plan_scan`` (validates every option of ``ScanConfig``, every
  input, writes nothing) -> ``ScanPlan``;
- :mod:`poslens.capture.load`: model-directory checks (pickle, remote code) and the loaders of
  config, tokenizer and weights with the poslens attention function;
- :mod:`poslens.capture.loop`: ``attach`` (the capture's hooks at named points), ``forward``,
  ``run_batches``: the one loop that drives a model;
- :mod:`poslens.capture.checkpoint`: atomic, fingerprinted checkpoints of the sums (per rank);
- :mod:`poslens.capture.scan`: ``run_scan``, the scan loop (resume, ranks, progress);
- :mod:`poslens.capture.finalize`: ``maps.safetensors``, ``summary.json`` and figures of a scan.

Underneath, the capture engine: :mod:`.attention` (the attention function registered with
transformers), :mod:`.engine` (``Capture``: one scan's capture, routing each layer's attention call),
:mod:`.attnpass` (one layer's attention pass, yielding the named intermediates), :mod:`.backends`
(torch, the C kernels or Triton: chosen in one place, and the chunk sizes), :mod:`.builtin` (the
built-in statistics, one module each, and their registry), :mod:`.users` (users' statistics fed
from the same pass), :mod:`.spec` (``CaptureSpec`` and the ``--stats`` values), :mod:`.options`
(``ScanConfig``: every scan option, declared once), :mod:`.sums` (reused workspaces, a layer's
float32 sums), :mod:`.results` (saving, loading, merging the sums), :mod:`.blocks` (``--map-size``
block means), :mod:`.rope` (RoPE undone), :mod:`.context` (which capture takes a call),
:mod:`.reference` (the readable eager capture every statistic is tested against), :mod:`.gram`
(the cosine maps' symmetric Gram), :mod:`.statistic` (``Statistic``, the protocol of users' own
statistics, and the capture points), :mod:`.stats` (mergeable accumulators and the noise groups),
:mod:`.sources` (``make_source``: deterministic, index-addressable sequences), :mod:`.adapters` (what
each architecture keeps where), :mod:`.model_source` (GGUF / directory sources), :mod:`.reservoir`,
:mod:`.distributed`, :mod:`.cuda_maps` (the Triton kernels), :mod:`.kernels` (small shared tensor
kernels).
"""
