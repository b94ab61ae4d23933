"""The layers replayed: a layer-at-a-time condition reruns the model from the ablated layer on.

A condition whose first ablated layer is ``k`` leaves layers ``0 .. k - 1`` as they are, so their
outputs are those of the unmodified forward of the same tokens: :class:`LayerReplay` records every
decoder layer's output in that forward and hands layer ``k`` the recorded input in the condition's.

Through torch hooks only, removed when the block ends: no module's ``forward`` is replaced and
nothing is set on a module. A hook cannot skip a module (``Module.__call__`` always runs its
``forward``), so the replayed layers still run, on one token: a forward pre-hook on each of layers
``0 .. k - 1`` cuts every tensor it is handed (hidden states, rotary tables, mask, positions) to the
first token of the first sequence, and a forward hook on layer ``k - 1`` replaces its output by the
recorded one (a copy: a later layer may write in place). Where a model's layers cannot run on one
token, they run on the batch's first sequence (a pre-hook on layer 0 hands it that one sequence). Layer ``k`` on sees exactly the tensors it saw in the full forward, so the
losses are those of a full forward, bit for bit (``run_ablate`` checks it once per run). The
replayed layers cost what one token costs, where they cost a sequence (``B`` times less than the
batch) when they ran on the first sequence: on a tiny Llama (8 layers, hidden 256, 256 tokens,
batches of 4, one CPU thread) that ran 17 % above the floor of not running them at all.
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
    def replaying(self, k: int, one_token: bool = True):
        """Layers ``0 .. k - 1`` give the recorded output of layer ``k - 1`` (copies); ``k = 0``: no replay.
        The replayed layers run on the first token of the batch's first sequence (``one_token``: every
        tensor a layer is handed cut to it, :func:`_first_token`), else on the first sequence."""
        if k <= 0:
            yield
            return
        recorded = self.outputs[k - 1]
        if recorded is None:
            raise RuntimeError(f"layer {k - 1}: no output recorded to replay")
        S = recorded[0].shape[1] if isinstance(recorded, tuple) else recorded.shape[1]

        def _one_sequence(_m, args, kwargs):
            if args:
                return (args[0][:1], *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"][:1]}

        def _one_token(_m, args, kwargs):
            return tuple(_first_token(a, S) for a in args), {n: _first_token(v, S) for n, v in kwargs.items()}

        def _recorded(_m, _args, _out):
            return _copy(recorded)

        pre = ([m.register_forward_pre_hook(_one_token, with_kwargs=True) for m in self.layers[:k]] if one_token
               else [self.layers[0].register_forward_pre_hook(_one_sequence, with_kwargs=True)])
        handles = [*pre, self.layers[k - 1].register_forward_hook(_recorded)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def _first_token(x, S: int):
    """``x`` cut to the first token of the first sequence: a tensor's batch dimension to 1 and each of its
    dimensions of length ``S`` (positions) to 1; tuples and lists element by element; anything else as
    it is."""
    if isinstance(x, torch.Tensor):
        if x.ndim == 0:
            return x
        idx = tuple(slice(0, 1) if (d == 0 or n == S) else slice(None) for d, n in enumerate(x.shape))
        return x[idx]
    if isinstance(x, (tuple, list)):
        return type(x)(_first_token(v, S) for v in x)
    return x
