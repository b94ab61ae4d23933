"""The run of ``poslens ablate``: validate, calibrate, the losses of every condition, probes, readings, the run directory."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from poslens.analysis.ablate.config import (
    DEFAULT_NUM_SEQS,
    DEFAULT_SEQ_LEN,
    AblateConfig,
    condition_name,
    parse_layers,
)
from poslens.analysis.ablate.losses import (
    LossHead,
    bh,
    condition_record,
    paired_stats,
    position_buckets,
)
from poslens.analysis.ablate.replay import LayerReplay
from poslens.capture.engine.intervene import (
    CALIBRATED,
    Edits,
    Moments,
    layer_edit,
    parse_intervention,
)
from poslens.conventions import MAX_HELD_TOKENS, NOISE_P
from poslens.errors import PoslensError
from poslens.fmt import layers_text


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
    from poslens.capture.model.load import checked_adapter, load_tokenizer, open_model_config
    from poslens.capture.scan.plan import loaded_model_config, loaded_model_tokenizer
    from poslens.data.sources import is_python_data, make_source, python_source
    from poslens.errors import require_positive

    python = data is not None and is_python_data(data)
    seq_len = cfg.seq_len if cfg.seq_len is not None or python else DEFAULT_SEQ_LEN
    num_seqs = cfg.num_seqs if cfg.num_seqs is not None or python else DEFAULT_NUM_SEQS
    require_positive(("--batch-size", cfg.batch_size), ("--noise-groups", cfg.noise_groups),
                     *((("--num-seqs", num_seqs),) if num_seqs is not None else ()),
                     *((("--seq-len", seq_len),) if seq_len is not None else ()))
    if num_seqs is not None and seq_len is not None and num_seqs * seq_len > MAX_HELD_TOKENS:  # held at once
        raise PoslensError(f"--num-seqs {num_seqs} x --seq-len {seq_len}: {num_seqs * seq_len:,} tokens, too many; "
                           f"ablate holds every sequence at once, at most {MAX_HELD_TOKENS:,} tokens.")
    if cfg.noise_groups < 2:
        raise PoslensError(f"--noise-groups {cfg.noise_groups}: the standard errors need at least 2 sequence groups; "
                           "pass 2 or more (8 by default).")
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
    from poslens.capture.model.adapters import layer_rope, rope_tables
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
    from poslens.capture.model.adapters import hook_position_embeddings

    def _rope(layer, cs):
        if edits.is_active():
            edits.cos_sin[layer] = (cs[0], cs[1])
    return [hook_position_embeddings(model, adapter, l, _rope) for l in layers]


def run_ablate(cfg: AblateConfig, progress: bool = True, *, model=None, tokenizer=None, data=None) -> dict:
    """Run the ablation and write its run directory (``cfg.out``); returns ``{"summary", "tensors"}``.

    ``model``: a causal LM already loaded (handed back as it was); ``tokenizer``/``data``: as
    :func:`poslens.scan` takes them."""
    import shutil
    import tempfile

    from poslens.capture.model.adapters import check_dispatch
    from poslens.capture.model.borrow import borrowed, model_device, model_dtype
    from poslens.capture.model.load import load_model
    from poslens.capture.model.source import source_record
    from poslens.rundir.outdir import commit_out_dir, create_out_dir, prepare_out_dir
    from poslens.rundir.lock import mark_failed, release_out_dir
    from poslens.runtime import no_hf_progress_bars, parse_device, resolve_dtype

    t0 = time.time()
    config, adapter, ivs, layer_sets, src = _validate(cfg, model, tokenizer, data)
    out = Path(cfg.out) if cfg.out is not None else None
    if out is not None:
        prepare_out_dir(out, must_be_new=not cfg.overwrite)
        # a run replacing another is written beside it and swapped in at the end (commit_out_dir)
        target = create_out_dir(out, command="ablate", overwrite=cfg.overwrite, staged=True)
    scans = Path(tempfile.mkdtemp(prefix="poslens-ablate-scans-")) if cfg.readings else None
    try:
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
            moments = _calibrate(cfg, setup, progress) if any(iv.kind in CALIBRATED for iv in ivs) else None
            edits = _build_edits(cfg, setup, bands, moments)
            handles = [h for _, _, e in edits for h in _hooks_for(e, model, adapter, sorted(e.layers))]
            try:
                losses, replay_ok = _losses(cfg, setup, edits, progress)
                readings = _readings(cfg, setup, edits, scans, progress) if cfg.readings else None
                probes = _probes(cfg, setup, edits, progress) if cfg.probes else None
            finally:
                for h in handles:
                    h.remove()
        summary, tensors = _summarise(cfg, setup, losses, replay_ok, moments, readings, probes, time.time() - t0)
        if out is not None:
            write_run(out, cfg, setup, summary, tensors, scans, into=target)
            commit_out_dir(out)
    except Exception:
        if out is not None:
            mark_failed(out)  # a new --out is emptied again when its lock is given back
        raise
    finally:
        if scans is not None:
            shutil.rmtree(scans, ignore_errors=True)
        if out is not None:
            release_out_dir(out)  # the hold create_out_dir took (an uncommitted stage goes with it)
    return {"summary": summary, "tensors": tensors}


def _batches(cfg: AblateConfig, setup: _Setup) -> list[tuple[int, int]]:
    N = setup.ids.shape[0]
    return [(s, min(N, s + cfg.batch_size)) for s in range(0, N, cfg.batch_size)]


def _attention_modules(setup: _Setup) -> list:
    return [setup.adapter.attention_module(setup.model, l) for l in range(setup.adapter.num_layers(setup.config))]


def _calibrate(cfg: AblateConfig, setup: _Setup, progress: bool) -> Moments:
    """The massive dims and their means: each layer's pre-RoPE q/k moments over every sequence."""
    from poslens.progress import task_progress

    model, adapter = setup.model, setup.adapter
    cal = Edits({}, rope_layers=adapter.rope_layers(setup.config), layout=adapter.rope_layout, moments=True)
    cal.bind(_attention_modules(setup))
    handles = _hooks_for(cal, model, adapter, range(adapter.num_layers(setup.config)))
    batches = _batches(cfg, setup)
    try:
        with task_progress("calibrate (massive q/k)", len(batches), enabled=progress) as update, cal.active():
            for n, (s, e) in enumerate(batches, 1):
                _forward_logits(model, setup.ids[s:e].to(setup.device))
                update(n)
    finally:
        for h in handles:
            h.remove()
    return Moments.from_edits(cal)


