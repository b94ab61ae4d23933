"""The capture: run any Hugging Face causal LM and stream its attention internals into float64
accumulators. This package imports nothing; import the module you need. Top to bottom:

- :mod:`.scan`: one scan, in order: its options (``ScanConfig``), the plan that validates them,
  the run, checkpoints, ranks, and the run directory it finalizes;
- :mod:`.model`: where a model comes from (HF directory, GGUF, a model the caller holds), the
  checks before loading, and what each architecture keeps where (the adapters);
- :mod:`.engine`: the attention function registered with transformers, the ``Capture`` that
  takes each layer's call, what it captures (``CaptureSpec``), interventions, and the one loop
  that drives a model forwards;
- :mod:`.backends`: one layer's attention pass and its intermediates, computed by torch, the C
  kernels or Triton; the float32 sums, block means, the cosine Gram, RoPE undone;
- :mod:`.statistics`: the ``Statistic`` protocol and the capture points, the mergeable
  accumulators, users' statistics, the q/k reservoir, the built-in statistics and the readable
  reference every one of them is tested against.
"""
