"""``poslens ablate``: where position comes from, causally.

The other commands measure positional structure in attention maps: correlations. ``ablate``
switches a source of position off (:mod:`poslens.capture.intervene`: RoPE, one RoPE frequency band,
the massive q/k dimensions, the attention sink, keys beyond a window), in every layer at once, in a
list of layers, or in one layer at a time, and measures what the model loses: its next-token loss
on the same sequences, paired with the unmodified model, overall and by position.

Layer selection (``layers``): ``"each"`` (one condition per decoder layer, from 0), ``"all"`` (one
condition, every layer together), a list ``"0,3,5-7"`` (one condition, those layers together) or
``"each:0-5"`` (one condition per listed layer).

**Loss.** ``loss[n, t]``: the cross-entropy of token ``t`` of sequence ``n`` given tokens
``0 .. t - 1`` (``t = 1 .. S - 1``), from the model's own logits in float32 (as transformers' loss
with labels computes it). A condition's effect is the paired difference ``loss_c - loss_0`` with the
unmodified model on the same tokens. Noise floor: sequence ``n`` belongs to group ``n % G``; the
standard error of a mean difference is the standard deviation of the ``G`` group means over
``sqrt(G)``, and its p-value a two-sided t-test with ``G - 1`` degrees of freedom on them. Positions
are pooled into buckets that double in width (``[1, 2)``, ``[2, 4)``, ``[4, 8)``, ...). A condition
changes the loss *beyond the noise* when its p-value is below :data:`LEVEL`, the layers of one
intervention held together at that false discovery rate (Benjamini–Hochberg).

**Cost.** A layer-at-a-time condition reruns only the layers from the ablated one on: the earlier
layers' outputs of the unmodified forward are replayed (checked bit for bit against the full
forward on the first batch; a model where they differ gets full forwards). No capture runs unless
``readings`` asks for the scans of :func:`readings`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poslens.capture.intervene import CALIBRATED, Edits, Intervention, Moments, layer_edit, parse_intervention
from poslens.errors import PoslensError
from poslens.fmt import fmt

#: the significance level of every "beyond the noise" (false discovery rate over an intervention's layers)
LEVEL = 0.01
#: default scan shape: ``rope-off`` layer by layer on SmolLM2 within 5 minutes on a 2-core CPU
#: (benchmarks/bench_ablate.py)
DEFAULT_SEQ_LEN = 256
DEFAULT_NUM_SEQS = 32
DEFAULT_GROUPS = 8


@dataclass
class AblateConfig:
    """Every option of an ablation (the flags of ``poslens ablate``, the keywords of :func:`poslens.ablate`)."""

    model_dir: str
    out: str | None = None
    interventions: list = field(default_factory=lambda: ["rope-off"])
    layers: str = "each"
    data: str = "stdlib"
    seq_len: int | None = None  # None: as Python data has it, else DEFAULT_SEQ_LEN
    num_seqs: int | None = None  # None: every sequence of Python data, else DEFAULT_NUM_SEQS
    batch_size: int = 4
    seed: int = 0
    noise_groups: int = DEFAULT_GROUPS
    massive_lambda: float = 5.0
    device: str = "auto"
    dtype: str = "auto"
    figures: bool = True
    overwrite: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    #: replay the layers before a condition's first ablated layer from the unmodified forward (checked
    #: bit for bit on the first batch); False: every condition runs the whole model
    replay: bool = True


# --------------------------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------------------------
def parse_layers(text, num_layers: int, where: str = "--layers") -> list[list[int]]:
    """The layer sets of the conditions: ``each`` -> ``[[0], [1], ...]``, ``all`` -> ``[[0 .. L-1]]``,
    ``"0,3,5-7"`` (or a list of ints) -> ``[[0, 3, 5, 6, 7]]``, ``"each:0-3"`` -> ``[[0], [1], [2], [3]]``."""
    from poslens.capture.options import parse_int_list

    if isinstance(text, (list, tuple)):
        chosen, each = sorted({_int_layer(x, where) for x in text}), False
    else:
        s = str(text).strip().lower()
        each = s == "each" or s.startswith("each:")
        rest = s[5:] if s.startswith("each:") else ("all" if s in ("each", "all") else s)
        chosen = list(range(num_layers)) if rest == "all" else parse_int_list(rest, where)
    bad = [l for l in chosen if not 0 <= l < num_layers]
    if bad or not chosen:
        raise PoslensError(f"{where} {text!r}: the model has decoder layers 0..{num_layers - 1}; pass each, all, or a "
                           "list like 0,3,5-7 (each:0-5 for one layer at a time).")
    return [[l] for l in chosen] if each else [chosen]


def _int_layer(x, where: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise PoslensError(f"{where}: {x!r} is not a layer index; pass integers (decoder layers from 0).")
    return x


def condition_name(iv: Intervention, layers: list[int], num_layers: int) -> str:
    """``rope-off@3``, ``rope-off@all``, ``rope-off@0,3,5``."""
    where = "all" if layers == list(range(num_layers)) else ",".join(map(str, layers))
    return f"{iv.name}@{where}"


# --------------------------------------------------------------------------------------------
# statistics (pure functions)
# --------------------------------------------------------------------------------------------
def token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[B, S - 1]`` float32: the cross-entropy of token ``t`` given the tokens before it, from the
    logits ``[B, S, V]`` (upcast to float32, as transformers' causal-LM loss does)."""
    B, S, V = logits.shape
    return torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, V), ids[:, 1:].reshape(-1),
                                             reduction="none").view(B, S - 1)