def _build_edits(cfg: AblateConfig, setup: _Setup, bands, moments) -> list[tuple[str, int, Edits]]:
    """``(condition name, first ablated layer, Edits)`` of every condition, bound to the model's attention."""
    adapter = setup.adapter
    L = adapter.num_layers(setup.config)
    attn = _attention_modules(setup)
    gen = torch.Generator().manual_seed(cfg.seed)
    out = []
    for iv in setup.interventions:
        for ls in setup.layer_sets:
            e = Edits({l: layer_edit(iv, l, band_labels=bands[l], moments=moments, massive_lambda=cfg.massive_lambda,
                                     generator=gen) for l in ls},
                      rope_layers=adapter.rope_layers(setup.config), layout=adapter.rope_layout)
            e.bind(attn)
            out.append((condition_name(iv, ls, L), min(ls), e))
    return out


def _losses(cfg: AblateConfig, setup: _Setup, edits, progress: bool):
    """Every condition's per-token losses ``{name: [N, S - 1]}`` (``"none"``: the model as it is) and
    whether the earlier layers were replayed.

    The forwards: per batch the unmodified one (every layer's output recorded), then one per
    condition from its first ablated layer on (the layers before it run on one token, their
    output replaced by the recorded one); the loss from the final hidden states, a block of positions
    at a time (:class:`LossHead`). No capture runs. The first batch checks the replay bit for bit
    against a full forward (on one token, else on one sequence; where neither gives it, every
    condition runs the whole model)."""
    from poslens.progress import task_progress

    model, adapter, ids = setup.model, setup.adapter, setup.ids
    L = adapter.num_layers(setup.config)
    N, S = ids.shape
    batches = _batches(cfg, setup)
    replay = LayerReplay(adapter.decoder_layers(model))
    head = LossHead(model)
    names = ["none"] + [name for name, _, _ in edits]
    losses = {k: torch.empty(N, S - 1, dtype=torch.float32) for k in names}  # before any forward: no gaps in the heap
    replay_ok, one_token = (None if cfg.replay else False), True
    with task_progress("ablate", len(batches) * (1 + len(edits)), enabled=progress) as update:
        step = 0
        for s, e_ in batches:
            x = ids[s:e_].to(setup.device)
            with replay.recording():
                losses["none"][s:e_] = head.forward(x, check=step == 0)
            step += 1
            update(step)
            if replay_ok is None:  # the replayed layers must give the full forward's losses, bit for bit
                replay_ok, one_token = _check_replay(replay, head, x, losses["none"][s:e_], max(1, L - 1))
            for name, first, ed in edits:
                with replay.replaying(first if replay_ok else 0, one_token), ed.active():
                    losses[name][s:e_] = head.forward(x)
                step += 1
                update(step)
            replay.outputs = [None] * len(replay.outputs)
    return losses, bool(replay_ok)


