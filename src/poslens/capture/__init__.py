"""Capture engine: run any Hugging Face causal LM and stream its attention internals into
float64 accumulators. This package imports nothing; import the module you need:

- :mod:`poslens.capture.scan`: ``ScanConfig`` + ``run_scan`` (writes a run directory), ``plan_scan``,
  ``attach``, ``load_model``;
- :mod:`poslens.capture.attention`: ``Capture`` / ``CaptureSpec`` and ``register`` (the attention
  function registered with transformers), for callers that drive their own forwards (e.g. a
  distributed driver that shards sequences and all-reduces ``capture.accs``);
- :mod:`poslens.capture.stats`: the mergeable accumulators and the noise-group statistics;
- :mod:`poslens.capture.sources`: ``make_source``, deterministic index-addressable sequences;
- :mod:`poslens.capture.loop`, ``adapters``, ``model_source``, ``reservoir``, ``distributed``, ``cuda_maps``.
"""
