"""Interventions in a model's attention: what ``poslens ablate`` switches off, layer by layer.

An intervention is an option of the attention pass, not a second attention function: while an
:class:`Edits` object is active (``with edits.active(): model(...)``), the registered attention
function (:func:`poslens.capture.engine.attention.poslens_attention`) hands each edited layer's queries and
keys to :meth:`Edits.apply` and takes its mask from :meth:`Edits.structure`, for the modules the
edits are bound to and in this context only (a context variable, as the capture). With or without
a capture active beside it, the layer then attends with the edited q/k and mask.

The interventions (``Intervention.name``):

- ``rope-off``: the layer's queries and keys un-rotated with the model's own cos/sin (the head
  attends as a NoPE head; ``--no-rope-layers`` of a scan does the same);
- ``rope-band:high|medium|low``: the rotary pairs of one band left un-rotated, the others rotated as
  before; bands as :func:`poslens.rope.frequency_bands` labels them against the sequence length, as
  the fingerprint does. ``rope-band:low`` is Barbero et al.'s p-RoPE (ICLR 2025, "Round and round we
  go"), which removes the lowest frequencies;
- ``massive-qk``: the massive pre-RoPE q/k dimensions (Jin et al., ICML 2025, arXiv 2502.01563,
  Definition 1: RMS over tokens above ``lambda = 5`` times the layer's mean RMS over heads and
  dimensions) replaced by their mean over the calibration tokens, as Jin et al. disrupt them, then
  rotated again;
- ``random-qk``: the control of ``massive-qk``: per layer, as many non-massive dimensions of the
  queries (and of the keys), drawn at random (seeded), replaced the same way;
- ``sink-off``: key 0 masked for every query after it: its weight is removed and each row's softmax
  renormalised over the other keys it sees (query 0 keeps key 0, the only key it sees);
- ``window:W``: keys more than ``W`` positions back masked (a query sees itself and the ``W`` keys
  before it).

The bidirectional control of the neighbourhood analysis is an intervention too, on every layer at
once and not one of ablate's: :func:`bidirectional_control` drops the causal mask (every query sees
every key; queries, keys, windows and padding as they are).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass, field

import torch

from poslens.capture.backends.rope import rotate_qk, unrotate_qk
from poslens.errors import PoslensError
from poslens.rope import BANDS

KINDS = ("rope-off", "rope-band", "massive-qk", "random-qk", "sink-off", "window")
#: the interventions that change queries and keys (the others change the mask)
QK_KINDS = ("rope-off", "rope-band", "massive-qk", "random-qk")
#: the interventions that need the calibration pass (pre-RoPE q/k moments)
CALIBRATED = ("massive-qk", "random-qk")


@dataclass(frozen=True)
class Intervention:
    """One intervention: its kind and argument (a band for ``rope-band``, a window for ``window``)."""

    kind: str
    arg: str | int | None = None

    @property
    def name(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}:{self.arg}"

    def __str__(self) -> str:
        return self.name


def parse_intervention(text, where: str = "--intervention") -> Intervention:
    """``"rope-off"``, ``"rope-band:low"``, ``"massive-qk"``, ``"random-qk"``, ``"sink-off"``,
    ``"window:16"`` (or an :class:`Intervention`) -> :class:`Intervention`; anything else is a
    :class:`PoslensError` naming ``where``."""
    if isinstance(text, Intervention):
        return text
    s = str(text).strip().lower()
    kind, _, arg = s.partition(":")
    if kind not in KINDS:
        raise PoslensError(f"{where} {text!r}: not an intervention; choose rope-off, rope-band:high|medium|low, "
                           "massive-qk, random-qk, sink-off or window:W.")
    if kind == "rope-band":
        if arg not in BANDS:
            raise PoslensError(f"{where} {text!r}: rope-band takes a band: rope-band:high, rope-band:medium or "
                               "rope-band:low.")
        return Intervention(kind, arg)
    if kind == "window":
        try:
            w = int(arg)
        except ValueError:
            w = 0
        if w < 1 or str(w) != arg.lstrip("+"):
            raise PoslensError(f"{where} {text!r}: window takes a positive number of keys back, e.g. window:16.")
        return Intervention(kind, w)
    if arg:
        raise PoslensError(f"{where} {text!r}: {kind} takes no argument.")
    return Intervention(kind)


# --------------------------------------------------------------------------------------------
# what one layer's attention is given
# --------------------------------------------------------------------------------------------
@dataclass
class LayerEdit:
    """What an intervention does to one layer: pairs left un-rotated, dims replaced, the mask."""

    #: bool ``[r/2]``: the rotary pairs attended un-rotated (all True: ``rope-off``); None: rotation kept
    unrotated_pairs: torch.Tensor | None = None
    #: bool ``[H, D]`` / ``[Hk, D]`` dims replaced by ``q_mean`` / ``k_mean`` (pre-RoPE, model's layout)
    q_dims: torch.Tensor | None = None
    k_dims: torch.Tensor | None = None
    q_mean: torch.Tensor | None = None
    k_mean: torch.Tensor | None = None
    window: int | None = None  # keys more than this many positions back masked
    sink_off: bool = False

    @property
    def edits_qk(self) -> bool:
        return self.unrotated_pairs is not None or self.q_dims is not None or self.k_dims is not None


def _pair_dims(pairs: torch.Tensor, head_dim: int, layout: str) -> torch.Tensor:
    """Bool ``[D]``: the dims of the rotary pairs marked in ``pairs [r/2]``, in the model's layout."""
    r2 = pairs.numel()
    out = torch.zeros(head_dim, dtype=torch.bool, device=pairs.device)
    idx = pairs.nonzero().flatten()
    if layout == "interleaved":
        out[2 * idx] = True
        out[2 * idx + 1] = True
    else:
        out[idx] = True
        out[idx + r2] = True
    return out