def _check_replay(replay: LayerReplay, head: LossHead, x, base: torch.Tensor, k: int) -> tuple[bool, bool]:
    """``(replay works, on one token)``: the replayed layers on one token where that gives the losses of the
    full forward bit for bit, else on one sequence, else no replay. The caller replays every layer but the
    last (``k = L - 1``): the cheapest forward to check, and the one that runs the most layers on one
    token and hands the last layer what every earlier one passed on."""
    for one_token in (True, False):
        try:
            with replay.replaying(k, one_token):
                again = head.forward(x)
        except (RuntimeError, ValueError, IndexError):  # a layer that cannot run on one token
            continue
        if torch.equal(again, base):
            return True, one_token
    return False, False


def _resid_vectors(setup: _Setup, batches, edits: Edits | None) -> list[torch.Tensor]:
    """The residual stream after every decoder layer, ``L x [N, S, d]`` float32 on the CPU, under ``edits``."""
    from poslens.capture.model.adapters import hook_point

    model, adapter = setup.model, setup.adapter
    L = adapter.num_layers(setup.config)
    parts: list[list] = [[] for _ in range(L)]
    handles = [hook_point(model, adapter, "resid_post", l, lambda x, l=l: parts[l].append(x.detach().float().cpu()))
               for l in range(L)]
    try:
        with edits.active() if edits is not None else contextlib.nullcontext():
            for s, e in batches:
                _forward_logits(model, setup.ids[s:e].to(setup.device))
    finally:
        for h in handles:
            h.remove()
    return [torch.cat(p) for p in parts]


