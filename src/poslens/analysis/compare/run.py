"""The run of ``poslens compare``: two variants of a model on the same sequences, every positional
reading per sequence group, paired differences with their noise, verdicts, the run directory.

Flow: validate every input (nothing loaded or written) -> the sequences, once, at the longest length
-> side A: for each length, each sequence group's capture (``scores``, ``slash``, ``qk``, the
attention entropy and every head's block-mean weight map) and next-token losses from the same
forwards -> side B the same (the same model under its variants, undone afterwards, or the other
model, loaded after A is freed) -> paired
statistics (:func:`poslens.metrics.noise.paired_groups`), verdicts
(:func:`poslens.metrics.verdicts.change_verdicts`) -> ``compare.safetensors``, ``summary.json``,
figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from poslens.analysis.compare.config import CompareConfig, parse_lengths
from poslens.analysis.compare.readings import (COMPARE_STATS, HEAD_READINGS, LAYER_READINGS, HeadEntropy,
                                               bucket_losses, energy_readings, mean_distance, next_token_losses,
                                               score_map_readings, sink_share, slash_profile)
from poslens.conventions import CHANGE_THRESHOLDS, LAYER_CONVENTION, NOISE_P, SLASH_MIN_DELTA
from poslens.errors import PoslensError, require_positive
from poslens.metrics.noise import min_pvalue, paired_groups
from poslens.metrics.verdicts import CHANGED, change_verdicts

#: the sides of a comparison
SIDES = ("a", "b")


@dataclass
class _Side:
    """One side of the comparison: where its model comes from and what is applied to it."""

    name: str  # "a" or "b"
    model_dir: str | None  # a path (loaded here), or None for a model given in memory
    model: object | None  # the caller's model, handed back as it was
    variants: list  # parsed variants (side b only)
    label: str = ""
    config: object = None
    adapter: object = None
    origin: dict | None = None


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------
def _open_config(side: _Side, cfg: CompareConfig):
    from poslens.capture.model.load import open_model_config
    from poslens.capture.scan.plan import loaded_model_config

    if side.model is not None:
        return loaded_model_config(side.model)
    return open_model_config(side.model_dir, allow_pickle=cfg.allow_pickle, trust_remote_code=cfg.trust_remote_code)


def _tokenizer(side: _Side, cfg: CompareConfig):
    from poslens.capture.model.load import load_tokenizer
    from poslens.capture.scan.plan import loaded_model_tokenizer

    return loaded_model_tokenizer(side.model) if side.model is not None else \
        load_tokenizer(side.model_dir, cfg.trust_remote_code)


def _same_vocabulary(a, b) -> bool:
    try:
        return a.get_vocab() == b.get_vocab()
    except Exception:  # a tokenizer without a vocabulary listing: compare what encodes text
        probe = "def f(x):\n    return x + 1  # héllo"
        return a(probe)["input_ids"] == b(probe)["input_ids"]


def _check_pair(a: _Side, b: _Side, tok_a, tok_b) -> None:
    """Two different models must read the same tokens and have the same layer and head grid."""
    La, Lb = a.adapter.num_layers(a.config), b.adapter.num_layers(b.config)
    Ha, Hb = a.adapter.num_heads(a.config), b.adapter.num_heads(b.config)
    if (La, Ha) != (Lb, Hb):
        raise PoslensError(f"{b.label}: {Lb} layers × {Hb} heads against {La} × {Ha} for {a.label}; compare "
                           "variants of one architecture (same layer and head counts).")
    va, vb = getattr(a.config, "vocab_size", None), getattr(b.config, "vocab_size", None)
    if (tok_a is None) != (tok_b is None) or va != vb or (tok_a is not None and not _same_vocabulary(tok_a, tok_b)):
        raise PoslensError(f"{b.label}: its tokenizer differs from {a.label}'s (vocabulary {vb} against {va}); "
                           "the same tokens must mean the same to both: compare models that share a tokenizer.")


def _check_lengths(lengths: list[int], a: _Side, cfg: CompareConfig, python: bool) -> int | None:
    """The trained context of the reference model; a length past it is refused without ``beyond_context``, and
    always for a model with a learned position table (it has no row for such a position)."""
    from poslens.capture.model.load import trained_context

    trained = trained_context(a.adapter, a.config)
    over = [S for S in lengths if trained is not None and S > trained]
    if over and not cfg.beyond_context:
        flag, fix = ("seq_len", "beyond_context=True") if python else ("--seq-len", "--beyond-context")
        raise PoslensError(f"{flag} {over[0]} exceeds {a.label}'s trained context of {trained} positions; pass "
                           f"{fix} to measure past it, or lengths up to {trained}.")
    if over and a.adapter.position_table is not None:
        raise PoslensError(f"{'seq_len' if python else '--seq-len'} {over[0]}: {a.label} (model type "
                           f"{a.adapter.model_type}) has a learned position table of {trained} rows and cannot run "
                           f"past it; compare lengths up to {trained}.")
    return trained


# --------------------------------------------------------------------------------------------
# one side
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _model_of(side: _Side, cfg: CompareConfig, progress: bool):
    """The side's model for the block: the caller's (handed back as it was) or loaded here (freed after)."""
    from poslens.capture.model.borrow import borrowed
    from poslens.capture.model.load import load_model
    from poslens.runtime import no_hf_progress_bars, parse_device, resolve_dtype

    if side.model is not None:
        with borrowed(side.model):
            yield side.model
        return
    device = parse_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device, side.config)
    with no_hf_progress_bars(not progress):
        model = load_model(side.model_dir, dtype=dtype, device=device, allow_pickle=cfg.allow_pickle,
                           trust_remote_code=cfg.trust_remote_code)
    try:
        yield model
    finally:
        del model
        gc.collect()


def _measure(model, side: _Side, ids: torch.Tensor, lengths: list[int], G: int, cfg: CompareConfig, edits,
             update, labels: dict | None) -> dict:
    """Every reading of every sequence group at every length, and every sequence's losses:
    ``{S: {"readings": {name: [G, ...]}, "profile": [G, L, H, D], "losses": [N, S - 1], "seq_losses": [N, 1 + buckets], ...}}``.
    ``labels``: the RoPE band of each rotary pair per length and layer (the reference side's; None: this
    side's own, which it returns)."""
    from poslens.analysis.ablate.losses import position_buckets
    from poslens.capture.engine.capture import Capture
    from poslens.capture.engine.loop import attach, forward
    from poslens.capture.model.adapters import check_dispatch, layer_rope, rope_tables
    from poslens.capture.model.borrow import model_device
    from poslens.capture.scan.finalize import map_view
    from poslens.rope import frequency_bands

    adapter, config = side.adapter, side.config
    device = model_device(model)
    N = ids.shape[0]
    dispatch = check_dispatch(model, adapter)
    rope = rope_tables(model, adapter, config)
    base = model.base_model
    out = {}
    for S in lengths:
        x_all = ids[:, :S]
        spec = _capture_spec(model, adapter, config, S, cfg)
        if labels is None or S not in labels:
            own = []
            for l in spec.layers:
                t = layer_rope(rope, l)
                own.append(None if t is None or l not in spec.rope_layers else
                           frequency_bands(int(t["rotary_dim"]), None, S, theta=t["inv_freq"]))
            lab = own
        else:
            lab = labels[S]
        rot = max((int(layer_rope(rope, l)["rotary_dim"]) for l in spec.layers if layer_rope(rope, l)), default=None)
        per: dict[str, list] = {k: [] for k in (*HEAD_READINGS, *LAYER_READINGS)}
        profiles, counts, head_maps = [], [], None
        losses = torch.empty(N, S - 1, dtype=torch.float32)
        cap = Capture(dataclasses.replace(spec, user_stats=(HeadEntropy(),)), device=device)
        handles = attach(model, adapter, cap)
        try:
            for g in range(G):
                members = list(range(g, N, G))
                cap.restart((HeadEntropy(),))  # each group a capture of its own
                for s in range(0, len(members), cfg.batch_size):
                    rows = members[s:s + cfg.batch_size]
                    x = x_all[rows].to(device)
                    with edits.active() if edits is not None else contextlib.nullcontext():
                        h = forward(base, x, capture=cap, kwargs={"use_cache": False}, seq_start=rows[0])
                    losses[rows] = next_token_losses(model, h.last_hidden_state, x).cpu()
                    del h
                    update(len(rows))
                _group_readings(cap, per, profiles, dispatch, spec, S, lab, rot, adapter, map_view)
                counts.append(len(members))
                hm = cap.accs["head_maps"].sum.cpu()  # the group's sums: all sequences' mean below
                head_maps = hm.clone() if head_maps is None else head_maps.add_(hm)
        finally:
            for hd in handles:
                hd.remove()
        del cap
        readings = {k: torch.stack(v) for k, v in per.items() if k != "slash"}
        buckets = position_buckets(S)
        out[S] = {"readings": readings, "profile": torch.stack(profiles), "counts": torch.tensor(counts),
                  "losses": losses, "seq_losses": bucket_losses(losses, buckets), "buckets": buckets,
                  "labels": lab, "layers": list(spec.layers), "head_maps": head_maps / sum(counts)}
    return out


def _group_readings(cap, per: dict, profiles: list, dispatch: dict, spec, S: int, lab, rot, adapter, map_view) -> None:
    """One sequence group's readings from its capture, appended to ``per`` (by name) and ``profiles``."""
    mean = {k: cap.accs[k].mean.cpu() for k in ("sink_heads", "slash", "scores", "q_gram", "k_gram")}
    own = dispatch.get("windows") or [None] * (max(spec.layers) + 1)  # the dry run's, where a layer was not seen
    windows = [cap.windows.get(l, own[l]) for l in spec.layers]
    slash = mean["slash"].to(torch.float64)
    per["sink"].append(sink_share(mean["sink_heads"]))
    prof = slash_profile(slash)
    profiles.append(prof)
    per["prev_token"].append(slash[..., 1] if S > 1 else torch.full(slash.shape[:2], float("nan")))
    per["entropy"].append(cap.user[0].result()["entropy"].to(torch.float64))
    per["distance"].append(mean_distance(slash))
    maps = _score_readings(mean["scores"], windows, cap.blocks, map_view)
    for k, v in maps.items():
        per[k].append(v)
    energy = energy_readings(mean["q_gram"], mean["k_gram"], lab, rot, adapter.rope_layout)
    for k, v in energy.items():
        per[k].append(v)


def _score_readings(scores: torch.Tensor, windows: list, blocks, map_view) -> dict[str, torch.Tensor]:
    """The score-map readings ``{name: [L]}`` of one group's mean score maps ``[L, M, M]``: the layers that
    share a window (the same visible entries) at once (:func:`score_map_readings`)."""
    L = scores.shape[0]
    out = {k: torch.full((L,), float("nan"), dtype=torch.float64) for k in ("relativity", "locality", "diagonal_trend")}
    for w in dict.fromkeys(windows):
        idx = [li for li in range(L) if windows[li] == w]
        got = score_map_readings(torch.stack([map_view(scores[li].to(torch.float64), w, blocks) for li in idx]))
        for k, v in got.items():
            out[k][idx] = v
    return out


def _capture_spec(model, adapter, config, S: int, cfg: CompareConfig):
    """What a compare capture takes at length ``S``: every layer, the statistics of :data:`COMPARE_STATS`
    (the scan's own) and every head's block-mean weight map (``head_maps``, as ``--heads all``), score
    maps as block means under ``map_size``."""
    from poslens.capture.engine.spec import CaptureSpec, parse_stats
    from poslens.capture.scan.plan import planned_rope_layers

    L = adapter.num_layers(config)
    return CaptureSpec(num_layers=L, num_heads=adapter.num_heads(config), num_kv_heads=adapter.num_kv_heads(config),
                       head_dim=adapter.head_dim(config), seq_len=S, layers=list(range(L)),
                       rope_layers=planned_rope_layers(adapter, config, model), stats=parse_stats(COMPARE_STATS),
                       rope_layout=adapter.rope_layout, seed=cfg.seed,
                       map_size=cfg.map_size if 0 < cfg.map_size < S else 0, head_maps=True,
                       # each sequence group is a capture of its own: the scan's noise groups would only cost
                       noise_groups=1, noise_max_positions=2)


# --------------------------------------------------------------------------------------------
# the pairing
# --------------------------------------------------------------------------------------------
def _group_means(x: torch.Tensor, G: int) -> torch.Tensor:
    """``[G, ...]``: the mean of the rows ``n`` with ``n % G == g`` of ``x [N, ...]``."""
    N = x.shape[0]
    return torch.stack([x[g::G].to(torch.float64).mean(0) for g in range(min(G, N))])


def _rows(reading: str, S: int, stats: dict, layers: list[int], heads: bool, extra=None) -> list[dict]:
    """One record per cell (layer, head) of a reading's paired statistics, with its verdict."""
    a, b, d, se, p = (stats[k] for k in ("a", "b", "delta", "se", "p"))
    flat = [x.reshape(-1).tolist() for x in (a, b, d, se, p)]
    none = lambda v: None if v != v else v  # noqa: E731  NaN -> None (JSON)
    verdicts = change_verdicts([none(v) for v in flat[2]], [none(v) for v in flat[3]], [none(v) for v in flat[4]],
                               CHANGE_THRESHOLDS[reading] * (S if reading == "distance" else 1))
    out = []
    H = a.shape[1] if heads else 1
    for i, v in enumerate(verdicts):
        li, h = divmod(i, H) if heads else (i, None)
        rec = {"reading": reading, "seq_len": S, "layer": layers[li] if layers else None, "head": h,
               "a": none(flat[0][i]), "b": none(flat[1][i]), "delta": none(flat[2][i]), "se": none(flat[3][i]),
               "p": none(flat[4][i]), **v}
        if extra:
            rec.update(extra(li, h))
        out.append(rec)
    return out


def pair_sides(A: dict, B: dict, G: int) -> list[dict]:
    """The change records of every reading at every length: per head and per layer (a per-head
    reading's layer row is its mean over heads), the best SlashScore at the reference side's best offset,
    the loss overall and by position bucket."""
    records = []
    for S in A:
        ra, rb, w = A[S]["readings"], B[S]["readings"], A[S]["counts"].to(torch.float64)
        layers = A[S]["layers"]
        for name in HEAD_READINGS:
            if name == "slash":
                pa, pb = A[S]["profile"], B[S]["profile"]  # [G, L, H, D]
                if pa.shape[-1] == 0:
                    continue
                best_a = pa.mean(0).nan_to_num(-1.0).argmax(-1)  # [L, H]: the reference side's best offset
                best_b = pb.mean(0).nan_to_num(-1.0).argmax(-1)
                ga = pa.gather(-1, best_a[None, ..., None].expand(pa.shape[0], -1, -1, 1))[..., 0]
                gb = pb.gather(-1, best_a[None, ..., None].expand(pb.shape[0], -1, -1, 1))[..., 0]
                st = paired_groups(ga, gb, w)
                records += _rows("slash", S, st, layers, True, lambda li, h: {
                    "offset_a": int(best_a[li, h]) + SLASH_MIN_DELTA, "offset_b": int(best_b[li, h]) + SLASH_MIN_DELTA})
                va, vb = ga, gb
            else:
                va, vb = ra[name], rb[name]
                records += _rows(name, S, paired_groups(va, vb, w), layers, True)
            # the layer's row: the mean over its heads
            records += _rows(name, S, paired_groups(va.nanmean(-1), vb.nanmean(-1), w), layers, False)
        for name in LAYER_READINGS:
            records += _rows(name, S, paired_groups(ra[name], rb[name], w), layers, False)
        la, lb = _group_means(A[S]["seq_losses"], G), _group_means(B[S]["seq_losses"], G)
        spans = [[1, S - 1]] + [[lo, hi - 1] for lo, hi in A[S]["buckets"]]  # overall, then each bucket
        records += _rows("loss", S, paired_groups(la, lb, w), [], False, lambda i, h: {"positions": spans[i]})
    return records


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------
def run_compare(cfg: CompareConfig, progress: bool = True, *, model_a=None, model_b=None, tokenizer=None,
                data=None, data_b=None, python: bool | None = None) -> dict:
    """Compare two variants and write the run directory ``cfg.out`` (when given); returns
    ``{"summary": ..., "tensors": ...}``.

    ``model_a`` / ``model_b``: loaded causal LMs (handed back as they were) instead of the paths;
    ``model_b`` None and no ``cfg.model_b``: side B is side A's model under ``cfg.variants``.
    ``data``: sequences from Python; ``data_b``: other sequences for side B (a null check: the same model
    on two disjoint samples, paired row by row), else B reads A's. ``python``: errors name the keywords of
    :func:`poslens.compare` rather than the flags (default: when a model or data came from Python)."""
    from poslens.analysis.compare.variants import applied, parse_variant, variant_label
    from poslens.data.sources import is_python_data, make_source, python_source
    from poslens.progress import task_progress
    from poslens.rundir.lock import mark_failed, release_out_dir
    from poslens.rundir.outdir import commit_out_dir, create_out_dir, prepare_out_dir

    t0 = time.time()
    python = (model_a is not None or data is not None) if python is None else python
    lengths = parse_lengths(cfg.seq_lens, "seq_lens" if python else "--seq-len")
    require_positive(("--num-seqs", cfg.num_seqs), ("--batch-size", cfg.batch_size),
                     ("--noise-groups", cfg.noise_groups))
    if cfg.map_size < 0:
        raise PoslensError(f"--map-size {cfg.map_size}: must be 0 (full maps) or a positive number of blocks.")
    variants = [parse_variant(v) if isinstance(v, str) else v for v in (cfg.variants or [])]
    a = _Side("a", None if model_a is not None else cfg.model_a, model_a, [])
    two = model_b is not None or cfg.model_b is not None
    b = _Side("b", (cfg.model_b if model_b is None else None) if two else a.model_dir,
              model_b if two else model_a, variants)
    a.config, a.adapter = _open_config(a, cfg)
    b.config, b.adapter = (_open_config(b, cfg) if two else (a.config, a.adapter))
    a.label = _model_label(a)
    b.label = _model_label(b) if two else a.label
    text_in_memory = isinstance(data, (list, tuple)) and bool(data) and isinstance(data[0], str)
    needs_text = (data is None and cfg.data != "random") or text_in_memory
    tok_a = tokenizer if tokenizer is not None else (_tokenizer(a, cfg) if needs_text or two else None)
    if two:
        tok_b = _tokenizer(b, cfg)
        _check_pair(a, b, tok_a if tokenizer is None else _tokenizer(a, cfg), tok_b)
    rope_vs = [v for v in variants if v.kind in ("rope-scaling", "rope-theta")]
    if rope_vs and not b.adapter.rope_layers(b.config):
        raise PoslensError(f"--variant {rope_vs[0].name}: model type {b.adapter.model_type!r} has no RoPE to rescale; "
                           "use a RoPE model, or drop the variant.")
    for v in variants:
        if v.kind == "window" and v.window + 1 >= max(lengths):
            raise PoslensError(f"--variant {v.name}: a query sees itself and the {v.window} keys before it, which "
                               f"narrows nothing at {max(lengths)} tokens; pass a window below {max(lengths) - 1}.")
    trained = _check_lengths(lengths, a, cfg, python)
    S_max, N = max(lengths), cfg.num_seqs
    vocab = getattr(a.config, "vocab_size", None)
    if data is not None and is_python_data(data):
        src, _ = python_source(data, seq_len=S_max, num_seqs=N, tokenizer=tok_a, vocab_size=vocab)
    else:
        if tok_a is None and cfg.data != "random":
            raise PoslensError(f"--data {cfg.data}: text needs a tokenizer and none was found beside the model; pass "
                               "--data random or pre-tokenised JSONL.")
        src = make_source(cfg.data if data is None else data, seq_len=S_max, num_seqs=N, seed=cfg.seed,
                          tokenizer=tok_a, vocab_size=vocab)
    ids = src.batch(0, src.num_seqs)
    N = ids.shape[0]
    ids_b = ids
    if data_b is not None:
        src_b, _ = python_source(data_b, seq_len=S_max, num_seqs=N, tokenizer=tok_a, vocab_size=vocab)
        ids_b = src_b.batch(0, src_b.num_seqs)
        if ids_b.shape != ids.shape:
            raise PoslensError(f"data_b: {tuple(ids_b.shape)} sequences × tokens against {tuple(ids.shape)} for data; "
                               "pair samples of the same shape.")
    G = min(cfg.noise_groups, N)
    if G < 2:
        what = "--noise-groups" if cfg.noise_groups < 2 else "--num-seqs"
        raise PoslensError(f"{what} {cfg.noise_groups if cfg.noise_groups < 2 else N}: the paired statistics need at "
                           "least 2 sequence groups (2 sequences or more); pass 2 or more (16 by default).")
    out = Path(cfg.out) if cfg.out is not None else None
    target = None
    if out is not None:
        prepare_out_dir(out, must_be_new=not cfg.overwrite)
        target = create_out_dir(out, command="compare", overwrite=cfg.overwrite, staged=True)
    try:
        results, applied_info = {}, None
        work = 2 * N * len(lengths)
        with task_progress("compare", work, enabled=progress) as update:
            done = [0]

            def step(n):
                done[0] += n
                update(done[0])

            with _model_of(a, cfg, progress) as model:
                a.origin = _origin(a, model)
                if not two:
                    _check_variants(model, variants, a)
                results["a"] = _measure(model, a, ids, lengths, G, cfg, None, step, None)
                if not two:
                    labels = {S: results["a"][S]["labels"] for S in lengths}
                    with applied(model, variants, adapter=a.adapter, config=a.config, ids=ids, seq_len=S_max) as app:
                        applied_info = app.describe()
                        results["b"] = _measure(model, b, ids_b, lengths, G, cfg, app.edits, step, labels)
                    b.origin = a.origin
            if two:
                with _model_of(b, cfg, progress) as model:
                    b.origin = _origin(b, model)
                    labels = {S: results["a"][S]["labels"] for S in lengths}
                    with applied(model, variants, adapter=b.adapter, config=b.config, ids=ids_b,
                                 seq_len=S_max) as app:
                        applied_info = app.describe()
                        results["b"] = _measure(model, b, ids_b, lengths, G, cfg, app.edits, step, labels)
        records = pair_sides(results["a"], results["b"], G)
        summary = _summary(cfg, a, b, variants, variant_label(variants) if variants else "", applied_info, lengths,
                           trained, N, G, records, src.describe(), time.time() - t0)
        tensors = _tensors(results)
        if out is not None:
            write_run(out, cfg, summary, tensors, into=target)
            commit_out_dir(out)
    except Exception:
        if out is not None:
            mark_failed(out)  # a new --out is emptied again when its lock is given back
        raise
    finally:
        if out is not None:
            release_out_dir(out)
    return {"summary": summary, "tensors": tensors}


def _check_variants(model, variants: list, side: _Side) -> None:
    """Apply the variants once and undo them before anything is measured, so that a variant the loaded
    model refuses (a window it does not narrow, two edits of one layer) is refused before the work starts;
    the calibrated interventions (massive-qk, random-qk) are checked when they are applied."""
    from poslens.analysis.compare.variants import applied

    quick = [v for v in variants if getattr(v, "intervention", None) is None
             or v.intervention.kind not in ("massive-qk", "random-qk")]
    if quick:
        with applied(model, quick, adapter=side.adapter, config=side.config, seq_len=2):
            pass


def _model_label(side: _Side) -> str:
    if side.model is not None:
        return str(getattr(side.model, "name_or_path", "") or type(side.model).__name__)
    return Path(str(side.model_dir)).name


def _origin(side: _Side, model) -> dict:
    from poslens.capture.model.source import source_record

    if side.model is not None:
        return {"kind": "in-memory", "class": type(model).__name__,
                "name_or_path": str(getattr(model, "name_or_path", "") or "")}
    return source_record(side.model_dir)


def _summary(cfg, a, b, variants, label, applied_info, lengths, trained, N, G, records, source, seconds):
    L = a.adapter.num_layers(a.config)
    changed = [r for r in records if r["verdict"] == CHANGED]
    return {
        "model_a": a.label, "model_b": b.label, "model_type": a.adapter.model_type,
        "variants": [v.name for v in variants], "variant_label": label, "applied": applied_info,
        "sides": {"a": {"label": a.label, "source": a.origin},
                  "b": {"label": b.label + (f" ({label})" if label else ""), "source": b.origin}},
        "num_layers": L, "num_heads": a.adapter.num_heads(a.config), "num_seqs": N, "seq_lens": lengths,
        "seq_len": max(lengths), "trained_context": trained,
        "beyond_context": {str(S): bool(trained is not None and S > trained) for S in lengths},
        "noise_groups": G, "group_rule": f"sequence n in group n % {G}", "level": NOISE_P,
        "min_p": min_pvalue(G), "map_size": cfg.map_size, "data": source,
        "thresholds": dict(CHANGE_THRESHOLDS), "distance_threshold": "CHANGE_THRESHOLDS['distance'] × S tokens",
        "layer_convention": LAYER_CONVENTION,
        "changes": records, "changed": len(changed),
        "layers": _layer_rows(records, max(lengths)),
        "seconds": seconds,
    }


def _layer_rows(records: list[dict], S: int) -> list[dict]:
    """One entry per decoder layer at the longest length: each per-layer reading's delta and verdict."""
    rows: dict[int, dict] = {}
    for r in records:
        if r["seq_len"] != S or r["layer"] is None or r["head"] is not None:
            continue
        row = rows.setdefault(r["layer"], {"layer": r["layer"]})
        row[f"delta_{r['reading']}"] = r["delta"]
        row[f"{r['reading']}_verdict"] = r["verdict"]
    return [rows[l] for l in sorted(rows)]


def _tensors(results: dict) -> dict[str, torch.Tensor]:
    """``{side}.{S}.{reading}``: every group's reading ``[G, L, (H)]``; ``{side}.{S}.slash_profile``
    ``[G, L, H, D]``; ``{side}.{S}.head_maps``: every head's block-mean weight map over all sequences
    ``[L, H, m, m]`` (float16); ``{side}.{S}.loss``: each sequence's next-token losses ``[N, S - 1]``."""
    out = {}
    for side, res in results.items():
        for S, r in res.items():
            for k, v in r["readings"].items():
                out[f"{side}.{S}.{k}"] = v.to(torch.float32).contiguous()
            out[f"{side}.{S}.slash_profile"] = r["profile"].to(torch.float32).contiguous()
            out[f"{side}.{S}.head_maps"] = r["head_maps"].to(torch.float16).contiguous()
            out[f"{side}.{S}.loss"] = r["losses"].contiguous()
    return out


def write_run(out: Path, cfg: CompareConfig, summary: dict, tensors: dict, into: Path | None = None) -> None:
    """``config.json``, ``summary.json``, ``compare.safetensors`` and figures, staged and swapped in whole."""
    from poslens.rundir.staging import staged_dir

    if into is not None and into != out:
        _write_files(into, cfg, summary, tensors)
        return
    with staged_dir(out) as stage:
        _write_files(stage, cfg, summary, tensors)


def _write_files(stage: Path, cfg: CompareConfig, summary: dict, tensors: dict) -> None:
    from poslens.rundir.io import versions, write_json, write_tensors
    from poslens.rundir.summary import write_summary

    write_json(stage / "config.json", {"command": "compare", "options": dataclasses.asdict(cfg),
                                       "model_source": summary["sides"]["a"]["source"],
                                       "model_source_b": summary["sides"]["b"]["source"],
                                       "versions": versions()})
    write_tensors(stage / "compare.safetensors", tensors)
    figs = []
    if cfg.figures:
        from poslens.analysis.compare.figures import compare_figures  # matplotlib: only when drawing

        figs = compare_figures(summary, tensors, stage)
    s = dict(summary, figures=figs, readings=[], tables=[changes_table(summary)])
    write_summary(stage, s, command="compare", paper=[],
                  layers_describe="each decoder layer: the paired change (B − A) of every per-layer reading at the "
                                  "longest length")


#: changed cells listed in the run's table, largest |delta| / floor first
TABLE_CELLS = 20


def changes_table(summary: dict) -> dict:
    """The changed cells (``summary["tables"]``), at most :data:`TABLE_CELLS`, largest |delta| / floor first."""
    changed = [r for r in summary["changes"] if r["verdict"] == CHANGED and r["delta"] is not None]
    key = lambda r: abs(r["delta"]) / r["floor"] if r.get("floor") else float("inf")  # noqa: E731
    rows = [[r["reading"], r["seq_len"], "—" if r["layer"] is None else
             str(r["layer"]) if r["head"] is None else f"{r['layer']}, {r['head']}",
             r["a"], r["b"], r["delta"], r["se"], r["floor"], r["p"]]
            for r in sorted(changed, key=key, reverse=True)[:TABLE_CELLS]]
    return {"name": "changes", "title": f"changed cells (B − A; the {TABLE_CELLS} largest against their noise floor)",
            "columns": ["reading", "length", "layer, head", "A", "B", "B − A", "se", "floor", "p"], "rows": rows,
            "caption": f"{len(changed)} of {len(summary['changes'])} cells changed. Decoder layers count from 0; "
                       "a layer alone: its mean over heads, or a per-layer reading; — : the loss."}
