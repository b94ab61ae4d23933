"""Analyses on captured data: one module per paper's measurements (tensors in, numbers out).

- :mod:`poslens.analysis.panels`: arXiv 2509.21042 nine-panel Gram decomposition of a
  layer and per-layer score maps with their non-relativity numbers;
- :mod:`poslens.analysis.slash`: slash-dominant heads, rank-one measures and the RoPE
  decomposition (arXiv 2601.08297);
- :mod:`poslens.analysis.dynamics`: the slash training-dynamics experiment.
"""