class Edits:
    """The interventions of one forward (or several), by decoder layer (from 0), for one model.

    ``layers``: ``{layer: LayerEdit}``; ``rope_layers``: the layers that rotate q/k; ``layout``: the
    model's RoPE pair layout. ``moments``: also collect each layer's pre-RoPE q/k moments (the
    calibration of ``massive-qk``), into :attr:`moments`. ``causal=False``: every layer attends
    without the causal mask (:func:`bidirectional_control`).
    """

    _ACTIVE: contextvars.ContextVar[tuple] = contextvars.ContextVar("poslens_active_edits", default=())

    def __init__(self, layers: dict[int, LayerEdit], *, rope_layers, layout: str = "half", moments: bool = False,
                 causal: bool = True):
        self.layers = dict(layers)
        self.causal = bool(causal)
        self.rope_layers = set(rope_layers)
        self.layout = layout
        self.cos_sin: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._modules: weakref.WeakSet | None = None
        self._dims: dict[int, torch.Tensor] = {}
        self.moments: dict | None = {} if moments else None

    # -- context ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        token = Edits._ACTIVE.set(Edits._ACTIVE.get() + (self,))
        try:
            yield self
        finally:
            Edits._ACTIVE.reset(token)

    def is_active(self) -> bool:
        return any(e is self for e in Edits._ACTIVE.get())

    def bind(self, modules) -> None:
        """Edit attention calls from these modules only (weak references)."""
        self._modules = weakref.WeakSet(modules)

    def owns(self, module) -> bool:
        return self._modules is None or module is None or module in self._modules

    def takes(self, layer) -> bool:
        """Whether a call from ``layer`` is edited or measured."""
        return not self.causal or layer in self.layers or (self.moments is not None and layer is not None)

    # -- queries and keys ---------------------------------------------------------------------
    def _pre(self, layer, query, key):
        """Pre-RoPE ``(q, k)`` in float32 (the post-RoPE ones in a layer without RoPE)."""
        if layer not in self.rope_layers:
            return query.to(torch.float32), key.to(torch.float32)
        cs = self.cos_sin.get(layer)
        if cs is None:
            raise PoslensError(f"layer {layer}: no RoPE cos/sin reached its attention module; the adapter's "
                               "rotary hook did not fire (unsupported architecture?).")
        return unrotate_qk(query.to(torch.float32), key.to(torch.float32), *cs, layout=self.layout)

    def apply(self, layer, query, key):
        """The queries and keys ``[B, H, S, D]`` layer ``layer`` attends with (in the model's dtype)."""
        if self.moments is not None:
            self._measure(layer, query, key)
        edit = self.layers.get(layer)
        if edit is None or not edit.edits_qk:
            return query, key
        rope = layer in self.rope_layers
        if edit.unrotated_pairs is not None and not rope:
            return query, key  # nothing rotates here: un-rotating changes nothing
        q_pre, k_pre = self._pre(layer, query, key)
        if edit.unrotated_pairs is not None:
            if bool(edit.unrotated_pairs.all()) and edit.unrotated_pairs.numel() * 2 == query.shape[-1]:
                return q_pre.to(query.dtype), k_pre.to(key.dtype)
            dims = self._dims.get(layer)
            if dims is None:
                dims = self._dims[layer] = _pair_dims(edit.unrotated_pairs, query.shape[-1], self.layout).to(
                    query.device)
            q = torch.where(dims, q_pre, query.to(torch.float32))
            k = torch.where(dims, k_pre, key.to(torch.float32))
            return q.to(query.dtype), k.to(key.dtype)
        q_new, k_new = q_pre, k_pre
        if edit.q_dims is not None:
            q_new = torch.where(edit.q_dims.to(q_pre.device)[:, None, :], edit.q_mean.to(q_pre.device)[:, None, :],
                                q_pre)
        if edit.k_dims is not None:
            k_new = torch.where(edit.k_dims.to(k_pre.device)[:, None, :], edit.k_mean.to(k_pre.device)[:, None, :],
                                k_pre)
        if rope:  # rotate the change: RoPE is linear, the untouched dims keep their exact values
            cos, sin = self.cos_sin[layer]
            dq, dk = rotate_qk(q_new - q_pre, cos, sin, self.layout), rotate_qk(k_new - k_pre, cos, sin, self.layout)
            return (query.to(torch.float32) + dq).to(query.dtype), (key.to(torch.float32) + dk).to(key.dtype)
        return q_new.to(query.dtype), k_new.to(key.dtype)

    def structure(self, layer, sliding_window):
        """``(sliding_window, sink_off)`` of the layer's mask: the window as the attention function
        counts it (a query sees keys ``i - window < j <= i``), the model's own or the intervention's,
        whichever is shorter."""
        edit = self.layers.get(layer)
        if edit is None:
            return sliding_window, False
        window = sliding_window
        if edit.window is not None:
            w = edit.window + 1  # the query itself and the W keys before it
            window = w if not window else min(int(window), w)
        return window, edit.sink_off

    # -- calibration --------------------------------------------------------------------------
    def _measure(self, layer, query, key) -> None:
        """Add a batch's pre-RoPE q/k sums and sums of squares per head and dim (float64)."""
        q, k = self._pre(layer, query, key)
        m = self.moments.setdefault(layer, {"n": 0})
        for name, x in (("q", q), ("k", k)):
            x = x.to(torch.float64)
            s, s2 = x.sum((0, 2)).cpu(), x.square().sum((0, 2)).cpu()
            if name + "_sum" in m:
                m[name + "_sum"] += s
                m[name + "_sq"] += s2
            else:
                m[name + "_sum"], m[name + "_sq"] = s, s2
        m["n"] += q.shape[0] * q.shape[2]


