"""poslens: where positional information in causal transformers comes from.

The flow is one pipeline for every analysis: a source of sequences -> a model (simulated,
trained here, or any Hugging Face causal LM) -> capture into streaming accumulators -> metrics
(pure functions of accumulated tensors) -> a run directory -> report.
"""

__version__ = "0.1.0"

from poslens.errors import PoslensError  # noqa: E402

__all__ = ["PoslensError", "__version__"]
