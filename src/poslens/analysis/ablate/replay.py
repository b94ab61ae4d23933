"""The layers replayed: a layer-at-a-time condition reruns the model from the ablated layer on."""

from __future__ import annotations

import contextlib

import torch


# --------------------------------------------------------------------------------------------
# the layers replayed: a layer-at-a-time condition reruns the model from the ablated layer on
# --------------------------------------------------------------------------------------------
class LayerReplay:
    """Record each decoder layer's output in a forward, and replay the outputs of the first ``k``
    layers in a later forward of the same tokens (their modules do not run). The model's modules are
    given back as they were when the block ends."""

    def __init__(self, layers):
        self.layers = list(layers)
        self.outputs: list = [None] * len(self.layers)

    @contextlib.contextmanager
    def recording(self):
        def hook(i):
            def _h(_m, _args, out):
                self.outputs[i] = out
            return _h
        handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(self.layers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def replaying(self, k: int):
        """Layers ``0 .. k - 1`` return their recorded outputs (copies: a later layer may write in place)."""
        patched = []
        try:
            for i in range(k):
                m, out = self.layers[i], self.outputs[i]

                def _replay(*_a, _out=out, **_k):
                    if isinstance(_out, torch.Tensor):
                        return _out.clone()
                    if isinstance(_out, tuple):
                        return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in _out)
                    return _out
                had = "forward" in m.__dict__
                patched.append((m, had, m.__dict__.get("forward")))
                m.forward = _replay
            yield
        finally:
            for m, had, old in reversed(patched):
                if had:
                    m.forward = old
                else:
                    del m.forward

