"""Per-architecture adapters: where the decoder layers and the rotary module live, which layers
rotate, and the model's geometry.

All supported architectures dispatch attention through transformers' ``AttentionInterface``
(post-RoPE q/k reach :func:`poslens.capture.attention.poslens_attention`). Pre-RoPE q/k are
recovered by un-rotating with the cos/sin the model's own rotary module produced in the same
forward (captured with a forward hook), which also covers q/k norms applied before RoPE (Qwen3),
the fused qkv projection (Phi-3, whose partial rotary leaves a suffix unrotated) and scaled RoPE
variants. GPT-2 has learned absolute positions and no RoPE: its q/k are used as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from poslens.errors import PoslensError


@dataclass(frozen=True)
class Adapter:
    model_type: str
    layers_path: str  # attribute path from the CausalLM to the ModuleList of decoder layers
    rotary_path: str | None  # attribute path to the rotary embedding module (None: no RoPE)
    notes: str = ""

    # -- geometry ---------------------------------------------------------------------------
    def num_layers(self, config) -> int:
        return int(getattr(config, "num_hidden_layers", None) or config.n_layer)

    def num_heads(self, config) -> int:
        return int(getattr(config, "num_attention_heads", None) or config.n_head)

    def num_kv_heads(self, config) -> int:
        return int(getattr(config, "num_key_value_heads", None) or self.num_heads(config))

    def head_dim(self, config) -> int:
        hd = getattr(config, "head_dim", None)
        return int(hd) if hd else int(config.hidden_size // self.num_heads(config))

    def max_positions(self, config) -> int | None:
        for name in ("max_position_embeddings", "n_positions"):
            v = getattr(config, name, None)
            if v:
                return int(v)
        return None

    def rope_layers(self, config) -> set[int]:
        """Layers that apply RoPE to q/k."""
        if self.rotary_path is None:
            return set()
        L = self.num_layers(config)
        flags = getattr(config, "no_rope_layers", None)  # SmolLM3: 1 = this layer uses RoPE
        if flags is not None and self.model_type == "smollm3":
            return {i for i in range(L) if int(flags[i])}
        return set(range(L))

    def rope_base(self, config) -> float | None:
        rp = getattr(config, "rope_parameters", None) or {}
        base = rp.get("rope_theta") if isinstance(rp, dict) else None
        return float(base or getattr(config, "rope_theta", 10000.0)) if self.rotary_path else None

    def rotary_dim(self, config) -> int | None:
        if self.rotary_path is None:
            return None
        rp = getattr(config, "rope_parameters", None) or {}
        f = rp.get("partial_rotary_factor", None) if isinstance(rp, dict) else None
        f = f or getattr(config, "partial_rotary_factor", 1.0) or 1.0
        return int(self.head_dim(config) * float(f))

    # -- modules ----------------------------------------------------------------------------
    def _get(self, model, path: str):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj

    def decoder_layers(self, model):
        return self._get(model, self.layers_path)

    def rotary_module(self, model):
        return self._get(model, self.rotary_path) if self.rotary_path else None


_LLAMA_LIKE = dict(layers_path="model.layers", rotary_path="model.rotary_emb")

ADAPTERS: dict[str, Adapter] = {
    "llama": Adapter("llama", **_LLAMA_LIKE),
    "mistral": Adapter("mistral", **_LLAMA_LIKE, notes="sliding window applied when shorter than the sequence"),
    "qwen2": Adapter("qwen2", **_LLAMA_LIKE),
    "qwen3": Adapter("qwen3", **_LLAMA_LIKE, notes="pre-RoPE q/k are after q_norm/k_norm"),
    "gemma": Adapter("gemma", **_LLAMA_LIKE, notes="logit scale from query_pre_attn_scalar via the module"),
    "phi3": Adapter("phi3", **_LLAMA_LIKE, notes="fused qkv_proj; partial rotary leaves a suffix unrotated"),
    "smollm3": Adapter("smollm3", **_LLAMA_LIKE, notes="NoPE layers from config.no_rope_layers"),
    "gpt2": Adapter("gpt2", layers_path="transformer.h", rotary_path=None, notes="learned absolute positions"),
}


def get_adapter(config) -> Adapter:
    """The adapter for ``config.model_type``; a clear error for unsupported architectures."""
    mt = getattr(config, "model_type", None)
    if mt not in ADAPTERS:
        raise PoslensError(f"model type {mt!r} is not supported by scan; supported: {', '.join(sorted(ADAPTERS))}.")
    return ADAPTERS[mt]
