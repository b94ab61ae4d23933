"""Per-architecture adapters: the one place that knows where an architecture keeps its decoder
layers, its rotary module(s), and the tensors an analysis reads (named capture points).

All supported architectures dispatch attention through transformers' ``AttentionInterface``
(post-RoPE q/k reach :func:`poslens.capture.engine.attention.poslens_attention`). Pre-RoPE q/k are
recovered by un-rotating with the cos/sin the layer's attention module received in the same
forward (its ``position_embeddings`` argument, captured with a forward pre-hook), which covers
q/k norms applied before RoPE (Qwen3, OLMo 2), fused qkv projections (Phi-3, GPT-NeoX), partial
rotary (Phi, Phi-3, GPT-NeoX: a suffix stays unrotated), per-layer-type rotary tables (Gemma 3's
sliding and global layers with two bases), the interleaved pair layout (Cohere) and scaled RoPE
variants. GPT-2 has learned absolute positions and no RoPE: its q/k are used as they are.

:func:`hook_point` registers a hook on one capture point (in the spirit of TransformerLens' hook names)
of a decoder layer, one of :data:`~poslens.capture.statistics.points.MODULE_POINTS` or
:data:`~poslens.capture.statistics.points.QK_POINTS` (the table of :mod:`poslens.capture.statistics.points`),
and hands the tensor to a callback.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from poslens.capture.engine.attention import ATTN_NAME, add_qk_hook
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import CaptureSpec
from poslens.capture.statistics.points import MODULE_POINTS, QK_POINTS
from poslens.errors import PoslensError, PoslensWarning


@dataclass(frozen=True)
class Adapter:
    """Where things live. Paths are attribute paths; ``a|b`` tries ``a`` then ``b`` (generic adapter)."""

    model_type: str
    layers_path: str = "model.layers"  # from the CausalLM to the ModuleList of decoder layers
    rotary_path: str | None = "model.rotary_emb"  # the rotary embedding module (None: no RoPE)
    attn_path: str = "self_attn"  # from a decoder layer to its attention module
    out_proj_path: str = "o_proj"  # from the attention module to its output projection
    mlp_path: str = "mlp"  # from a decoder layer to its MLP / MoE block
    #: decoder-layer module whose *input* is the residual stream after attention (None: parallel block)
    resid_mid_path: str | None = "post_attention_layernorm"
    rope_layout: str = "half"  # "half" (rotate_half: pair l with l + r/2) or "interleaved" (pairs 2l, 2l+1)
    #: the learned absolute position table (GPT-2's ``wpe``), one row per trained position: such a model
    #: cannot run past its trained context (None: positions of any length, RoPE or none)
    position_table: str | None = None
    generic: bool = False
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

    def _rope_params(self, config, layer: int | None = None) -> dict:
        rp = getattr(config, "rope_parameters", None) or {}
        if not isinstance(rp, dict):
            return {}
        types = getattr(config, "layer_types", None)
        if types and all(isinstance(v, dict) for v in rp.values()) and rp:  # per layer type (Gemma 3)
            key = types[layer] if layer is not None else ("full_attention" if "full_attention" in rp else next(iter(rp)))
            return rp.get(key) or {}
        return rp

    def rope_base(self, config, layer: int | None = None) -> float | None:
        """The config's RoPE base (the model's actual frequencies: :func:`rope_tables`)."""
        if self.rotary_path is None:
            return None
        base = self._rope_params(config, layer).get("rope_theta")
        return float(base or getattr(config, "rope_theta", 10000.0))

    def rotary_dim(self, config) -> int | None:
        if self.rotary_path is None:
            return None
        f = self._rope_params(config).get("partial_rotary_factor", None)
        f = f or getattr(config, "partial_rotary_factor", None) or getattr(config, "rotary_pct", None) or 1.0
        return int(self.head_dim(config) * float(f))

    # -- modules ----------------------------------------------------------------------------
    @staticmethod
    def _get(obj, path: str):
        """Follow an attribute path; ``a|b`` alternatives are tried in order (AttributeError if none)."""
        for alt in path.split("|"):
            cur = obj
            try:
                for part in alt.split("."):
                    cur = getattr(cur, part)
            except AttributeError:
                continue
            return cur
        raise AttributeError(path)

    def decoder_layers(self, model):
        return self._get(model, self.layers_path)

    def rotary_modules(self, model) -> list:
        """The model's rotary module(s) (empty without RoPE)."""
        if self.rotary_path is None:
            return []
        try:
            return [self._get(model, self.rotary_path)]
        except AttributeError:
            return []

    def rotary_module(self, model):
        mods = self.rotary_modules(model)
        return mods[0] if mods else None

    def attention_module(self, model, layer: int):
        return self._get(self.decoder_layers(model)[layer], self.attn_path)

    def point_module(self, model, point: str, layer: int):
        """``(module, kind)`` of a capture point: kind ``pre`` = the module's input, ``out`` = its output."""
        dl = self.decoder_layers(model)[layer]
        try:
            if point == "resid_pre":
                return dl, "pre"
            if point == "resid_post":
                return dl, "out"
            if point == "attn_in":
                return self._get(dl, self.attn_path), "pre"
            if point == "attn_z":
                return self._get(self._get(dl, self.attn_path), self.out_proj_path), "pre"
            if point == "attn_out":
                return self._get(self._get(dl, self.attn_path), self.out_proj_path), "out"
            if point == "mlp_in":
                return self._get(dl, self.mlp_path), "pre"
            if point == "mlp_out":
                return self._get(dl, self.mlp_path), "out"
            if point == "resid_mid":
                if self.resid_mid_path is None:
                    raise PoslensError(f"model type {self.model_type!r} runs attention and MLP in parallel: it has no "
                                       "residual stream between them (capture point resid_mid).")
                return self._get(dl, self.resid_mid_path), "pre"
        except AttributeError:
            raise PoslensError(f"capture point {point!r} of layer {layer} not found in {type(dl).__name__} "
                               f"(model type {self.model_type!r}).") from None
        raise PoslensError(f"unknown capture point {point!r}; known: {', '.join(MODULE_POINTS)}.")


