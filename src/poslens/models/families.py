"""Small-model families as plain Hugging Face configurations, with size presets.

Three positional-encoding families, all loadable with ``AutoModelForCausalLM.from_pretrained``
and no custom modelling code:

- ``none`` (NoPE): a SmolLM3 configuration whose ``no_rope_layers`` is all zero. In
  transformers' SmolLM3, ``no_rope_layers[i] == 1`` means layer ``i`` *uses* RoPE and ``0`` makes
  it a NoPE layer, so all zeros is a Llama-style decoder (RMSNorm, SwiGLU, GQA) with no
  positional encoding at all: position can only come from the causal mask (arXiv 2501.00073,
  arXiv 2509.21042).
- ``rope``: the same configuration with ``no_rope_layers`` all one (RoPE in every layer,
  ``rope_theta`` configurable).
- ``learned``: GPT-2 (learned absolute position embeddings, LayerNorm, GELU), dropout off.

Presets run from ``micro`` (seconds on CPU, for tests) to ``1b`` (a GPU model shaped like a
Llama-3-style 1B: 16 layers, width 2048, 32 query heads, 8 KV heads). Any preset field can be
overridden. ``init_std`` is the standard deviation of the normal weight initialisation
(``initializer_range``); the random-initialisation sweep of arXiv 2501.00073 uses 0.0002 to 2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from poslens.errors import PoslensError

PE_CHOICES = ("none", "rope", "learned")


@dataclass(frozen=True)
class Preset:
    """Shape of a model; ``intermediate`` is the MLP width, ``max_positions`` the context size."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int
    note: str = ""


PRESETS: dict[str, Preset] = {
    "micro": Preset(2, 32, 2, 1, 64, 256, "tests: a few seconds on CPU"),
    "tiny": Preset(3, 128, 4, 2, 384, 512, "CPU: positional tasks in minutes"),
    "small": Preset(6, 384, 6, 2, 1024, 1024, "CPU/GPU: the 6-layer, 6-head, d=384 shape of arXiv 2501.00073"),
    "base": Preset(12, 768, 12, 4, 2048, 2048, "GPU: about 100M parameters plus embeddings"),
    "1b": Preset(16, 2048, 32, 8, 8192, 4096, "GPU: Llama-3-style 1B shape"),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise PoslensError(f"--preset {name!r} is unknown; choose one of {', '.join(PRESETS)}.")
    return PRESETS[name]


def resolve_shape(preset: str, *, layers: int | None = None, hidden: int | None = None, heads: int | None = None,
                  kv_heads: int | None = None, intermediate: int | None = None,
                  max_positions: int | None = None) -> Preset:
    """The preset with any given field overridden, validated (divisibility, positivity)."""
    base = get_preset(preset)
    over = {k: v for k, v in dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                                   intermediate=intermediate, max_positions=max_positions).items() if v is not None}
    if "heads" in over and "kv_heads" not in over:
        # Keep the preset's query/KV ratio when it still divides; otherwise plain multi-head.
        ratio = base.heads // base.kv_heads
        over["kv_heads"] = over["heads"] // ratio if over["heads"] % ratio == 0 else over["heads"]
    if "hidden" in over and "intermediate" not in over:
        over["intermediate"] = max(1, round(base.intermediate * over["hidden"] / base.hidden))
    shape = dataclasses.replace(base, **over)
    for name, flag in (("layers", "--num-layers"), ("hidden", "--hidden"), ("heads", "--num-heads"),
                       ("kv_heads", "--num-kv-heads"), ("intermediate", "--intermediate"),
                       ("max_positions", "--max-positions")):
        if getattr(shape, name) < 1:
            raise PoslensError(f"{flag} must be >= 1 (got {getattr(shape, name)}).")
    if shape.hidden % shape.heads:
        raise PoslensError(f"--hidden {shape.hidden} is not divisible by --num-heads {shape.heads}; pick sizes that divide.")
    if shape.heads % shape.kv_heads:
        raise PoslensError(f"--num-heads {shape.heads} is not divisible by --num-kv-heads {shape.kv_heads}; "
                           "the query heads must split evenly over the key/value heads.")
    if (shape.hidden // shape.heads) % 2:
        raise PoslensError(f"head dimension {shape.hidden // shape.heads} is odd; RoPE needs an even head dimension.")
    return shape


def build_config(pe: str, preset: str = "micro", vocab_size: int = 256, *, rope_theta: float = 10000.0,
                 init_std: float = 0.02, bos_token_id: int | None = None, eos_token_id: int | None = None,
                 pad_token_id: int | None = None, **overrides):
    """A plain transformers config for ``pe`` in ``PE_CHOICES`` at the given preset.

    ``overrides`` may set ``layers``, ``hidden``, ``heads``, ``kv_heads``, ``intermediate``,
    ``max_positions`` (``None`` values keep the preset's).
    """
    if pe not in PE_CHOICES:
        raise PoslensError(f"--pe {pe!r} is unknown; choose one of {', '.join(PE_CHOICES)}.")
    if not (init_std > 0):
        raise PoslensError(f"--init-std must be > 0 (got {init_std}).")
    if not (rope_theta > 0):
        raise PoslensError(f"--rope-theta must be > 0 (got {rope_theta}).")
    if vocab_size < 2:
        raise PoslensError(f"vocabulary size must be >= 2 (got {vocab_size}).")
    shape = resolve_shape(preset, **overrides)
    if pe == "learned":
        from transformers import GPT2Config

        if shape.kv_heads != shape.heads and overrides.get("kv_heads") is not None:
            raise PoslensError("--num-kv-heads: the learned-PE family (GPT-2) has no grouped-query attention; "
                               "leave --num-kv-heads unset or equal to --num-heads.")
        return GPT2Config(
            vocab_size=vocab_size, n_positions=shape.max_positions, n_embd=shape.hidden, n_layer=shape.layers,
            n_head=shape.heads, n_inner=shape.intermediate, activation_function="gelu_new",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=float(init_std),
            bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
            tie_word_embeddings=True, use_cache=True,
        )
    from transformers import SmolLM3Config

    flag = 1 if pe == "rope" else 0  # SmolLM3: 1 = this layer applies RoPE, 0 = NoPE layer
    return SmolLM3Config(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions, initializer_range=float(init_std),
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        no_rope_layers=[flag] * shape.layers, use_sliding_window=False,
        bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
        tie_word_embeddings=True, attention_dropout=0.0, use_cache=True,
    )


def build_model(pe: str, preset: str = "micro", vocab_size: int = 256, *, seed: int | None = 0, **kwargs):
    """A freshly initialised ``AutoModelForCausalLM`` for ``pe`` (see :func:`build_config`).

    With ``seed`` set, the initial weights are a deterministic function of the seed, and the global
    torch RNG is left as it was (the weights are drawn from a forked one).
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(pe, preset, vocab_size, **kwargs)
    if seed is None:
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def pe_of(config) -> str:
    """Which family a loaded config belongs to: ``none``, ``rope``, ``learned`` or ``mixed``/``other``."""
    if getattr(config, "model_type", None) == "gpt2":
        return "learned"
    flags = getattr(config, "no_rope_layers", None)
    if flags is None:
        return "other"
    if all(f == 0 for f in flags):
        return "none"
    if all(f == 1 for f in flags):
        return "rope"
    return "mixed"


def count_parameters(model, *, non_embedding: bool = False) -> int:
    """Number of distinct parameters (tied weights counted once); optionally without embeddings."""
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if non_embedding and ("embed" in name or name.endswith("wte.weight") or name.endswith("wpe.weight")):
            continue
        total += p.numel()
    return total