def position_buckets(seq_len: int) -> list[tuple[int, int]]:
    """Buckets ``[lo, hi)`` of loss positions ``t = 1 .. S - 1`` doubling in width: ``[1, 2)``, ``[2, 4)``, ..."""
    out, lo = [], 1
    while lo < seq_len:
        hi = min(seq_len, 2 * lo)
        out.append((lo, hi))
        lo = hi
    return out


def paired_stats(delta: torch.Tensor, groups: int) -> dict:
    """Mean, standard error and two-sided p-value of per-sequence differences ``delta [N]`` from the
    means of ``groups`` groups (sequence ``n`` in group ``n % groups``): SE = sd of the group means /
    sqrt(G), p from Student's t with G - 1 degrees of freedom. SE and p are None with fewer than two
    groups holding sequences."""
    d = delta.to(torch.float64)
    N = d.numel()
    G = min(groups, N)
    mean = float(d.mean()) if N else float("nan")
    if G < 2:
        return {"mean": mean, "se": None, "p": None, "groups": G}
    g = torch.arange(N) % G
    gm = torch.zeros(G, dtype=torch.float64).index_add_(0, g, d) / torch.bincount(g, minlength=G).to(torch.float64)
    se = float(gm.std(unbiased=True) / math.sqrt(G))
    if se == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
    else:
        from scipy.stats import t as student_t

        p = float(2 * student_t.sf(abs(float(gm.mean())) / se, G - 1))
    return {"mean": float(gm.mean()), "se": se, "p": p, "groups": G}


def bh(ps: list, level: float = LEVEL) -> list[bool]:
    """Which p-values stay significant at false discovery rate ``level`` (Benjamini–Hochberg, via
    ``scipy.stats.false_discovery_control``); None counts as not significant."""
    idx = [i for i, p in enumerate(ps) if p is not None and math.isfinite(p)]
    out = [False] * len(ps)
    if not idx:
        return out
    from scipy.stats import false_discovery_control

    adj = false_discovery_control([min(max(float(ps[i]), 0.0), 1.0) for i in idx], method="bh")
    for i, a in zip(idx, adj):
        out[i] = bool(a < level)
    return out


