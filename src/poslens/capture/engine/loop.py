"""The one capture loop: every command drives its model forwards through here.

A forward is always ``no_grad``, without a KV cache, with ``logits_to_keep=1`` where the model's
forward accepts it (the LM head's ``[B, S, vocab]`` logits are never read by an analysis: at 4k
tokens they are gigabytes), with the capture (if any) active, and with the adapter's capture
points hooked only for its duration. :func:`run_batches` adds batching over an index-addressable
sequence source and one progress bar; ``scan`` keeps its own checkpoint/resume/distributed
bookkeeping around :func:`forward`.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable

import torch

from poslens.capture.model.adapters import Adapter, hook_point, hook_position_embeddings
from poslens.capture.engine.capture import Capture
from poslens.progress import task_progress


def forward_kwargs(model) -> dict:
    """``use_cache=False`` and, when accepted, ``logits_to_keep=1``."""
    kw = {"use_cache": False}
    try:
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            kw["logits_to_keep"] = 1
    except (TypeError, ValueError):
        pass
    return kw


def forward(model, input_ids: torch.Tensor, *, capture=None, kwargs: dict | None = None, seq_start: int | None = None):
    """One forward of ``input_ids [B, S]``: no grad, no cache, the capture active (its batch begun and
    ended around the call). Returns the model output."""
    kw = forward_kwargs(model) if kwargs is None else kwargs
    if capture is not None:
        capture.begin_batch(input_ids.shape[0], seq_start=seq_start)
    ctx = capture.active() if capture is not None else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        out = model(input_ids=input_ids, **kw)
    if capture is not None:
        capture.end_batch()
    return out


@contextlib.contextmanager
def hooked(model, adapter: Adapter, points: dict[tuple[str, int], Callable[[torch.Tensor], None]]):
    """Hook every ``(point, layer) -> fn`` of ``points`` for the duration of the block."""
    handles = []
    try:
        for (point, layer), fn in points.items():
            handles.append(hook_point(model, adapter, point, layer, fn))
        yield
    finally:
        for h in handles:
            h.remove()


def run_batches(model, source, *, batch_size: int, device, capture=None,
                on_batch: Callable[[int, int], None] | None = None, progress: bool = True,
                description: str = "forward", update: Callable | None = None) -> int:
    """Forward every sequence of ``source`` (``source.batch(start, stop)``, ``source.num_seqs``) in
    batches; ``on_batch(start, stop)`` runs after each forward (to reduce what hooks collected).
    Progress: one bar (or the caller's ``update(done)``). Returns the number of tokens seen."""
    N = source.num_seqs
    kw = forward_kwargs(model)
    tokens = 0
    bar = task_progress(description, N, enabled=progress and update is None)
    with bar as own_update:
        upd = update or own_update
        for s in range(0, N, batch_size):
            e = min(N, s + batch_size)
            ids = source.batch(s, e).to(device)
            forward(model, ids, capture=capture, kwargs=kw, seq_start=s)
            tokens += ids.numel()
            if on_batch is not None:
                on_batch(s, e)
            upd(e)
    return tokens


class TensorSource:
    """An in-memory ``[N, S]`` id tensor as a sequence source for :func:`run_batches`."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids
        self.num_seqs, self.seq_len = ids.shape

    def batch(self, start: int, stop: int) -> torch.Tensor:
        return self.ids[start:stop]


# --------------------------------------------------------------------------------------------
# capture wiring
# --------------------------------------------------------------------------------------------
def attach(model, adapter: Adapter, capture: Capture) -> list:
    """Hooks that feed the capture (only while it is active): the rotary cos/sin each layer's attention
    receives, and the residual stream at the adapter's capture points (``resid_pre`` of layer 0 = the
    embeddings, ``resid_post`` of every captured layer). Returns the handles (``h.remove()`` detaches)."""
    handles = []
    layers = adapter.decoder_layers(model)
    capture.bind(adapter.attention_module(model, l) for l in range(len(layers)))  # this model's calls only
    if capture.spec.rope_layers:
        def _rope(layer, cos_sin):
            if capture.is_active():
                capture.rope_by_layer[layer] = (cos_sin[0], cos_sin[1])
        handles += [hook_position_embeddings(model, adapter, l, _rope) for l in range(len(layers))]

    for point in capture.residual_points():  # users' statistics that read the residual stream
        handles += [hook_point(model, adapter, point, l, lambda x, l=l, p=point: capture.is_active()
                               and capture.observe_point(l, p, x)) for l in capture.spec.layers]
    if not capture.reads_hidden():
        return handles  # no built-in statistic reads the residual stream

    def _emb(x):
        if capture.is_active():
            capture.observe_hidden(0, x)
    handles.append(hook_point(model, adapter, "resid_pre", 0, _emb))
    for k, l in enumerate(capture.spec.layers):
        def _post(x, index=k + 1):
            if capture.is_active():
                capture.observe_hidden(index, x)
        handles.append(hook_point(model, adapter, "resid_post", l, _post))
    return handles
