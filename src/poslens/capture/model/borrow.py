"""A model the caller already holds, borrowed for one scan and handed back exactly as it was.

A scan needs three things of a model: its attention dispatched to poslens' registered function
(so that the capture sees q, k and the weights), eval mode (no dropout) and hooks on its capture
points. :func:`borrowed` sets the first two for the duration of a block and restores them after it,
also when the block raises; the hooks are removed by whoever attached them (``capture.loop``).
Weights are never copied, cast or moved: the scan runs the model on the device(s) and in the dtype
it has.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from poslens.capture.engine.attention import ATTN_NAME, register
from poslens.errors import PoslensError


def check_causal_lm(model) -> None:
    """Refuse an object that is not a loaded Hugging Face causal LM, naming what it is."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise PoslensError(f"model: expected a loaded transformers causal LM (AutoModelForCausalLM.from_pretrained(...)) "
                           f"or a path to a model directory / .gguf file; got {type(model).__name__}.")
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None \
            or getattr(model.config, "is_encoder_decoder", False):
        raise PoslensError(f"model: {type(model).__name__} is not a causal language model (no LM head, or an "
                           "encoder-decoder); load it with AutoModelForCausalLM.")


def model_device(model) -> str:
    """The device of the model's first parameter (a ``device_map`` model: its first device)."""
    try:
        return str(next(model.parameters()).device)
    except StopIteration:
        return "cpu"


def model_dtype(model) -> torch.dtype:
    """The dtype most of the model's floating-point parameters have."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.dtype.is_floating_point:
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=counts.get) if counts else torch.float32


def _configs(model) -> list:
    """Every distinct config object the model and its submodules hold (sub-configs included)."""
    seen: dict[int, object] = {}
    stack = [m.config for m in model.modules() if getattr(m, "config", None) is not None]
    while stack:
        c = stack.pop()
        if id(c) in seen or not hasattr(c, "_attn_implementation_internal"):
            continue
        seen[id(c)] = c
        for key in getattr(c, "sub_configs", {}) or {}:
            sub = getattr(c, key, None)
            if sub is not None:
                stack.append(sub)
    return list(seen.values())


@contextlib.contextmanager
def borrowed(model) -> Iterator[object]:
    """``model`` with poslens attention and in eval mode inside the block; its attention implementation
    (on every config it holds) and every module's training flag are restored after it."""
    check_causal_lm(model)
    register()
    configs = _configs(model)
    attn = [(c, c._attn_implementation_internal) for c in configs]
    training = [(m, m.training) for m in model.modules()]
    try:
        if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
            try:
                model.set_attn_implementation(ATTN_NAME)
            except (ValueError, AttributeError) as e:  # an architecture that cannot switch (checked again later)
                raise PoslensError(f"model: {type(model).__name__} cannot run poslens' attention function "
                                   f"({str(e).splitlines()[0][:160]}).") from None
        model.eval()
        yield model
    finally:
        for c, impl in attn:
            c._attn_implementation_internal = impl
        for m, was in training:
            m.training = was