def _first_tensor(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def hook_point(model, adapter: Adapter, point: str, layer: int, fn: Callable[[torch.Tensor], None]):
    """Call ``fn(tensor)`` with capture point ``point`` of decoder layer ``layer`` on every forward.

    Returns the hook handle (``handle.remove()`` detaches). The tensor is the live activation: copy
    it if it must outlive the callback.
    """
    if point in QK_POINTS:
        return _hook_qk(model, adapter, point, layer, fn)
    module, kind = adapter.point_module(model, point, layer)
    if kind == "pre":
        def _pre(_m, args, kwargs):
            fn(args[0] if args else kwargs["hidden_states"])
        return module.register_forward_pre_hook(_pre, with_kwargs=True)

    def _out(_m, _args, out):
        fn(_first_tensor(out))
    return module.register_forward_hook(_out)


class _QKHandle:
    """Removes a q/k capture-point hook (and its rotary-table pre-hook)."""

    def __init__(self, handle, pre_handle):
        self.handle, self.pre_handle = handle, pre_handle

    def remove(self) -> None:
        self.handle.remove()
        if self.pre_handle is not None:
            self.pre_handle.remove()
            self.pre_handle = None


def _hook_qk(model, adapter: Adapter, point: str, layer: int, fn):
    """q/k points: the callback goes into the attention function's registry under the layer's attention
    module (:func:`poslens.capture.engine.attention.add_qk_hook`); nothing is set on the module."""
    if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        raise PoslensError(f"capture point {point!r} needs the poslens attention (load the model with "
                           f"attn_implementation={ATTN_NAME!r}, e.g. poslens.capture.model.load.load_model).")
    attn = adapter.attention_module(model, layer)
    rope = layer in adapter.rope_layers(model.config) and bool(adapter.rotary_modules(model))
    state = {"cos_sin": None, "layout": adapter.rope_layout, "rope": rope}
    pre = hook_position_embeddings(model, adapter, layer, lambda _l, cs: state.__setitem__("cos_sin", cs)) \
        if rope else None
    return _QKHandle(add_qk_hook(attn, point, fn, state), pre)


def hook_position_embeddings(model, adapter: Adapter, layer: int, fn: Callable[[int, tuple], None]):
    """Call ``fn(layer, (cos, sin))`` with the rotary tables the layer's attention module receives."""
    attn = adapter.attention_module(model, layer)

    def _pre(_m, args, kwargs):
        pe = kwargs.get("position_embeddings")
        if pe is None and len(args) > 1 and isinstance(args[1], (tuple, list)):
            pe = args[1]
        if pe is not None:
            fn(layer, pe)
    return attn.register_forward_pre_hook(_pre, with_kwargs=True)


# --------------------------------------------------------------------------------------------
# RoPE as the model has it
# --------------------------------------------------------------------------------------------
def rope_tables(model, adapter: Adapter, config=None) -> dict | None:
    """The model's own RoPE frequencies, read from its rotary module (after a forward, so dynamic
    scaling has updated them): ``{"kinds": {kind: {"inv_freq": [...], "attention_scaling": s,
    "rotary_dim": r, "rope_type": t}}, "layer_kind": [kind or None per layer], "layout": ...}``.

    ``kind`` is the layer type for modules with one table per layer type (Gemma 3's
    ``sliding_attention`` / ``full_attention``), else ``"default"``; NoPE layers map to None.
    None when the model has no RoPE.
    """
    config = config or model.config
    rots = adapter.rotary_modules(model)
    if not rots:
        return None
    rot = rots[0]
    L = adapter.num_layers(config)
    kinds: dict[str, dict] = {}
    rope_layers = adapter.rope_layers(config)
    layer_types = getattr(rot, "layer_types", None)
    if layer_types and hasattr(rot, f"{layer_types[0]}_inv_freq"):
        for t in layer_types:
            if hasattr(rot, f"{t}_inv_freq"):
                kinds[t] = _table(getattr(rot, f"{t}_inv_freq"), getattr(rot, f"{t}_attention_scaling", 1.0),
                                  (getattr(rot, "rope_type", {}) or {}).get(t, "default"))
        per_layer = list(getattr(config, "layer_types"))
        layer_kind = [per_layer[l] if (l in rope_layers and per_layer[l] in kinds) else None for l in range(L)]
    else:
        kinds["default"] = _table(rot.inv_freq, getattr(rot, "attention_scaling", 1.0),
                                  getattr(rot, "rope_type", "default"))
        layer_kind = ["default" if l in rope_layers else None for l in range(L)]
    return {"kinds": kinds, "layer_kind": layer_kind, "layout": adapter.rope_layout}


def _table(inv_freq, scaling, rope_type) -> dict:
    f = torch.as_tensor(inv_freq).detach().to(torch.float64).cpu()
    return {"inv_freq": f.tolist(), "attention_scaling": float(scaling), "rotary_dim": 2 * int(f.numel()),
            "rope_type": str(rope_type)}


def layer_rope(rope: dict | None, layer: int) -> dict | None:
    """The table (``inv_freq``, ``attention_scaling``, ``rotary_dim``) a layer uses, or None (no RoPE)."""
    if not rope:
        return None
    kind = rope["layer_kind"][layer] if layer < len(rope["layer_kind"]) else None
    return rope["kinds"].get(kind) if kind is not None else None


# --------------------------------------------------------------------------------------------
# the registry
# --------------------------------------------------------------------------------------------
def _a(model_type: str, **kw) -> Adapter:
    return Adapter(model_type, **kw)


_GEMMA2_MID = dict(resid_mid_path="pre_feedforward_layernorm")

ADAPTERS: dict[str, Adapter] = {a.model_type: a for a in (
    _a("llama"),
    _a("mistral", notes="sliding window (config.sliding_window) applied when shorter than the sequence"),
    _a("mixtral", notes="sparse MoE MLP (mlp_in/mlp_out around the whole block); sliding window as Mistral"),
    _a("qwen2", notes="sliding window on layers >= max_window_layers when use_sliding_window"),
    _a("qwen2_moe", notes="sparse MoE MLP with a shared expert; sliding window as Qwen2"),
    _a("qwen3", notes="pre-RoPE q/k are after q_norm/k_norm"),
    _a("qwen3_moe", notes="q_norm/k_norm before RoPE; sparse MoE MLP"),
    _a("gemma", notes="logit scale from query_pre_attn_scalar via the module; embeddings scaled by sqrt(d)"),
    _a("gemma2", **_GEMMA2_MID, notes="attention logit soft-capping (eager computation, captured logits capped); "
       "sliding and global layers; sandwich norms (resid_mid = input of pre_feedforward_layernorm)"),
    _a("gemma3_text", **_GEMMA2_MID, notes="sliding and global layers with one rotary table each (two bases, the "
       "global one possibly scaled); q_norm/k_norm before RoPE; sandwich norms"),
    _a("phi", out_proj_path="dense", resid_mid_path=None, notes="partial rotary; parallel attention and MLP "
       "(no resid_mid); output projection `dense`"),
    _a("phi3", notes="fused qkv_proj; partial rotary leaves a suffix unrotated"),
    _a("olmo2", resid_mid_path="mlp", notes="q_norm/k_norm over all heads before RoPE; norms after attention and "
       "MLP (resid_mid = mlp_in: the MLP reads the residual stream unnormalised)"),
    _a("gpt_neox", layers_path="gpt_neox.layers", rotary_path="gpt_neox.rotary_emb", attn_path="attention",
       out_proj_path="dense", resid_mid_path=None, notes="fused query_key_value; partial rotary (rotary_pct); "
       "parallel residual (no resid_mid; with use_parallel_residual=False resid_mid is not exposed either)"),
    _a("starcoder2", notes="LayerNorm with bias; sliding window as Mistral"),
    _a("granite", notes="embedding, residual, attention and logit multipliers (attention_multiplier is the "
       "logit scale)"),
    _a("cohere", resid_mid_path=None, rope_layout="interleaved", notes="interleaved RoPE pairs (2l, 2l+1): "
       "un-rotated in that layout and stored reordered to the rotate_half layout; parallel attention and MLP"),
    _a("smollm3", notes="NoPE layers from config.no_rope_layers"),
    _a("gpt2", layers_path="transformer.h", rotary_path=None, attn_path="attn", out_proj_path="c_proj",
       resid_mid_path="ln_2", position_table="transformer.wpe",
       notes="learned absolute positions, no RoPE; fused c_attn (Conv1D)"),
)}

#: heuristics for an architecture not on the list (checked by a dry run, :func:`check_dispatch`)
GENERIC = dict(layers_path="model.layers|transformer.h|gpt_neox.layers|model.decoder.layers|transformer.layers",
               rotary_path="model.rotary_emb|gpt_neox.rotary_emb|transformer.rotary_emb|model.decoder.rotary_emb",
               attn_path="self_attn|attention|attn", out_proj_path="o_proj|dense|c_proj|out_proj",
               mlp_path="mlp|feed_forward|block_sparse_moe", resid_mid_path="post_attention_layernorm|ln_2")


def supported() -> str:
    return ", ".join(sorted(ADAPTERS))


def get_adapter(config, *, allow_generic: bool = True) -> Adapter:
    """The adapter for ``config.model_type``. An unlisted decoder gets the generic adapter with a
    one-line warning (its attention dispatch is checked by a dry run after loading)."""
    mt = getattr(config, "model_type", None)
    if mt in ADAPTERS:
        return ADAPTERS[mt]
    has_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    has_heads = any(n in config.to_dict() for n in ("num_attention_heads", "n_head"))  # no attention: Mamba, RWKV
    if not allow_generic or getattr(config, "is_encoder_decoder", False) or not (has_layers and has_heads):
        raise PoslensError(f"model type {mt!r} is not supported by scan; supported: {supported()}.")
    warnings.warn(f"model type {mt!r} has no adapter; using the generic one (layers, rotary module and capture "
                  f"points found by name, attention dispatch checked by a dry run; supported: {supported()}).",
                  PoslensWarning, stacklevel=2)
    return Adapter(mt, generic=True, notes="generic", **GENERIC)


def check_dispatch(model, adapter: Adapter, *, seq_len: int = 4) -> dict:
    """Dry run: one forward of one short sequence through the poslens attention; every decoder layer
    must reach it. Returns ``{"windows": [...], "scaling": [...]}`` per decoder layer: the sliding
    window it asked for (None = full causal) and its logit scale.

    Raises :class:`PoslensError` naming the model type when the architecture bypasses
    ``AttentionInterface`` (custom attention code) or its layers cannot be found.
    """
    config = model.config
    try:
        layers = adapter.decoder_layers(model)
    except AttributeError:
        raise PoslensError(f"model type {adapter.model_type!r}: cannot find its decoder layers (tried "
                           f"{adapter.layers_path.replace('|', ', ')}); supported: {supported()}.") from None
    reason = None
    if getattr(config, "_attn_implementation", None) != ATTN_NAME:
        reason = f"it runs {getattr(config, '_attn_implementation', None)!r} attention, not the registered function"
    else:
        spec = CaptureSpec(num_layers=len(layers), num_heads=adapter.num_heads(config),
                           num_kv_heads=adapter.num_kv_heads(config), head_dim=adapter.head_dim(config),
                           seq_len=seq_len, layers=[])
        probe = Capture(spec)
        dev = next(model.parameters()).device
        ids = torch.full((1, seq_len), 3, dtype=torch.long, device=dev)
        with torch.no_grad(), probe.active():
            model(input_ids=ids, use_cache=False)
        missing = [l for l in range(len(layers)) if l not in probe.seen_layers]
        if not missing:
            return {"windows": [probe.windows.get(l) for l in range(len(layers))],
                    "scaling": [probe.scalings.get(l) for l in range(len(layers))]}
        reason = f"layers {missing[:5]}{'...' if len(missing) > 5 else ''} never called the attention interface"
    raise PoslensError(f"model type {adapter.model_type!r} uses custom attention code that bypasses transformers' "
                       f"AttentionInterface ({reason}); poslens cannot capture it. Supported: {supported()}.")