def bidirectional_control(modules=None) -> Edits:
    """The bidirectional control: every layer's attention without the causal mask, nothing else edited.
    ``modules``: the attention modules whose calls it takes (None: any)."""
    edits = Edits({}, rope_layers=(), causal=False)
    if modules is not None:
        edits.bind(modules)
    return edits


def active_edits(module=None):
    """The innermost active :class:`Edits` bound to ``module`` (or to no model), else None."""
    for e in reversed(Edits._ACTIVE.get()):
        if e.owns(module):
            return e
    return None


# --------------------------------------------------------------------------------------------
# building a layer's edit
# --------------------------------------------------------------------------------------------
@dataclass
class Moments:
    """Each layer's pre-RoPE q/k mean and RMS per head and dim, from a calibration pass."""

    q_mean: dict = field(default_factory=dict)  # layer -> [H, D]
    k_mean: dict = field(default_factory=dict)
    q_rms: dict = field(default_factory=dict)
    k_rms: dict = field(default_factory=dict)
    tokens: int = 0

    @classmethod
    def from_edits(cls, edits: Edits) -> "Moments":
        m = cls()
        for layer, d in sorted((edits.moments or {}).items()):
            n = max(1, d["n"])
            m.tokens = d["n"]
            for name in ("q", "k"):
                mean = d[name + "_sum"] / n
                getattr(m, name + "_mean")[layer] = mean.to(torch.float32)
                getattr(m, name + "_rms")[layer] = (d[name + "_sq"] / n).clamp_min(0).sqrt()
        return m


