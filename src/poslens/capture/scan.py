"""``run_scan``: stream sequences through a Hugging Face causal LM and accumulate positional maps.

Flow: validate every input (no writes) -> load the model with the poslens attention function ->
for each batch of the deterministic sequence source: forward, accumulate, checkpoint every N
batches (atomically) -> write ``maps.safetensors``, ``summary.json`` and figures.

A run killed at any moment and restarted with ``resume=True`` continues from the last
checkpoint with the same batch partition, so its tensors are bit-identical to an uninterrupted
run.

Under ``torchrun`` the same loop runs on every rank over its share of the batches (``b % world ==
rank``, :mod:`poslens.capture.distributed`), with one checkpoint per rank; the accumulators are
all-reduced at the end and rank 0 writes the run directory.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from pathlib import Path

import torch

from poslens.capture import distributed as D
from poslens.capture.adapters import check_dispatch, rope_tables
from poslens.capture.attention import Capture
from poslens.capture.checkpoint import (CHECKPOINT, check_finished, check_resume_layout, checkpoint_meta, rank_checkpoints,
                                        fingerprint, load_checkpoint, save_checkpoint)
from poslens.capture.finalize import finalize
from poslens.capture.load import load_model
from poslens.capture.loop import attach, forward, forward_kwargs
from poslens.capture.model_source import source_record
from poslens.capture.plan import ScanConfig, plan_scan
from poslens.errors import PoslensError
from poslens.progress import task_progress
from poslens.rundir import create_out_dir, versions, write_json, write_summary
from poslens.runtime import no_hf_progress_bars


# --------------------------------------------------------------------------------------------
# the scan
# --------------------------------------------------------------------------------------------
def run_scan(cfg: ScanConfig, progress: bool = True, *, stop_after_batches: int | None = None) -> dict:
    """Run (or resume) a scan and write its run directory; returns the summary dict.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) every rank scans its shard of the batches
    (:mod:`poslens.capture.distributed`), the accumulators are all-reduced and rank 0 alone
    writes the run directory; other ranks return ``{"rank": r, "world_size": w}``.

    ``stop_after_batches`` ends the loop early after that many batch steps of this call, leaving
    a checkpoint as a killed run would (used by tests of resume).
    """
    ctx = D.detect()
    restore = D.announce_sigterm(ctx)
    try:
        return _run_scan(cfg, progress, stop_after_batches, ctx)
    except PoslensError as e:
        if ctx.enabled and not str(e).startswith("rank "):
            raise PoslensError(f"{ctx.label}: {e}") from None
        raise
    except Exception as e:  # e.g. CUDA out of memory: say which rank before the traceback
        if ctx.enabled:
            print(f"poslens: error: {ctx.label}: {type(e).__name__}: {str(e).strip()[:300]}", file=sys.stderr,
                  flush=True)
        raise
    finally:
        restore()
        ctx.shutdown()


def _run_scan(cfg: ScanConfig, progress: bool, stop_after_batches: int | None, ctx) -> dict:
    t_start = time.time()
    # every rank validates before any rank creates --out (else a fast rank 0 makes it "not empty")
    err = None
    try:
        plan = plan_scan(cfg)
        if ctx.enabled and cfg.device_map and ctx.local_world_size > 1:
            raise PoslensError(f"--device-map spreads one model over this node's devices; launch one process per "
                               f"node (--nproc-per-node 1), not {ctx.local_world_size}.")
        device = D.resolve_device(ctx, plan.device)
        ck_name = D.checkpoint_name(ctx.rank) if ctx.enabled else CHECKPOINT
        out = Path(cfg.out)
        fp = fingerprint(cfg)
        if cfg.resume and out.is_dir():  # refuse a mismatched resume before anything is loaded or written
            check_resume_layout(out, ctx.world_size)
            if (out / ck_name).exists() and checkpoint_meta(out / ck_name).get("fingerprint") != fp:
                raise PoslensError(f"--resume: {out / ck_name} was written by a scan with different options; rerun "
                                   "with the original options or choose a new --out.")
            check_finished(out, ck_name, fp)
    except PoslensError as e:
        err = e  # still join the group (same backend as the others) so every rank can be told
        device = f"cuda:{ctx.local_rank}" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
    D.init(ctx, device)
    if not ctx.all_ok(err is None, device):
        raise err or PoslensError("another rank rejected the inputs (its error is printed above).")
    plan.device = device
    if ctx.is_main:
        create_out_dir(out)
    # one set of loading bars per job; none with --quiet
    with no_hf_progress_bars((ctx.enabled and not ctx.is_main) or not progress):
        model = load_model(cfg.model_dir, dtype=plan.dtype, device=plan.device, allow_pickle=cfg.allow_pickle,
                           trust_remote_code=cfg.trust_remote_code, device_map=cfg.device_map)
    try:  # every layer must dispatch through the registered attention (custom attention code: refused)
        plan.attention = check_dispatch(model, plan.adapter)
    except PoslensError:
        if ctx.is_main and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # nothing written
        raise
    plan.rope = rope_tables(model, plan.adapter, plan.config)
    if plan.adapter.generic and plan.rope is None:  # an unlisted architecture without a rotary module: no RoPE
        plan.spec.rope_layers = set()
    if cfg.device_map:
        plan.device = D.main_device(model)
        capture = D.DeviceMapCapture(plan.spec, device=plan.device)
    else:
        capture = Capture(plan.spec, device=plan.device)
    if ctx.is_main:
        write_json(out / "config.json", {"command": "scan", "options": dataclasses.asdict(cfg), "fingerprint": fp,
                                         "model_source": source_record(cfg.model_dir),
                                         "source": plan.source.describe(), "model_type": plan.adapter.model_type,
                                         "dtype": str(plan.dtype), "device": plan.device,
                                         "world_size": ctx.world_size,
                                         "device_map": (getattr(model, "hf_device_map", None) or {"": plan.device})
                                         if cfg.device_map else None,
                                         "versions": versions()})
    ctx.barrier(device)
    if not out.is_dir():
        raise PoslensError(f"--out {out} is not visible from this rank's host; a multi-node scan needs --out on a "
                           "filesystem shared by every node.")
    N, Bsz = plan.source.num_seqs, cfg.batch_size
    batches = [(s, min(N, s + Bsz)) for s in range(0, N, Bsz)]
    mine = [batches[b] for b in D.shard(len(batches), ctx.rank, ctx.world_size)]
    if ctx.enabled:
        done = load_checkpoint(out, capture, fp, name=ck_name) if cfg.resume else 0
        ck_extra = {"rank": ctx.rank, "world_size": ctx.world_size}
    else:
        start = load_checkpoint(out, capture, fp) if cfg.resume else 0
        done = sum(1 for b in batches if b[0] < start)
        ck_extra = {}
    steps = len(D.shard(len(batches), 0, ctx.world_size))  # rank 0 has the most batches
    first_step = ctx.all_min([done], device)[0]
    already = int(ctx.all_sum([done], device)[0])

    def checkpoint(n_done: int) -> None:
        if ctx.enabled:
            save_checkpoint(out, capture, mine[n_done - 1][1] if n_done else 0, fp, name=ck_name,
                            extra={**ck_extra, "batches_done": n_done})
        else:
            save_checkpoint(out, capture, mine[n_done - 1][1] if n_done else 0, fp)

    handles = attach(model, plan.adapter, capture)
    fwd_kwargs = forward_kwargs(model)  # no cache; logits_to_keep=1: the LM head's [B, S, vocab] logits are unused
    tokens = 0
    t_loop = time.time()
    try:
        shown = already
        with task_progress("scan", len(batches), enabled=progress and ctx.is_main, done=already) as update:
            for n_step, t in enumerate(range(first_step, steps), 1):
                did = 0
                if done <= t < len(mine):
                    s, e = mine[t]
                    ids = plan.source.batch(s, e).to(plan.device)
                    forward(model, ids, capture=capture, kwargs=fwd_kwargs, seq_start=s)
                    tokens += ids.numel()
                    done, did = t + 1, 1
                    if done == len(mine) or done % cfg.checkpoint_every == 0:
                        checkpoint(done)
                    D.die_hook(ctx, done)
                # lockstep: the global count for the progress bar, and a dead peer is noticed at once
                ctx.reach(t + 1)
                shown += int(ctx.all_sum([did], device)[0]) if ctx.enabled else did
                update(shown)
                if stop_after_batches is not None and n_step >= stop_after_batches and t + 1 < steps:
                    checkpoint(done)
                    return {"stopped_at": mine[done - 1][1]} if not ctx.enabled else {
                        "stopped_at_step": t + 1, "rank": ctx.rank, "world_size": ctx.world_size}
            if ctx.enabled and done == len(mine) and len(mine) == 0:
                checkpoint(0)  # a rank without batches still marks its (empty) shard as done
    finally:
        for h in handles:
            h.remove()
    elapsed = time.time() - t_loop
    del model  # free the weights before the results are merged and written (sums and maps are as large)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if ctx.enabled:
        ctx.guard(lambda: capture.all_reduce())
        tokens = int(ctx.all_sum([tokens], device)[0])
        elapsed = ctx.all_max([elapsed], device)[0]
        if not ctx.is_main:
            return {"rank": ctx.rank, "world_size": ctx.world_size}
        # the merged float64 sums, as a single-process run leaves them
        save_checkpoint(out, capture, N, fp, extra={"world_size": ctx.world_size, "merged": True})
    summary = finalize(out, capture, plan, figures=cfg.figures)
    summary["throughput"] = {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed if elapsed else None,
                             "wall_s": time.time() - t_start, "processes": ctx.world_size}
    summary = write_summary(out, summary, command="scan", paper=["kim", "slash", "neighborhood"],
                            layers_describe="each decoder layer's attention (scores, heads, pre-RoPE q/k); aps and "
                                            "norm_score: the residual stream after that layer (embedding_aps: the "
                                            "embeddings)")
    if not cfg.keep_checkpoint:  # finished: the checkpoint (as large as the float64 sums) has done its job
        for f in [out / CHECKPOINT, *rank_checkpoints(out).values()]:
            f.unlink(missing_ok=True)
    return summary