def condition_record(name: str, iv: Intervention, layers: list[int], loss0: torch.Tensor, loss: torch.Tensor,
                     buckets: list[tuple[int, int]], groups: int) -> dict:
    """A condition's numbers: the paired loss change overall and per position bucket (mean, SE, p)."""
    delta = loss.to(torch.float64) - loss0.to(torch.float64)  # [N, S - 1], column t - 1 = position t
    rec = {"name": name, "intervention": iv.name, "layers": layers,
           "loss": float(loss.double().mean()), "loss_base": float(loss0.double().mean()),
           "delta": paired_stats(delta.mean(1), groups), "buckets": []}
    for lo, hi in buckets:
        st = paired_stats(delta[:, lo - 1:hi - 1].mean(1), groups)
        rec["buckets"].append({"positions": [lo, hi - 1], **st})
    return rec


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


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------
@dataclass
class _Setup:
    model: object
    adapter: object
    config: object
    ids: torch.Tensor
    device: str
    dtype: torch.dtype
    source: dict
    interventions: list
    layer_sets: list
    origin: dict


def _validate(cfg: AblateConfig, model=None, tokenizer=None, data=None):
    """Every check that needs no forward; returns ``(config, adapter, ivs, layer_sets, source)``.
    ``data``: sequences given from Python (``seq_len``/``num_seqs`` None: as the data has them)."""
    from poslens.capture.load import checked_adapter, load_tokenizer, open_model_config
    from poslens.capture.plan import loaded_model_config, loaded_model_tokenizer
    from poslens.capture.sources import is_python_data, make_source, python_source
    from poslens.errors import require_positive

    python = data is not None and is_python_data(data)
    seq_len = cfg.seq_len if cfg.seq_len is not None or python else DEFAULT_SEQ_LEN
    num_seqs = cfg.num_seqs if cfg.num_seqs is not None or python else DEFAULT_NUM_SEQS
    require_positive(("--batch-size", cfg.batch_size), ("--noise-groups", cfg.noise_groups),
                     *((("--num-seqs", num_seqs),) if num_seqs is not None else ()),
                     *((("--seq-len", seq_len),) if seq_len is not None else ()))
    if not (isinstance(cfg.massive_lambda, (int, float)) and math.isfinite(cfg.massive_lambda)
            and cfg.massive_lambda > 0):
        raise PoslensError(f"--massive-lambda {cfg.massive_lambda!r}: must be a positive number (Jin et al. use 5).")
    ivs = [parse_intervention(x) for x in (cfg.interventions or [])]
    if not ivs:
        raise PoslensError("--intervention: name at least one (rope-off, rope-band:low, massive-qk, sink-off, "
                           "window:16, ...).")
    if len({iv.name for iv in ivs}) != len(ivs):
        raise PoslensError(f"--intervention {', '.join(iv.name for iv in ivs)}: each intervention once.")
    if model is not None:
        config, adapter = loaded_model_config(model)
    else:
        config, adapter = open_model_config(cfg.model_dir, allow_pickle=cfg.allow_pickle,
                                            trust_remote_code=cfg.trust_remote_code)
    L = adapter.num_layers(config)
    layer_sets = parse_layers(cfg.layers, L)
    vocab = getattr(config, "vocab_size", None)
    if python:
        src, _ = python_source(data, seq_len=seq_len, num_seqs=num_seqs, tokenizer=tokenizer, vocab_size=vocab)
    else:
        if tokenizer is None and cfg.data != "random":
            tokenizer = load_tokenizer(cfg.model_dir, cfg.trust_remote_code) if model is None \
                else loaded_model_tokenizer(model)
            if tokenizer is None:
                raise PoslensError(f"data={cfg.data!r} is text but no tokenizer was found beside the model; pass "
                                   "tokenizer=... (Python), or --data random / token ids.")
        src = make_source(cfg.data, seq_len=seq_len, num_seqs=num_seqs, seed=cfg.seed, tokenizer=tokenizer,
                          vocab_size=vocab)
    where = f"model {type(model).__name__}" if model is not None else cfg.model_dir
    checked_adapter(config, where, seq_len=src.seq_len, flag="seq_len" if model is not None else "--seq-len")
    if src.seq_len < 2:
        raise PoslensError(f"--seq-len {src.seq_len}: the loss needs at least 2 tokens per sequence.")
    return config, adapter, ivs, layer_sets, src