def probe_split(num_seqs: int) -> tuple[list[int], list[int], list[int]]:
    """``(test, fit_a, fit_b)`` sequence indices: the first half is the test set (paired over conditions,
    in noise groups), the second half fits the probe, its two halves choose the ridge."""
    half = num_seqs // 2
    fit = list(range(half, num_seqs))
    return list(range(half)), fit[: len(fit) // 2], fit[len(fit) // 2:]


def _probe_layer(h: torch.Tensor, split, ridge: float | None) -> dict:
    """The linear position probe of one layer (:mod:`poslens.metrics.probes`, feature ``vector``: the
    residual vector, target its absolute position), fit on the fitting sequences and tested on the test
    ones: ``r``, ``mse`` and the per-test-sequence squared error ``seq_mse``; the ridge chosen on the two
    halves of the fitting set when ``ridge`` is None."""
    from poslens.metrics.probes import (
        _standardise,
        fit_linear,
        pearson_r,
        predict_linear,
        probe_features,
        select_ridge,
    )

    test, fa, fb = split
    X, y = probe_features(h[fa + fb])["vector"]
    Xt, yt = probe_features(h[test])["vector"]
    if ridge is None:
        ridge = select_ridge(*probe_features(h[fa])["vector"], *probe_features(h[fb])["vector"])
    Xs, Xts = _standardise(X, Xt)
    pred = predict_linear(fit_linear(Xs, y, ridge=ridge), Xts)
    err = (pred - yt) ** 2
    return {"r": pearson_r(pred, yt), "mse": float(err.mean()), "ridge": ridge,
            "seq_mse": err.view(len(test), -1).mean(1)}


def _probes(cfg: AblateConfig, setup: _Setup, edits, progress: bool) -> dict:
    """Position probes from every layer's residual stream, without an intervention and under each one:
    ``{name: [per layer {"layer", "r", "mse", "ridge", "seq_mse"}]}``."""
    from poslens.progress import task_progress

    N = setup.ids.shape[0]
    if N < 4:
        raise PoslensError(f"--probes needs at least 4 sequences (half fit the probe, half test it); got {N}.")
    split = probe_split(N)
    batches = _batches(cfg, setup)
    out: dict = {}
    runs = [("none", None)] + [(name, e) for name, _, e in edits]
    with task_progress("position probes", len(runs), enabled=progress) as update:
        for n, (name, e) in enumerate(runs, 1):
            vecs = _resid_vectors(setup, batches, e)
            ridges = [r["ridge"] for r in out["none"]] if "none" in out else [None] * len(vecs)
            out[name] = [{"layer": l, **_probe_layer(h, split, ridges[l])} for l, h in enumerate(vecs)]
            del vecs
            update(n)
    return out


#: the statistics of the scans under each condition (``readings``) and the slash threshold κ
READING_STATS = "scores,probs,slash"
SLASH_KAPPA = 0.3


def scan_dir_name(condition: str) -> str:
    """A condition's scan folder under ``scans/``: ``rope-band:low@0,3`` -> ``rope-band_low@0,3``."""
    return condition.replace(":", "_")


def _readings(cfg: AblateConfig, setup: _Setup, edits, scans: Path, progress: bool) -> dict:
    """A scan (scores, probs, slash) of the same sequences under every condition and without one, each
    into ``scans/<condition>``; returns each one's readings (:func:`scan_readings`)."""
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.data.sources import python_source
    from poslens.progress import task_progress

    src, label = python_source(setup.ids, seq_len=None, num_seqs=None)
    out = {}
    runs = [("none", None)] + [(name, e) for name, _, e in edits]
    with task_progress("readings (scans)", len(runs), enabled=progress) as update:
        for n, (name, e) in enumerate(runs, 1):
            d = scans / scan_dir_name(name)
            scfg = ScanConfig(model_dir=str(cfg.model_dir), out=str(d), data=label, seq_len=src.seq_len,
                              num_seqs=src.num_seqs, batch_size=cfg.batch_size, stats=READING_STATS, figures=False,
                              seed=cfg.seed)
            with e.active() if e is not None else contextlib.nullcontext():
                run_scan(scfg, progress=False, model=setup.model, source=src)
            out[name] = scan_readings(d)
            update(n)
    return out


def scan_readings(scan_dir: Path, kappa: float = SLASH_KAPPA) -> dict:
    """A scan's headline readings: the median relativity index over layers (key 0 left out, noise-corrected;
    flat layers left out), the mean sink weight over layers, and the slash heads: heads whose SlashScore
    reaches ``kappa`` at some offset 1 .. 16 (arXiv 2601.08297)."""
    import statistics

    from poslens.conventions import SLASH_MAX_DELTA
    from poslens.rundir.io import read_json, read_tensors

    summary = read_json(scan_dir / "summary.json")
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict)]
    ri = [float(l["relativity_index"]) for l in layers if isinstance(l.get("relativity_index"), (int, float))]
    sink = [float(l["sink_weight"]) for l in layers if isinstance(l.get("sink_weight"), (int, float))]
    slash = read_tensors(scan_dir / "maps.safetensors").get("slash")
    heads = []
    if slash is not None and slash.shape[-1] > 1:
        w = slash[..., 1:min(SLASH_MAX_DELTA, slash.shape[-1] - 1) + 1].double().nan_to_num(-1.0)
        best = w.max(-1).values  # [L, H]
        heads = [[int(l), int(h)] for l, h in (best >= kappa).nonzero().tolist()]
    return {"relativity_median": statistics.median(ri) if ri else None, "relativity_layers": len(ri),
            "sink_weight": sum(sink) / len(sink) if sink else None, "slash_heads": len(heads),
            "slash_head_list": heads}