def massive_mask(rms: torch.Tensor, lam: float) -> torch.Tensor:
    """Bool ``[H, D]``: dims whose RMS exceeds ``lam`` times the mean RMS over the layer's heads and dims
    (Jin et al.'s Definition 1; :func:`poslens.metrics.fingerprint.massive_dims` on a scan's grams)."""
    return rms > lam * rms.mean()


def random_like(mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Bool mask of the same shape with as many True entries, drawn uniformly among ``mask``'s False ones."""
    flat = mask.flatten()
    free = (~flat).nonzero().flatten()
    n = min(int(flat.sum()), free.numel())
    out = torch.zeros_like(flat)
    out[free[torch.randperm(free.numel(), generator=generator, device="cpu").to(free.device)[:n]]] = True
    return out.view(mask.shape)


def layer_edit(iv: Intervention, layer: int, *, band_labels: list[str] | None, moments: Moments | None = None,
               massive_lambda: float = 5.0, generator: torch.Generator | None = None) -> LayerEdit:
    """The :class:`LayerEdit` of intervention ``iv`` at ``layer``. ``band_labels``: the band of each
    rotary pair of the layer (None: the layer has no RoPE); ``moments``: the calibration (``massive-qk``,
    ``random-qk``)."""
    if iv.kind == "rope-off":
        if band_labels is None:
            return LayerEdit()
        return LayerEdit(unrotated_pairs=torch.ones(len(band_labels), dtype=torch.bool, device="cpu"))
    if iv.kind == "rope-band":
        if band_labels is None:
            return LayerEdit()
        band = [b == iv.arg for b in band_labels]
        return LayerEdit(unrotated_pairs=torch.tensor(band, dtype=torch.bool, device="cpu"))  # host-only mask
    if iv.kind == "sink-off":
        return LayerEdit(sink_off=True)
    if iv.kind == "window":
        return LayerEdit(window=int(iv.arg))
    if moments is None or layer not in moments.q_rms:
        raise PoslensError(f"{iv.name}: layer {layer} has no calibration (its attention was not measured).")
    qm, km = massive_mask(moments.q_rms[layer], massive_lambda), massive_mask(moments.k_rms[layer], massive_lambda)
    if iv.kind == "random-qk":
        g = generator if generator is not None else torch.Generator().manual_seed(layer)
        qm, km = random_like(qm, g), random_like(km, g)
    return LayerEdit(q_dims=qm, k_dims=km, q_mean=moments.q_mean[layer], k_mean=moments.k_mean[layer])
