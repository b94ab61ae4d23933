"""poslens: where positional information in causal transformers comes from.

The flow is one pipeline for every analysis: a source of sequences -> a model (simulated,
trained here, or any Hugging Face causal LM) -> capture into streaming accumulators -> metrics
(pure functions of accumulated tensors) -> a run directory -> report.

The Python face (docs/python.md)::

    import poslens
    r = poslens.scan(model, data="stdlib")      # a loaded causal LM, or a model path
    r.heads(), r.layers(), r.maps["probs"], r.plot("scores", layer=3)
    r.save("runs/x"); poslens.load("runs/x")
    poslens.explore(r, out="explore.html")      # an interactive page (r.explore() in Jupyter)

Importing poslens changes nothing process-wide (environment, warning hooks, torch's threads); the
functions below import torch and transformers when first called.
"""

__version__ = "0.1.0"

from poslens.errors import PoslensError  # noqa: E402

#: the public functions and classes, imported on first use (``import poslens`` stays light)
_API = {**{name: "poslens.api" for name in ("scan", "simulate", "slash", "neighborhood", "panels", "kim_maps",
                                             "probes", "sweep", "fingerprint", "ablate", "report", "load",
                                             "Result", "compare", "CompareResult", "explore")},
        "Statistic": "poslens.capture.statistics.protocol", "Explorer": "poslens.explorer"}

__all__ = ["PoslensError", "__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib
        import random

        state = random.getstate()  # what the imports draw from the global stream (rich's style ids) is put back
        try:
            value = getattr(importlib.import_module(_API[name]), name)
        finally:
            random.setstate(state)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'poslens' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