def _band_labels(model, adapter, config, seq_len: int) -> dict[int, list[str] | None]:
    """Each layer's rotary-pair bands against ``seq_len`` (None: no RoPE in the layer), as the fingerprint's."""
    from poslens.capture.adapters import layer_rope, rope_tables
    from poslens.rope import frequency_bands

    tables = rope_tables(model, adapter, config)
    out = {}
    for l in range(adapter.num_layers(config)):
        t = layer_rope(tables, l)
        out[l] = None if t is None else frequency_bands(int(t["rotary_dim"]), None, seq_len, theta=t["inv_freq"])
    return out


def _forward_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def _hooks_for(edits: Edits, model, adapter, layers) -> list:
    """The rotary cos/sin of each edited layer, handed to ``edits`` while it is active."""
    from poslens.capture.adapters import hook_position_embeddings

    def _rope(layer, cs):
        if edits.is_active():
            edits.cos_sin[layer] = (cs[0], cs[1])
    return [hook_position_embeddings(model, adapter, l, _rope) for l in layers]


def run_ablate(cfg: AblateConfig, progress: bool = True, *, model=None, tokenizer=None, data=None) -> dict:
    """Run the ablation and write its run directory (``cfg.out``); returns the summary.

    ``model``: a causal LM already loaded (handed back as it was); ``tokenizer``/``data``: as
    :func:`poslens.scan` takes them."""
    from poslens.capture.adapters import check_dispatch
    from poslens.capture.borrow import borrowed, model_device, model_dtype
    from poslens.capture.load import load_model
    from poslens.capture.model_source import source_record
    from poslens.progress import task_progress
    from poslens.rundir import prepare_out_dir, staged_dir
    from poslens.runtime import no_hf_progress_bars, parse_device, resolve_dtype

    t0 = time.time()
    config, adapter, ivs, layer_sets, src = _validate(cfg, model, tokenizer, data)
    if cfg.out is not None:
        prepare_out_dir(cfg.out, must_be_new=not cfg.overwrite)
    with contextlib.ExitStack() as stack:
        if model is not None:
            stack.enter_context(borrowed(model))
            device, dtype, origin = model_device(model), model_dtype(model), {
                "kind": "in-memory", "class": type(model).__name__,
                "name_or_path": str(getattr(model, "name_or_path", "") or "")}
        else:
            device = parse_device(cfg.device)
            dtype = resolve_dtype(cfg.dtype, device, config)
            with no_hf_progress_bars(not progress):
                model = load_model(cfg.model_dir, dtype=dtype, device=device, allow_pickle=cfg.allow_pickle,
                                   trust_remote_code=cfg.trust_remote_code)
            origin = source_record(cfg.model_dir)
        check_dispatch(model, adapter)
        bands = _band_labels(model, adapter, config, src.seq_len)
        ids = src.batch(0, src.num_seqs)
        setup = _Setup(model, adapter, config, ids, device, dtype, src.describe(), ivs, layer_sets, origin)
        losses, replay_ok, moments = _measure(cfg, setup, bands, progress, task_progress)
    summary, tensors = _summarise(cfg, setup, losses, replay_ok, moments, time.time() - t0)
    if cfg.out is not None:
        write_run(Path(cfg.out), cfg, setup, summary, tensors)
    return {"summary": summary, "tensors": tensors}


