"""``run_scan``: stream sequences through a Hugging Face causal LM and accumulate positional maps.

Flow: validate every input (no writes) -> load the model with the poslens attention function ->
for each batch of the deterministic sequence source: forward, accumulate, checkpoint every N
batches (atomically) -> write ``maps.safetensors``, ``summary.json`` and figures.

A run killed at any moment and restarted with ``resume=True`` continues from the last
checkpoint with the same batch partition, so its tensors are bit-identical to an uninterrupted
run.

Under ``torchrun`` the same loop runs on every rank over its share of the batches (``b % world ==
rank``, :mod:`poslens.capture.scan.distributed`), with one checkpoint per rank; the accumulators are
all-reduced at the end and rank 0 writes the run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from poslens.capture.backends import choice as backends
from poslens.capture.scan import distributed as D
from poslens.capture.model.adapters import check_dispatch, rope_tables
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import stats_option
from poslens.capture.model.borrow import borrowed
from poslens.capture.scan.checkpoint import (CHECKPOINT, check_finished, check_resume_layout, checkpoint_meta, rank_checkpoints,
                                        fingerprint, load_checkpoint, resume_mismatch, save_checkpoint)
from poslens.capture.scan.finalize import finalize
from poslens.capture.model.load import load_model
from poslens.capture.engine.loop import attach, forward, forward_kwargs
from poslens.capture.model.source import source_record
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.plan import ScanPlan, plan_scan
from poslens.errors import PoslensError
from poslens.progress import task_progress
from poslens.rundir.outdir import commit_out_dir, create_out_dir
from poslens.rundir.io import record_written, versions, write_json
from poslens.rundir.lock import mark_failed, release_out_dir
from poslens.rundir.summary import write_summary
from poslens.runtime import no_hf_progress_bars


# --------------------------------------------------------------------------------------------
# the scan
# --------------------------------------------------------------------------------------------
def run_scan(cfg: ScanConfig, progress: bool = True, *, stop_after_batches: int | None = None, model=None,
             tokenizer=None, source=None, data=None) -> dict:
    """Run (or resume) a scan and write its run directory; returns the summary dict.

    ``model``: a causal LM already in memory, scanned where it is (its device(s), its dtype) instead of
    loading ``cfg.model_dir``; it is handed back as it was (:mod:`poslens.capture.model.borrow`).
    ``tokenizer`` / ``source``: the text tokenizer / the sequences, given instead of read from the
    model directory / built from ``cfg.data``; ``data``: sequences in memory, packed when the scan is
    planned (:func:`poslens.data.sources.python_source`, :func:`~poslens.capture.scan.plan.plan_scan`).

    Under ``torchrun`` (``WORLD_SIZE`` > 1) every rank scans its shard of the batches
    (:mod:`poslens.capture.scan.distributed`), the accumulators are all-reduced and rank 0 alone
    writes the run directory; other ranks return ``{"rank": r, "world_size": w}``.

    ``stop_after_batches`` ends the loop early after that many batch steps of this call, leaving
    a checkpoint as a killed run would (used by tests of resume).
    """
    ctx = D.detect()
    restore = D.announce_sigterm(ctx)
    try:
        return _run_scan(cfg, progress, stop_after_batches, ctx, model,
                         dict(tokenizer=tokenizer, source=source, data=data))
    except PoslensError as e:
        mark_failed(cfg.out)  # a new --out is emptied again when its lock is given back (an interrupt keeps it)
        if ctx.enabled and not str(e).startswith("rank "):
            raise PoslensError(f"{ctx.label}: {e.cli()}") from None  # torchrun: the CLI's words
        raise
    except Exception as e:  # e.g. CUDA out of memory: say which rank before the traceback
        mark_failed(cfg.out)
        if ctx.enabled:
            print(f"poslens: error: {ctx.label}: {type(e).__name__}: {str(e).strip()[:300]}", file=sys.stderr,
                  flush=True)
        raise
    finally:
        restore()
        ctx.shutdown()
        release_out_dir(cfg.out)  # the run directory's lock, taken by create_out_dir


@dataclass
class _Job:
    """What the steps of one scan share: its options, frozen plan, process context and output, and what
    only the run learns (this rank's device, what the loaded model tells)."""

    cfg: ScanConfig
    ctx: Any  # poslens.capture.scan.distributed context (a single process: disabled)
    plan: ScanPlan
    device: str  # this rank's device (the collectives')
    out: Path
    fp: str  # the options' fingerprint, stored in every checkpoint
    ck_name: str  # this rank's checkpoint file
    where: str = ""  # the device of the inputs and the accumulators (a --device-map model: its first device)
    attention: dict | None = None  # the dry run's per-layer windows / logit scales (check_dispatch)
    rope: dict | None = None  # the model's RoPE tables (rope_tables)


@dataclass
class _Shard:
    """The batches of the scan and this rank's share: ``mine[t]`` is its ``t``-th batch, ``done`` of
    them are in the accumulators (a resumed run), ``steps`` the lockstep count of every rank."""

    batches: list
    mine: list
    done: int
    steps: int
    first_step: int
    already: int  # batches done by all ranks together (where the progress bar starts)


def _run_scan(cfg: ScanConfig, progress: bool, stop_after_batches: int | None, ctx, given, inputs: dict) -> dict:
    t_start = time.time()
    job = _validate(cfg, ctx, given, inputs)
    cfg = job.cfg  # as planned (in-memory data: its label and shape)
    if ctx.is_main:  # a run replacing another is written beside it and swapped in at the end (commit_out_dir)
        job.out = create_out_dir(job.out, overwrite=cfg.overwrite, staged=not ctx.enabled, checked=True)
    with contextlib.ExitStack() as stack:
        if given is not None:  # the caller's model: poslens attention and eval mode inside, restored after
            stack.enter_context(borrowed(given))
            stack.callback(_remove_if_empty, job)
        model = _load(job, progress, given)
        capture = _make_capture(job, model)
        if ctx.is_main:
            _write_config(job, model, given is not None)
        ctx.barrier(job.device)
        if not job.out.is_dir():
            raise PoslensError(f"--out {job.out} is not visible from this rank's host; a multi-node scan needs --out "
                               "on a filesystem shared by every node.")
        shard = _shard(job, capture)
        handles = attach(model, job.plan.adapter, capture)
        try:
            result = _scan_batches(job, model, capture, shard, progress, stop_after_batches)
        finally:
            for h in handles:
                h.remove()
    if isinstance(result, dict):  # stopped early (stop_after_batches), checkpoint written
        return result
    tokens, elapsed = result
    loaded_here = given is None
    held = weakref.ref(model) if loaded_here else None
    del model, given  # free the weights (of a model poslens loaded) before the results are merged and written (sums and maps are as large)
    if loaded_here:  # a caller's model stays alive with the caller: a full collection (0.2 s) would free nothing
        if held() is not None:  # freed when its last reference went, unless a reference cycle holds it
            gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return _merge_and_write(job, capture, tokens, elapsed, t_start)


def _remove_if_empty(job: _Job) -> None:
    """A scan of a loaded model that stopped before writing anything leaves no --out behind."""
    out = job.out
    if job.ctx.is_main and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def _validate(cfg: ScanConfig, ctx, model, inputs: dict) -> _Job:
    """Every check before anything is written, then the process group. Every rank validates before
    any rank creates --out (else a fast rank 0 makes it "not empty"); a rank whose inputs fail
    still joins the group (same backend as the others) so that every rank can be told."""
    err, job = None, None
    try:
        job = _check_inputs(cfg, ctx, model, inputs)
        device = job.device
    except PoslensError as e:
        err = e
        device = f"cuda:{ctx.local_rank}" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
    D.init(ctx, device)
    if not ctx.all_ok(err is None, device):
        raise err or PoslensError("another rank rejected the inputs (its error is printed above).")
    return job


def _check_inputs(cfg: ScanConfig, ctx, model, inputs: dict) -> _Job:
    """The plan and this rank's device; a --resume whose checkpoint was written with other options
    is refused here, before anything is loaded or written. ``inputs``: the tokenizer, source and data
    given to :func:`run_scan`."""
    plan = plan_scan(cfg, model=model, lock=ctx.is_main, **inputs)
    cfg = plan.cfg
    if ctx.enabled and cfg.device_map and ctx.local_world_size > 1:
        raise PoslensError(f"--device-map spreads one model over this node's devices; launch one process per "
                           f"node (--nproc-per-node 1), not {ctx.local_world_size}.")
    device = D.resolve_device(ctx, plan.device)
    job = _Job(cfg, ctx, plan, device, Path(cfg.out), fingerprint(cfg),
               D.checkpoint_name(ctx.rank) if ctx.enabled else CHECKPOINT, where=device)
    out, ck = job.out, job.out / job.ck_name
    if cfg.resume and out.is_dir():
        check_resume_layout(out, ctx.world_size)
        if ck.exists() and checkpoint_meta(ck).get("fingerprint") != job.fp:
            raise resume_mismatch(out, ck, cfg)
        check_finished(out, job.ck_name, job.fp, cfg)
    return job


def _load(job: _Job, progress: bool, given=None):
    """The model (``given``, or loaded from the model directory), checked to dispatch every layer through
    the registered attention function (custom attention code is refused, leaving a still-empty --out
    removed), with its RoPE tables."""
    cfg, ctx, plan, out = job.cfg, job.ctx, job.plan, job.out
    if given is not None:
        model = given
    else:  # one set of loading bars per job; none with --quiet
        with no_hf_progress_bars((ctx.enabled and not ctx.is_main) or not progress):
            model = load_model(cfg.model_dir, dtype=plan.dtype, device=job.where, allow_pickle=cfg.allow_pickle,
                               trust_remote_code=cfg.trust_remote_code, device_map=cfg.device_map)
    try:
        check_finite_weights(model, cfg.model_dir if given is None else "model")
        job.attention = check_dispatch(model, plan.adapter)
        job.rope = rope_tables(model, plan.adapter, plan.config)
        if plan.spec.rope_layers and job.rope is None:  # the plan read RoPE in the config; the model has none
            raise PoslensError(f"{cfg.model_dir if given is None else 'model'}: its config describes RoPE, but the "
                               f"model (type {plan.adapter.model_type}) has no rotary module at "
                               f"{plan.adapter.rotary_path}; poslens cannot tell which layers rotate q/k.")
    except PoslensError:
        if ctx.is_main and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # nothing written
        raise
    return model


def check_finite_weights(model, where: str) -> None:
    """Refuse a model with a NaN or infinite weight (a damaged file, a diverged training run): every
    map it gives would be noise or empty. Names the first such tensor; one pass over the weights."""
    for name, p in model.named_parameters():
        if p.device.type == "meta":
            raise PoslensError(f"{where}: its weights are on the meta device (not loaded: {name}); load the model "
                               "with its weights (from_pretrained without device_map='meta' or init_empty_weights).")
        if p.is_floating_point() and not _all_finite(p.detach()):
            raise PoslensError(f"{where}: weight {name} holds NaN or infinite values; the model is damaged (a "
                               "corrupted file or a diverged training run). Restore it from its source.")


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite. A NaN or infinity makes the sum non-finite, so one
    reduction (no [numel] bool tensor) decides; only a sum that overflows is checked entry by entry."""
    if bool(torch.isfinite(t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32))):
        return True
    return bool(torch.isfinite(t).all())


def _make_capture(job: _Job, model) -> Capture:
    """The accumulators, on the device that holds them (a --device-map model: its first device)."""
    if job.cfg.device_map or spread_over_devices(model):
        job.where = D.main_device(model)
        return D.DeviceMapCapture(job.plan.spec, device=job.where)
    return Capture(job.plan.spec, device=job.where)


def spread_over_devices(model) -> bool:
    """Whether a model's layers sit on more than one device (loaded with a ``device_map``)."""
    placed = getattr(model, "hf_device_map", None) or {}
    return len({str(d) for d in placed.values()}) > 1


def _write_config(job: _Job, model, in_memory: bool = False) -> None:
    cfg, plan = job.cfg, job.plan
    if in_memory:  # no model directory to read the configuration from later (slash, fingerprint): keep it
        write_json(job.out / "model_config.json", model.config.to_dict())
    origin = {"kind": "in-memory", "class": type(model).__name__,
              "name_or_path": str(getattr(model, "name_or_path", "") or "")} if in_memory else source_record(cfg.model_dir)
    # the model's resolved path (not as typed): the run is read later from other directories (slash, kim-maps)
    model_dir = cfg.model_dir if in_memory else str(Path(cfg.model_dir).expanduser().resolve())
    write_json(job.out / "config.json", {
        "command": "scan", "options": dataclasses.asdict(dataclasses.replace(cfg, stats=stats_option(cfg.stats),
                                                                             model_dir=model_dir)),
        "fingerprint": job.fp,
        "model_source": origin, "source": plan.source.describe(),
        "model_type": plan.adapter.model_type, "dtype": str(plan.dtype), "device": job.where,
        "world_size": job.ctx.world_size,
        "capture_backend": backends.describe(job.where),
        "device_map": (getattr(model, "hf_device_map", None) or {"": job.where})
        if cfg.device_map or spread_over_devices(model) else None,
        "versions": versions()})


def backends_used(capture: Capture) -> dict:
    """``{backend: {"layers": [...], "reason": ...}}``: the backend each captured layer's attention pass
    took (decoder layers from 0), grouped, with the reason the first of them gave."""
    out: dict = {}
    for layer, (name, why) in sorted(capture.backends.items()):
        entry = out.setdefault(name, {"layers": [], "reason": why})
        entry["layers"].append(layer)
    return out


def _shard(job: _Job, capture: Capture) -> _Shard:
    """Batches of ``batch_size`` sequences, this rank's share, and where a --resume starts (the
    checkpoint is loaded into ``capture`` here)."""
    cfg, ctx, device = job.cfg, job.ctx, job.device
    N, Bsz = job.plan.source.num_seqs, cfg.batch_size
    batches = [(s, min(N, s + Bsz)) for s in range(0, N, Bsz)]
    mine = [batches[b] for b in D.shard(len(batches), ctx.rank, ctx.world_size)]
    if ctx.enabled:
        done = load_checkpoint(job.out, capture, job.fp, name=job.ck_name) if cfg.resume else 0
    else:
        start = load_checkpoint(job.out, capture, job.fp) if cfg.resume else 0
        done = sum(1 for b in batches if b[0] < start)
    steps = len(D.shard(len(batches), 0, ctx.world_size))  # rank 0 has the most batches
    return _Shard(batches, mine, done, steps, first_step=ctx.all_min([done], device)[0],
                  already=int(ctx.all_sum([done], device)[0]))


def _checkpoint(job: _Job, capture: Capture, shard: _Shard, n_done: int) -> None:
    """This rank's accumulators after its first ``n_done`` batches, atomically."""
    seqs_done = shard.mine[n_done - 1][1] if n_done else 0
    if job.ctx.enabled:
        save_checkpoint(job.out, capture, seqs_done, job.fp, name=job.ck_name,
                        extra={"rank": job.ctx.rank, "world_size": job.ctx.world_size, "batches_done": n_done})
    else:
        save_checkpoint(job.out, capture, seqs_done, job.fp)


def _checkpoint_due(job: _Job, done: int, total: int) -> bool:
    """Whether the checkpoint is written after ``done`` of this rank's ``total`` batches: every
    ``checkpoint_every``, except after the last batch of a single process's scan, whose finalize
    follows at once from the sums in memory (writing them, as large as the float64 sums, would cost
    seconds of system time, and a finished scan removes its checkpoint), unless --keep-checkpoint
    keeps it; ranks write theirs after their last batch too (the merge and a --resume read them)."""
    if done == total:
        return job.ctx.enabled or job.cfg.keep_checkpoint
    return done % job.cfg.checkpoint_every == 0


def _scan_batches(job: _Job, model, capture: Capture, shard: _Shard, progress: bool,
                  stop_after_batches: int | None):
    """The forward passes of this rank's batches, checkpointing every ``checkpoint_every``; returns
    ``(tokens, seconds)``, or the stop record when ``stop_after_batches`` ends the loop early."""
    cfg, ctx, plan, device = job.cfg, job.ctx, job.plan, job.device
    fwd_kwargs = forward_kwargs(model)  # no cache; logits_to_keep=1: the LM head's [B, S, vocab] logits are unused
    tokens, done, mine = 0, shard.done, shard.mine
    t_loop = time.time()
    shown = shard.already
    with task_progress("scan", len(shard.batches), enabled=progress and ctx.is_main, done=shard.already) as update:
        for n_step, t in enumerate(range(shard.first_step, shard.steps), 1):
            did = 0
            if done <= t < len(mine):
                s, e = mine[t]
                ids = plan.source.batch(s, e).to(job.where)
                forward(model, ids, capture=capture, kwargs=fwd_kwargs, seq_start=s)
                tokens += ids.numel()
                done, did = t + 1, 1
                if _checkpoint_due(job, done, len(mine)):
                    _checkpoint(job, capture, shard, done)
                D.die_hook(ctx, done)
            # lockstep: the global count for the progress bar, and a dead peer is noticed at once
            ctx.reach(t + 1)
            shown += int(ctx.all_sum([did], device)[0]) if ctx.enabled else did
            update(shown)
            if stop_after_batches is not None and n_step >= stop_after_batches and t + 1 < shard.steps:
                _checkpoint(job, capture, shard, done)
                return {"stopped_at": mine[done - 1][1]} if not ctx.enabled else {
                    "stopped_at_step": t + 1, "rank": ctx.rank, "world_size": ctx.world_size}
        if ctx.enabled and done == len(mine) and len(mine) == 0:
            _checkpoint(job, capture, shard, 0)  # a rank without batches still marks its (empty) shard as done
    return tokens, time.time() - t_loop


def _merge_and_write(job: _Job, capture: Capture, tokens: int, elapsed: float, t_start: float) -> dict:
    """All-reduce the ranks' sums, then (rank 0) the run directory: tensors, summary, figures; the
    checkpoint is removed unless --keep-checkpoint."""
    cfg, ctx, device, out = job.cfg, job.ctx, job.device, job.out
    if ctx.enabled:
        ctx.guard(lambda: capture.all_reduce())
        tokens = int(ctx.all_sum([tokens], device)[0])
        elapsed = ctx.all_max([elapsed], device)[0]
        if not ctx.is_main:
            return {"rank": ctx.rank, "world_size": ctx.world_size}
        # the merged float64 sums, as a single-process run leaves them
        save_checkpoint(out, capture, job.plan.source.num_seqs, job.fp,
                        extra={"world_size": ctx.world_size, "merged": True})
        # the other ranks' checkpoints are the run's too (their processes hold no lock to record them)
        record_written(out, *sorted(f.name for f in rank_checkpoints(out).values()))
    summary = finalize(out, capture, job.plan, rope=job.rope, attention=job.attention, figures=cfg.figures)
    summary["capture_backends"] = backends_used(capture)
    summary["throughput"] = {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed if elapsed else None,
                             "wall_s": time.time() - t_start, "processes": ctx.world_size}
    if torch.device(device).type == "cuda":  # this process's peak, model and capture together
        summary["throughput"]["peak_gpu_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
    summary = write_summary(out, summary, command="scan", paper=["kim", "slash", "neighborhood"],
                            layers_describe="each decoder layer's attention (scores, heads, pre-RoPE q/k); aps and "
                                            "norm_score: the residual stream after that layer (embedding_aps: the "
                                            "embeddings)")
    if not cfg.keep_checkpoint:  # finished: the checkpoint (as large as the float64 sums) has done its job
        for f in [out / CHECKPOINT, *rank_checkpoints(out).values()]:
            f.unlink(missing_ok=True)
    commit_out_dir(cfg.out)
    return summary