# --------------------------------------------------------------------------------------------
# the summary
# --------------------------------------------------------------------------------------------
def _summarise(cfg: AblateConfig, setup: _Setup, losses: dict, replay_ok: bool, moments, readings, probes,
               seconds: float):
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
            if readings:
                rec["readings"] = readings[name]
            if probes:
                rec["probe"] = _probe_record(probes["none"], probes[name], cfg.noise_groups)
            if iv.kind in CALIBRATED and moments is not None:  # no massive dim in these layers: nothing replaced
                from poslens.capture.engine.intervene import massive_mask

                rec["applies"] = any(bool(massive_mask(moments.q_rms[l], cfg.massive_lambda).any()
                                          or massive_mask(moments.k_rms[l], cfg.massive_lambda).any()) for l in ls)
            recs.append(rec)
        for r, sig in zip(recs, bh([r["delta"]["p"] for r in recs])):
            r["beyond_noise"] = sig
        for bi in range(len(buckets)):
            for r, sig in zip(recs, bh([r["buckets"][bi]["p"] for r in recs])):
                r["buckets"][bi]["beyond_noise"] = sig
        conditions += recs
    massive = None
    if moments is not None:
        from poslens.capture.engine.intervene import massive_mask

        massive = {str(l): {"q": int(massive_mask(moments.q_rms[l], cfg.massive_lambda).sum()),
                            "k": int(massive_mask(moments.k_rms[l], cfg.massive_lambda).sum())}
                   for l in sorted(moments.q_rms)}
    summary = {
        "model_type": setup.adapter.model_type, "num_layers": L, "seq_len": S, "num_seqs": int(setup.ids.shape[0]),
        "noise_groups": min(cfg.noise_groups, int(setup.ids.shape[0])), "level": NOISE_P,
        "loss_base": float(loss0.double().mean()),
        "loss_base_se": paired_stats(loss0.double().mean(1), cfg.noise_groups)["se"],
        "interventions": [iv.name for iv in setup.interventions],
        "layer_sets": setup.layer_sets, "buckets": [[lo, hi - 1] for lo, hi in buckets],
        "conditions": conditions, "massive_dims": massive, "replayed_prefix": replay_ok,
        "readings_base": readings["none"] if readings else None,
        "probe_base": [{k: v for k, v in r.items() if k != "seq_mse"} for r in probes["none"]] if probes else None,
        "seconds": seconds,
    }
    tensors = {"loss_base": loss0.to(torch.float32)}
    for c in conditions:
        tensors[f"loss.{c['name']}"] = losses[c["name"]].to(torch.float32)
    return summary, tensors


def _probe_record(base: list[dict], cond: list[dict], groups: int) -> list[dict]:
    """Per layer: the probe's ``r`` and ``mse`` under the condition and the paired change of the test
    sequences' squared error (``delta_mse``: mean, se, p) against the unmodified model."""
    return [{"layer": c["layer"], "r": c["r"], "mse": c["mse"], "r_base": b["r"],
             "delta_mse": paired_stats(c["seq_mse"] - b["seq_mse"], groups)} for b, c in zip(base, cond)]


# --------------------------------------------------------------------------------------------
# the run directory
# --------------------------------------------------------------------------------------------
def write_run(out: Path, cfg: AblateConfig, setup: _Setup, summary: dict, tensors: dict,
              scans: Path | None = None, into: Path | None = None) -> None:
    """``config.json``, ``summary.json`` (with a ``tables`` entry), ``ablate.safetensors`` and one figure
    per intervention, staged and swapped in whole: into ``into``, the staging directory of a run replacing
    another (:func:`poslens.rundir.outdir.create_out_dir`, swapped in by ``commit_out_dir``), else into a stage of
    its own."""
    from poslens.rundir.staging import staged_dir

    if into is not None and into != out:
        _write_files(into, cfg, setup, summary, tensors, scans)
        return
    with staged_dir(out) as stage:
        _write_files(stage, cfg, setup, summary, tensors, scans)


def _write_files(stage: Path, cfg: AblateConfig, setup: _Setup, summary: dict, tensors: dict,
                 scans: Path | None) -> None:
    from poslens.rundir.io import versions, write_json, write_tensors
    from poslens.rundir.summary import write_summary

    write_json(stage / "config.json", {
        "command": "ablate", "options": dataclasses.asdict(cfg), "model_source": setup.origin,
        "source": setup.source, "model_type": setup.adapter.model_type, "dtype": str(setup.dtype),
        "device": setup.device, "versions": versions()})
    write_tensors(stage / "ablate.safetensors", tensors)
    if scans is not None and any(scans.iterdir()):
        import shutil

        shutil.copytree(scans, stage / "scans")
    figs = []
    if cfg.figures:
        from poslens.analysis.ablate.figures import ablate_figures

        figs = ablate_figures(summary, stage)
    s = dict(summary, tables=[condition_table(summary)], figures=figs, readings=[],
             layers=layer_rows(summary))
    write_summary(stage, s, command="ablate", paper=["kim"],
                  layers_describe="each decoder layer ablated alone: the paired change of next-token loss")


def condition_table(summary: dict) -> dict:
    """The conditions as one table (``summary["tables"]``): loss change, SE, p, beyond the noise."""
    rows = [[c["name"], c["intervention"], layers_text(c["layers"]), c["delta"]["mean"], c["delta"]["se"],
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