def _measure(cfg: AblateConfig, setup: _Setup, bands, progress: bool, task_progress):
    """Every condition's per-token losses ``{name: [N, S - 1]}`` (``"none"``: the model as it is)."""
    model, adapter, ids = setup.model, setup.adapter, setup.ids
    L = adapter.num_layers(setup.config)
    N, B = ids.shape[0], cfg.batch_size
    batches = [(s, min(N, s + B)) for s in range(0, N, B)]
    attn = [adapter.attention_module(model, l) for l in range(L)]
    rope_layers = adapter.rope_layers(setup.config)
    conditions = [(iv, ls) for iv in setup.interventions for ls in setup.layer_sets]
    moments = None
    calib_steps = len(batches) if any(iv.kind in CALIBRATED for iv in setup.interventions) else 0
    total = calib_steps + len(batches) * (1 + len(conditions))
    with task_progress("ablate", total, enabled=progress) as update:
        step = 0
        if calib_steps:  # the massive dims and their means: pre-RoPE q/k moments over every sequence
            cal = Edits({}, rope_layers=rope_layers, layout=adapter.rope_layout, moments=True)
            cal.bind(attn)
            handles = _hooks_for(cal, model, adapter, range(L))
            try:
                with cal.active():
                    for s, e in batches:
                        _forward_logits(model, ids[s:e].to(setup.device))
                        step += 1
                        update(step)
            finally:
                for h in handles:
                    h.remove()
            moments = Moments.from_edits(cal)
        gen = torch.Generator().manual_seed(cfg.seed)
        edits = []
        for iv, ls in conditions:
            e = Edits({l: layer_edit(iv, l, band_labels=bands[l], moments=moments, massive_lambda=cfg.massive_lambda,
                                     generator=gen) for l in ls},
                      rope_layers=rope_layers, layout=adapter.rope_layout)
            e.bind(attn)
            edits.append((condition_name(iv, ls, L), min(ls), e))
        replay = LayerReplay(adapter.decoder_layers(model))
        handles = []
        for _, _, e in edits:
            handles += _hooks_for(e, model, adapter, sorted(e.layers))
        losses: dict[str, list] = {"none": []}
        losses.update({name: [] for name, _, _ in edits})
        replay_ok = None
        try:
            for bi, (s, e_) in enumerate(batches):
                x = ids[s:e_].to(setup.device)
                with replay.recording():
                    logits = _forward_logits(model, x)
                losses["none"].append(token_losses(logits, x).cpu())
                del logits
                step += 1
                update(step)
                if replay_ok is None and not cfg.replay:
                    replay_ok = False
                if replay_ok is None:  # the replayed layers must give the full forward's logits, bit for bit
                    k = max(1, L // 2)
                    with replay.replaying(k):
                        again = _forward_logits(model, x)
                    replay_ok = bool(torch.equal(token_losses(again, x).cpu(), losses["none"][-1]))
                    del again
                for name, first, ed in edits:
                    with replay.replaying(first if replay_ok else 0), ed.active():
                        logits = _forward_logits(model, x)
                    losses[name].append(token_losses(logits, x).cpu())
                    del logits
                    step += 1
                    update(step)
                replay.outputs = [None] * len(replay.outputs)
        finally:
            for h in handles:
                h.remove()
    return {k: torch.cat(v) for k, v in losses.items()}, bool(replay_ok), moments


# --------------------------------------------------------------------------------------------
# the summary
# --------------------------------------------------------------------------------------------
def _summarise(cfg: AblateConfig, setup: _Setup, losses: dict, replay_ok: bool, moments, seconds: float):
    L = setup.adapter.num_layers(setup.config)
    S = setup.ids.shape[1]
    buckets = position_buckets(S)
    loss0 = losses["none"]
    conditions = []
    for iv in setup.interventions:
        recs = []
        rope = setup.adapter.rope_layers(setup.config)
        for ls in setup.layer_sets:
            name = condition_name(iv, ls, L)
            rec = condition_record(name, iv, ls, loss0, losses[name], buckets, cfg.noise_groups)
            rec["applies"] = iv.kind not in ("rope-off", "rope-band") or any(l in rope for l in ls)
            recs.append(rec)
        for r, sig in zip(recs, bh([r["delta"]["p"] for r in recs])):
            r["beyond_noise"] = sig
        for bi in range(len(buckets)):
            for r, sig in zip(recs, bh([r["buckets"][bi]["p"] for r in recs])):
                r["buckets"][bi]["beyond_noise"] = sig
        conditions += recs
    massive = None
    if moments is not None:
        from poslens.capture.intervene import massive_mask

        massive = {str(l): {"q": int(massive_mask(moments.q_rms[l], cfg.massive_lambda).sum()),
                            "k": int(massive_mask(moments.k_rms[l], cfg.massive_lambda).sum())}
                   for l in sorted(moments.q_rms)}
    summary = {
        "model_type": setup.adapter.model_type, "num_layers": L, "seq_len": S, "num_seqs": int(setup.ids.shape[0]),
        "noise_groups": min(cfg.noise_groups, int(setup.ids.shape[0])), "level": LEVEL,
        "loss_base": float(loss0.double().mean()),
        "loss_base_se": paired_stats(loss0.double().mean(1), cfg.noise_groups)["se"],
        "interventions": [iv.name for iv in setup.interventions],
        "layer_sets": setup.layer_sets, "buckets": [[lo, hi - 1] for lo, hi in buckets],
        "conditions": conditions, "massive_dims": massive, "replayed_prefix": replay_ok,
        "seconds": seconds,
    }
    summary["findings"] = findings(summary)
    tensors = {"loss_base": loss0.to(torch.float32)}
    for c in conditions:
        tensors[f"loss.{c['name']}"] = losses[c["name"]].to(torch.float32)
    return summary, tensors


def _layers_text(ls: list[int]) -> str:
    """``[3]`` -> "layer 3"; ``[20, ..., 29]`` -> "layers 20–29"; ``[1, 4]`` -> "layers 1, 4"."""
    if len(ls) == 1:
        return f"layer {ls[0]}"
    runs, start = [], ls[0]
    for a, b in zip(ls, ls[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}–{a}")
            start = b
    return "layers " + ", ".join(runs)


_WHAT = {"rope-off": "switching RoPE off", "sink-off": "removing the attention sink (key 0)",
         "massive-qk": "replacing the massive q/k dimensions by their mean",
         "random-qk": "replacing as many random non-massive q/k dimensions by their mean"}


def _what(iv: str) -> str:
    if iv.startswith("rope-band:"):
        return f"leaving RoPE's {iv.split(':')[1]}-frequency pairs unrotated"
    if iv.startswith("window:"):
        return f"masking keys more than {iv.split(':')[1]} positions back"
    return _WHAT.get(iv, iv)


def findings(summary: dict) -> list[str]:
    """One plain sentence per intervention: how much the loss changes, where, and against the noise."""
    out = []
    L = summary["num_layers"]
    for iv in summary["interventions"]:
        recs = [c for c in summary["conditions"] if c["intervention"] == iv]
        if not recs:
            continue
        base = f"{_what(iv)}"
        idle = [l for r in recs if not r["applies"] for l in r["layers"]]
        if idle:
            out.append(f"{iv}: no RoPE in {_layers_text(idle)}, nothing to switch off there.")
            recs = [r for r in recs if r["applies"]]
            if not recs:
                continue
        if len(recs) == 1:
            r = recs[0]
            where = "in every layer" if r["layers"] == list(range(L)) else f"in {_layers_text(r['layers'])}"
            out.append(f"{base[0].upper()}{base[1:]} {where} {_change(r)}.")
            continue
        sig = [r for r in recs if r["beyond_noise"]]
        quiet = [r["layers"][0] for r in recs if not r["beyond_noise"]]
        top = max(recs, key=lambda r: abs(r["delta"]["mean"]))
        text = f"{base[0].upper()}{base[1:]} one layer at a time: in {_layers_text(top['layers'])} alone it {_change(top)}"
        if sig:
            text += f"; {len(sig)} of {len(recs)} layers change the loss beyond the noise"
        if quiet:
            text += f"; in {_layers_text(quiet)} by less than the noise"
        out.append(text + f" (false discovery rate {summary['level']}).")
    return out


def _change(r: dict) -> str:
    d = r["delta"]
    if d["mean"] == 0.0 and not d["se"]:
        return "leaves the loss unchanged on every sequence"
    se = f" ± {fmt(d['se'])}" if d["se"] is not None else ""
    verb = "raises" if d["mean"] > 0 else "lowers"
    text = f"{verb} the loss by {fmt(abs(d['mean']))}{se} nats per token"
    b = [x for x in r["buckets"] if x["mean"] is not None]
    if b and abs(d["mean"]) > 0:
        big = max(b, key=lambda x: x["mean"] if d["mean"] > 0 else -x["mean"])
        text += f", most at positions {big['positions'][0]}–{big['positions'][1]} ({fmt(big['mean'])})"
    if not r.get("beyond_noise"):
        text += ", within the noise"
    return text


# --------------------------------------------------------------------------------------------
# the run directory
# --------------------------------------------------------------------------------------------
def write_run(out: Path, cfg: AblateConfig, setup: _Setup, summary: dict, tensors: dict) -> None:
    """``config.json``, ``summary.json`` (with a ``tables`` entry), ``ablate.safetensors`` and one figure
    per intervention, staged and swapped in whole."""
    from poslens.rundir import staged_dir, versions, write_json, write_summary, write_tensors

    with staged_dir(out) as stage:
        write_json(stage / "config.json", {
            "command": "ablate", "options": dataclasses.asdict(cfg), "model_source": setup.origin,
            "source": setup.source, "model_type": setup.adapter.model_type, "dtype": str(setup.dtype),
            "device": setup.device, "versions": versions()})
        write_tensors(stage / "ablate.safetensors", tensors)
        figs = []
        if cfg.figures:
            from poslens.report.ablate import ablate_figures

            figs = ablate_figures(summary, stage)
        s = dict(summary, tables=[condition_table(summary)], figures=figs,
                 layers=layer_rows(summary))
        write_summary(stage, s, command="ablate", paper=["kim"],
                      layers_describe="each decoder layer ablated alone: the paired change of next-token loss")


def condition_table(summary: dict) -> dict:
    """The conditions as one table (``summary["tables"]``): loss change, SE, p, beyond the noise."""
    rows = [[c["name"], c["intervention"], _layers_text(c["layers"]), c["delta"]["mean"], c["delta"]["se"],
             c["delta"]["p"], c["beyond_noise"]] for c in summary["conditions"]]
    return {"name": "conditions", "columns": ["condition", "intervention", "layers", "delta_loss", "se", "p",
                                              "beyond_noise"], "rows": rows,
            "caption": "Paired change of the mean next-token loss (nats per token) against the unmodified model on "
                       "the same sequences; SE from sequence groups; beyond_noise at a false discovery rate of "
                       f"{summary['level']} over each intervention's layers. Decoder layers count from 0."}


def layer_rows(summary: dict) -> list[dict]:
    """One entry per decoder layer ablated alone: ``delta_<intervention>`` and its SE."""
    rows: dict[int, dict] = {}
    for c in summary["conditions"]:
        if len(c["layers"]) != 1:
            continue
        l = c["layers"][0]
        row = rows.setdefault(l, {"layer": l})
        row[f"delta_{c['intervention']}"] = c["delta"]["mean"]
        row[f"delta_{c['intervention']}_se"] = c["delta"]["se"]
    return [rows[l] for l in sorted(rows)]
