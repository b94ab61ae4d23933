"""The layers replayed: a layer-at-a-time condition reruns the model from the ablated layer on.

A condition whose first ablated layer is ``k`` leaves layers ``0 .. k - 1`` as they are, so their
outputs are those of the unmodified forward of the same tokens: :class:`LayerReplay` records every
decoder layer's output in that forward and hands layer ``k`` the recorded input in the condition's.

Through torch hooks only, removed when the block ends: no module's ``forward`` is replaced and
nothing is set on a module. A hook cannot skip a module (``Module.__call__`` always runs its
``forward``), so the replayed layers still run, on the batch's first sequence alone: a forward
pre-hook on layer 0 hands it that one sequence, layers 1 .. k - 1 take what the layer before them
gives, and a forward hook on layer ``k - 1`` replaces its output by the recorded one (a copy: a later
layer may write in place). Layer ``k`` on sees exactly the tensors it saw in the full forward, so the
losses are those of a full forward, bit for bit (``run_ablate`` checks it once per run). The
replayed layers cost what one sequence costs instead of the batch's ``B``: ``poslens ablate`` of
every layer in turn on a tiny Llama (8 layers, hidden 256, 256 tokens, batches of 4, one CPU thread)
takes about 17 % more CPU time than with the replayed layers not run at all, and 25 % less than
without the replay (full forwards); at hidden 64, where the per-call overhead weighs more, 30 % more
and 14 % less.
"""

from __future__ import annotations

import contextlib

import torch


def _copy(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in out)
    return out


class LayerReplay:
    """Record each decoder layer's output in a forward, and replay the outputs of the first ``k``
    layers in a later forward of the same tokens (they run on one sequence, their outputs unused).
    Every hook is removed when the block ends."""

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
        """Layers ``0 .. k - 1`` give the recorded output of layer ``k - 1`` (copies); ``k = 0``: no replay."""
        if k <= 0:
            yield
            return
        recorded = self.outputs[k - 1]
        if recorded is None:
            raise RuntimeError(f"layer {k - 1}: no output recorded to replay")

        def _one_sequence(_m, args, kwargs):
            if args:
                return (args[0][:1], *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"][:1]}

        def _recorded(_m, _args, _out):
            return _copy(recorded)

        handles = [self.layers[0].register_forward_pre_hook(_one_sequence, with_kwargs=True),
                   self.layers[k - 1].register_forward_hook(_recorded)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
