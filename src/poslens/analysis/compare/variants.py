"""The variants ``poslens compare`` puts side by side: parsed from ``--variant`` specs, applied to a loaded
model for the length of a block and undone after it.

The specs (:func:`parse_variant`):

- ``rope-scaling=TYPE:FACTOR``, ``TYPE`` one of ``linear``, ``dynamic``, ``yarn``, ``llama3``: the rotary
  module rebuilt by transformers' own RoPE code from a copy of the config whose ``rope_parameters`` carry
  that scaling (``original_max_position_embeddings`` = the model's ``max_position_embeddings``; ``llama3``
  with Llama-3.1's ``low_freq_factor=1``, ``high_freq_factor=4``); a config with one set of parameters per
  layer type (Gemma 3) has every layer type's parameters scaled;
- ``rope-theta=X``: the same, with the RoPE base ``X`` (the scaling the model has is kept);
- ``dtype=bfloat16|float16|float32`` (``bf16``, ``fp16``, ``fp32``): the floating parameters and buffers
  cast (the rotary modules' frequency tables stay as they are, as ``from_pretrained(dtype=...)`` leaves
  them in float32);
- ``window=W``: the model's sliding-window layers (every layer of a model without them) attend to
  themselves and the ``W`` keys before them, through ablate's ``window:W`` intervention;
- ``NAME@LAYERS``: an ablate intervention (``rope-off@3``, ``sink-off@all``, ``rope-band:low@0,3``,
  ``window:16@2``, ``massive-qk@5``), in ablate's syntax; the layers are read against the model's layer
  count when applied; ``each`` is refused (a variant is one model).

:func:`applied` applies a list of variants and undoes them on exit, also when the block raises: the
model's parameters (the same tensors, bit for bit), buffers, modules and config are as before. The
interventions and ``window=W`` are one :class:`~poslens.capture.engine.intervene.Edits` (one
``LayerEdit`` per layer) that **the caller activates** around each forward (``with ap.active(): model(...)``
or ``with ap.edits.active(): ...``), as ablate does; ``applied`` switches the model to the poslens
attention (:func:`~poslens.capture.model.borrow.borrowed`) while it holds edits, so that they reach the
attention. The RoPE and dtype variants hold for the whole block.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from dataclasses import dataclass

import torch

from poslens.capture.engine.intervene import (
    CALIBRATED,
    KINDS,
    Edits,
    Intervention,
    parse_intervention,
)
from poslens.errors import PoslensError

ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
          "float32": "float32", "fp32": "float32"}
#: Llama-3.1's llama3 scaling, beside the factor
LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
FORMS = ("rope-scaling=linear|dynamic|yarn|llama3:FACTOR, rope-theta=X, dtype=bfloat16|float16, window=W, or an "
         "ablate intervention such as rope-off@3 or sink-off@all")
ROPE_KINDS = ("rope-scaling", "rope-theta")
EDIT_KINDS = ("window", "intervention")


@dataclass(frozen=True)
class Variant:
    """One variant: ``kind`` (``rope-scaling``, ``rope-theta``, ``dtype``, ``window``, ``intervention``),
    ``name`` (the canonical spec) and the fields of its kind."""

    kind: str
    name: str
    rope_type: str | None = None
    factor: float | None = None
    theta: float | None = None
    dtype: str | None = None
    window: int | None = None
    intervention: Intervention | None = None
    layers: str | None = None  # an intervention's layers as written: "3", "0,3", "all"

    def __str__(self) -> str:
        return self.name


def _num(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e16 else repr(x)


def _bad(text, why: str = "unknown variant") -> PoslensError:
    return PoslensError(f"--variant {text!r}: {why}; use {FORMS}.")


def _positive(text, value: str, what: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = float("nan")
    if not (math.isfinite(x) and x > 0):
        raise _bad(text, f"{what} must be a number > 0, got {value!r}")
    return x


def parse_variant(text) -> Variant:
    """A ``--variant`` spec (or a :class:`Variant`) -> :class:`Variant`; anything else is a one-line
    :class:`PoslensError` naming the spec and the valid forms."""
    if isinstance(text, Variant):
        return text
    s = str(text).strip().lower()
    if "=" in s:
        key, _, val = (p.strip() for p in s.partition("="))
        if key == "rope-scaling":
            typ, sep, fac = val.partition(":")
            if typ not in ROPE_TYPES or not sep:
                raise _bad(text, "rope-scaling takes TYPE:FACTOR, TYPE one of linear, dynamic, yarn, llama3 "
                                 "(e.g. rope-scaling=yarn:4)")
            f = _positive(text, fac, "the scaling factor")
            return Variant("rope-scaling", f"rope-scaling={typ}:{_num(f)}", rope_type=typ, factor=f)
        if key == "rope-theta":
            t = _positive(text, val, "the RoPE base")
            return Variant("rope-theta", f"rope-theta={_num(t)}", theta=t)
        if key == "dtype":
            if val not in DTYPES:
                raise _bad(text, "dtype takes bfloat16, float16 or float32 (bf16, fp16, fp32)")
            return Variant("dtype", f"dtype={DTYPES[val]}", dtype=DTYPES[val])
        if key == "window":
            if not val.isdigit() or int(val) < 1:
                raise _bad(text, "window takes a whole number of keys back >= 1 (e.g. window=16)")
            return Variant("window", f"window={int(val)}", window=int(val))
        raise _bad(text)
    name, at, layers = (p.strip() for p in s.rpartition("@")) if "@" in s else (s, "", "")
    if name.partition(":")[0] not in KINDS:
        raise _bad(text)
    if not at or not layers:
        raise _bad(text, f"an intervention needs its layers, e.g. {name}@3 or {name}@all")
    if layers.startswith("each"):
        raise _bad(text, "a variant is one model: name its layers (3, 0,3, 5-7 or all), not each")
    iv = parse_intervention(name, where=f"--variant {str(text)!r}: intervention")
    from poslens.analysis.ablate.config import parse_layers

    chosen = parse_layers(layers, 1 << 20, where=f"--variant {str(text)!r}: layers") if layers != "all" else None
    canon = "all" if chosen is None else ",".join(map(str, chosen[0]))
    return Variant("intervention", f"{iv.name}@{canon}", intervention=iv, layers=canon)


def variant_label(variants) -> str:
    """A short label of a list of variants: ``"yarn ×4 + bfloat16"``, ``"rope-off@3"`` (``"as loaded"``: none)."""
    parts = []
    for v in (parse_variant(x) for x in variants):
        if v.kind == "rope-scaling":
            parts.append(f"{v.rope_type} ×{_num(v.factor)}")
        elif v.kind == "rope-theta":
            parts.append(f"θ={_num(v.theta)}")
        elif v.kind == "dtype":
            parts.append(v.dtype)
        elif v.kind == "window":
            parts.append(f"window {v.window}")
        else:
            parts.append(v.name)
    return " + ".join(parts) or "as loaded"


# --------------------------------------------------------------------------------------------
# applied
# --------------------------------------------------------------------------------------------
class Applied:
    """What :func:`applied` yields: ``edits`` (the merged :class:`Edits`, or None; the caller activates it
    around each forward: :meth:`active`), ``rope_layers`` (the layers that rotate q/k), ``variants`` and
    :meth:`describe`."""

    def __init__(self, variants, edits, rope_layers, description):
        self.variants = list(variants)
        self.edits = edits
        self.rope_layers = sorted(rope_layers)
        self._description = description

    def active(self):
        """The edits active for a block (``with ap.active(): model(...)``); nothing to do without edits."""
        return self.edits.active() if self.edits is not None else contextlib.nullcontext()

    def describe(self) -> dict:
        """A JSON-able record of what was applied (rotary tables, dtype, edited layers, ...)."""
        return copy.deepcopy(self._description)


def _check_together(vs: list[Variant]) -> None:
    names = [v.name for v in vs]
    if len(set(names)) != len(names):
        raise PoslensError(f"--variant {' + '.join(names)}: each variant once.")
    for kind in ("rope-scaling", "rope-theta", "dtype", "window"):
        same = [v.name for v in vs if v.kind == kind]
        if len(same) > 1:
            raise PoslensError(f"--variant {' + '.join(same)}: one {kind} per variant (they would overwrite each "
                               "other); compare them as two variants.")


@contextlib.contextmanager
def applied(model, variants, *, adapter, config, ids=None, seq_len=None, batch_size: int = 4,
            massive_lambda: float = 5.0, seed: int = 0):
    """Apply ``variants`` (specs or :class:`Variant`) to ``model`` inside the block and undo them after it.

    ``adapter``/``config``: the model's (:func:`poslens.capture.scan.plan.loaded_model_config`); ``ids``:
    ``[N, S]`` token ids, the calibration of ``massive-qk``/``random-qk`` (their pre-RoPE q/k moments, as
    ablate measures them, ``batch_size`` sequences a forward); ``seq_len``: the sequence length the bands of
    ``rope-band`` are labelled against (default: ``ids``'s). Yields an :class:`Applied`; its ``edits`` are
    activated by the caller around each forward (:meth:`Applied.active`).

    The RoPE variants swap in a new rotary module (the original object is put back after); ``dtype`` keeps
    the original parameter and buffer tensors and puts them back (``p.data = original``): while it is
    applied the weights are held once more, at the new dtype.
    """
    vs = [parse_variant(v) for v in variants]
    _check_together(vs)
    rope_vs = [v for v in vs if v.kind in ROPE_KINDS]
    if rope_vs and not (adapter.rope_layers(config) and adapter.rotary_modules(model)):
        raise PoslensError(f"--variant {rope_vs[0].name!r}: model type {adapter.model_type!r} has no RoPE (no rotary "
                           "module); use a RoPE model, or drop the variant.")
    with contextlib.ExitStack() as stack:
        desc: dict = {"variants": [v.name for v in vs], "label": variant_label(vs)}
        for v in vs:
            if v.kind == "dtype":
                desc["dtype"] = stack.enter_context(_cast(model, adapter, getattr(torch, v.dtype)))
        if rope_vs:
            desc["rope"] = _swap_rotary(stack, model, adapter, config, rope_vs)
        edits = None
        edit_vs = [v for v in vs if v.kind in EDIT_KINDS]
        if edit_vs:
            from poslens.capture.model.borrow import borrowed

            stack.enter_context(borrowed(model))
            edits, desc["edits"] = _edits(stack, model, adapter, config, edit_vs, ids, seq_len, batch_size,
                                          massive_lambda, seed)
        yield Applied(vs, edits, adapter.rope_layers(config), desc)


# --------------------------------------------------------------------------------------------
# dtype
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _cast(model, adapter, dtype: torch.dtype):
    """The model's floating parameters and buffers at ``dtype`` inside the block, the original tensors put
    back after it (the rotary modules' frequency buffers left in their dtype)."""
    from poslens.capture.model.borrow import model_dtype

    before = str(model_dtype(model)).replace("torch.", "")
    keep = {id(b) for m in adapter.rotary_modules(model) for b in m.buffers()}
    params, buffers, cast = [], [], {}
    try:
        for p in model.parameters():  # each parameter once (tied weights too)
            if p.dtype.is_floating_point and p.dtype != dtype:
                params.append((p, p.data))
                p.data = p.data.to(dtype)
        for m in model.modules():
            for name, b in list(m._buffers.items()):
                if b is None or not b.is_floating_point() or b.dtype == dtype or id(b) in keep:
                    continue
                if id(b) not in cast:
                    cast[id(b)] = b.to(dtype)
                buffers.append((m, name, b))
                m._buffers[name] = cast[id(b)]
        yield {"dtype": str(dtype).replace("torch.", ""), "from": before, "parameters": len(params),
               "buffers": len(buffers)}
    finally:
        for m, name, b in reversed(buffers):
            m._buffers[name] = b
        for p, data in reversed(params):
            p.data = data


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------
def _rotary_slots(model, adapter) -> list[tuple[object, str, object]]:
    """``(parent module, attribute, rotary module)`` at each of the adapter's rotary paths that exists."""
    out = []
    for alt in (adapter.rotary_path or "").split("|"):
        if not alt:
            continue
        *parents, attr = alt.split(".")
        cur = model
        try:
            for part in parents:
                cur = getattr(cur, part)
            mod = getattr(cur, attr)
        except AttributeError:
            continue
        if isinstance(mod, torch.nn.Module) and all(mod is not m for _, _, m in out):
            out.append((cur, attr, mod))
            break  # the first alternative found, as Adapter.rotary_modules
    return out


def _nested_keys(cfg, rp: dict) -> list[str]:
    """The layer types ``rope_parameters`` is nested under (Gemma 3), or [] for one flat dict."""
    types = set(getattr(cfg, "layer_types", None) or ())
    keys = [k for k in rp if k in types]
    return keys if keys and all(isinstance(rp[k], dict) or rp[k] is None for k in keys) else []


def _scaled_params(p: dict, vs: list[Variant], max_pos: int | None, where: str) -> dict:
    """One set of RoPE parameters with the variants' scaling and base."""
    out = dict(p)
    for v in vs:
        if v.kind != "rope-scaling":
            continue
        out = {k: p[k] for k in ("rope_theta", "partial_rotary_factor") if k in p}
        out.update(rope_type=v.rope_type, factor=float(v.factor))
        if v.rope_type in ("yarn", "llama3"):
            if not max_pos:
                raise PoslensError(f"--variant {v.name!r}: {where} has no max_position_embeddings to scale from; "
                                   "use rope-scaling=linear or dynamic.")
            out["original_max_position_embeddings"] = int(max_pos)
        if v.rope_type == "llama3":
            out.update(LLAMA3_DEFAULTS)
    for v in vs:
        if v.kind == "rope-theta":
            out["rope_theta"] = float(v.theta)
    return out


def _rope_config(base_cfg, adapter, vs: list[Variant]):
    """A deep copy of the rotary module's config with the variants' ``rope_parameters``."""
    cfg = copy.deepcopy(base_cfg)
    rp = copy.deepcopy(getattr(cfg, "rope_parameters", None) or {})
    if not isinstance(rp, dict) or not rp:
        rp = {"rope_type": "default", "rope_theta": float(getattr(cfg, "rope_theta", None) or 10000.0)}
    where = f"model type {adapter.model_type!r}"
    max_pos = adapter.max_positions(cfg)
    nested = _nested_keys(cfg, rp)
    if nested:
        for k in nested:
            if isinstance(rp[k], dict):
                rp[k] = _scaled_params(rp[k], vs, max_pos, where)
    else:
        rp = _scaled_params(rp, vs, max_pos, where)
    cfg.rope_parameters = rp
    validate = getattr(cfg, "validate_rope", None)
    if validate is not None:
        try:
            validate()
        except (ValueError, KeyError, TypeError) as e:
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise PoslensError(f"--variant {' + '.join(v.name for v in vs)}: transformers refuses these RoPE "
                               f"parameters for {where} ({msg}).") from None
    return cfg


def _build_rotary(old, cfg):
    """A rotary module of ``old``'s class built from ``cfg``, on ``old``'s device, its buffers in ``old``'s dtypes."""
    cls = type(old)
    bufs = dict(old.named_buffers())
    device = next(iter(bufs.values())).device if bufs else torch.device("cpu")
    try:
        takes_device = "device" in inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        takes_device = False
    with torch.device("cpu"):
        new = cls(cfg, device=device) if takes_device else cls(cfg)
    new.to(device)
    for name, b in list(new.named_buffers()):
        o = bufs.get(name)
        if o is not None and b.is_floating_point() and o.dtype != b.dtype:
            mod_name, _, leaf = name.rpartition(".")
            owner = new.get_submodule(mod_name) if mod_name else new
            owner._buffers[leaf] = b.to(o.dtype)
    new.train(old.training)
    return new


def _tables(model, adapter, config) -> dict:
    from poslens.capture.model.adapters import rope_tables

    t = rope_tables(model, adapter, config) or {"kinds": {}}
    return {k: {"rope_type": v["rope_type"], "inv_freq_first": v["inv_freq"][0] if v["inv_freq"] else None,
                "inv_freq_last": v["inv_freq"][-1] if v["inv_freq"] else None,
                "attention_scaling": v["attention_scaling"], "rotary_dim": v["rotary_dim"]}
            for k, v in t["kinds"].items()}


def _swap_rotary(stack: contextlib.ExitStack, model, adapter, config, vs: list[Variant]) -> dict:
    """Swap a rotary module built from the scaled config in at each rotary path; the original back on exit."""
    slots = _rotary_slots(model, adapter)
    if not slots:
        raise PoslensError(f"--variant {vs[0].name!r}: model type {adapter.model_type!r} has no rotary module at "
                           f"{adapter.rotary_path!r}; use a RoPE model, or drop the variant.")
    before = _tables(model, adapter, config)
    params = []
    for parent, attr, old in slots:
        base = getattr(old, "config", None) or config
        cfg = _rope_config(base, adapter, vs)
        new = _build_rotary(old, cfg)
        setattr(parent, attr, new)
        stack.callback(setattr, parent, attr, old)
        params.append(copy.deepcopy(cfg.rope_parameters))
    return {"rope_parameters": params[0] if len(params) == 1 else params, "before": before,
            "tables": _tables(model, adapter, config)}


# --------------------------------------------------------------------------------------------
# interventions
# --------------------------------------------------------------------------------------------
def _window_layers(model, adapter, config, v: Variant) -> list[int]:
    """The layers ``window=W`` narrows: the sliding-window ones (every layer without any), W checked
    against the model's own window."""
    from poslens.capture.model.adapters import check_dispatch

    windows = check_dispatch(model, adapter)["windows"]
    sliding = [l for l, w in enumerate(windows) if w]
    if not sliding:
        return list(range(adapter.num_layers(config)))
    own = min(int(windows[l]) for l in sliding)
    if v.window + 1 >= own:
        raise PoslensError(f"--variant {v.name!r}: the sliding-window layers of model type {adapter.model_type!r} "
                           f"already see {own} keys (themselves and {own - 1} before); window=W narrows them only "
                           f"below that: W <= {own - 2}.")
    return sliding


def _calibrate(model, adapter, config, ids, batch_size: int):
    """Each layer's pre-RoPE q/k moments over ``ids``, as ablate's calibration measures them."""
    from poslens.analysis.ablate.run import _forward_logits, _hooks_for
    from poslens.capture.engine.intervene import Moments
    from poslens.capture.model.borrow import model_device

    L = adapter.num_layers(config)
    cal = Edits({}, rope_layers=adapter.rope_layers(config), layout=adapter.rope_layout, moments=True)
    cal.bind([adapter.attention_module(model, l) for l in range(L)])
    handles = _hooks_for(cal, model, adapter, range(L))
    device = model_device(model)
    try:
        with cal.active():
            for s in range(0, ids.shape[0], max(1, int(batch_size))):
                _forward_logits(model, ids[s:s + batch_size].to(device))
    finally:
        for h in handles:
            h.remove()
    return Moments.from_edits(cal)


def _edits(stack, model, adapter, config, vs: list[Variant], ids, seq_len, batch_size, massive_lambda, seed):
    """One :class:`Edits` of every intervention and window variant (one ``LayerEdit`` per layer), bound to
    the model's attention, with the rotary hooks of ablate (removed on exit); and its description."""
    from poslens.analysis.ablate.config import parse_layers
    from poslens.analysis.ablate.run import _band_labels, _hooks_for
    from poslens.capture.engine.intervene import layer_edit, massive_mask

    L = adapter.num_layers(config)
    kinds = [v.intervention.kind for v in vs if v.kind == "intervention"]
    if ids is not None:
        ids = torch.as_tensor(ids)
        if ids.ndim != 2 or ids.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) \
                or ids.shape[0] < 1:
            raise PoslensError(f"ids: expected [N, S] token ids, got a {tuple(ids.shape)} {ids.dtype} tensor.")
    S = seq_len or (int(ids.shape[1]) if ids is not None else None)
    if "rope-band" in kinds and not S:
        name = next(v.name for v in vs if v.kind == "intervention" and v.intervention.kind == "rope-band")
        raise PoslensError(f"--variant {name!r}: the bands are labelled against the sequence length; pass ids or "
                           "seq_len.")
    moments = None
    if any(k in CALIBRATED for k in kinds):
        if ids is None:
            name = next(v.name for v in vs if v.kind == "intervention" and v.intervention.kind in CALIBRATED)
            raise PoslensError(f"--variant {name!r}: needs calibration tokens (the massive q/k dims are measured "
                               "on them); pass ids=[N, S] token ids.")
        moments = _calibrate(model, adapter, config, ids, batch_size)
    bands = _band_labels(model, adapter, config, S or adapter.max_positions(config) or 2048)
    gen = torch.Generator().manual_seed(seed)
    merged, owner, record = {}, {}, {}
    for v in vs:
        if v.kind == "window":
            layers, iv = _window_layers(model, adapter, config, v), Intervention("window", v.window)
        else:
            layers = parse_layers(v.layers, L, where=f"--variant {v.name!r}: layers")[0]
            iv = v.intervention
        for l in layers:
            if l in merged:
                raise PoslensError(f"--variant {v.name!r} and {owner[l]!r} both edit layer {l}; one edit per layer: "
                                   "compare them as two variants, or on other layers.")
            merged[l] = layer_edit(iv, l, band_labels=bands[l], moments=moments, massive_lambda=massive_lambda,
                                   generator=gen)
            owner[l] = v.name
        rec = {"intervention": iv.name, "layers": layers}
        if iv.kind in ("rope-off", "rope-band"):
            rec["applies"] = any(l in adapter.rope_layers(config) for l in layers)
        if iv.kind in CALIBRATED:
            rec["massive_dims"] = {str(l): {"q": int(massive_mask(moments.q_rms[l], massive_lambda).sum()),
                                            "k": int(massive_mask(moments.k_rms[l], massive_lambda).sum())}
                                   for l in layers}
        record[v.name] = rec
    edits = Edits(merged, rope_layers=adapter.rope_layers(config), layout=adapter.rope_layout)
    edits.bind([adapter.attention_module(model, l) for l in range(L)])
    for h in _hooks_for(edits, model, adapter, sorted(merged)):
        stack.callback(h.remove)
    return edits, record
