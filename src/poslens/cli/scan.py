"""``poslens scan``: accumulate positional maps of a Hugging Face causal LM into a run directory.

Its flags are made from the fields of :class:`~poslens.capture.scan.options.ScanConfig` (:func:`scan_flags`),
as are the keywords of :func:`poslens.scan`; only ``--quiet`` and ``--threads`` are the CLI's own."""

from __future__ import annotations

import functools
import inspect
from dataclasses import MISSING
from pathlib import Path

import typer
from rich.console import Console

from poslens.capture.scan.options import ScanConfig, scan_options
from poslens.cli.app import app, quiet_option, resume_command, threads_option, use_threads
from poslens.errors import Interrupted
from poslens.rundir.lock import run_entries


def scan_flags(command):
    """``command(cfg, **cli_only)`` as a typer command whose flags are the options of
    :class:`~poslens.capture.scan.options.ScanConfig` (each with its help and default), followed by the
    command's own CLI-only parameters; the flags' values become ``cfg``."""
    options = scan_options()
    names = [o.name if o.argument else o.flag[2:].replace("-", "_") for o in options]
    params = []
    for o, name in zip(options, names):
        if o.argument:
            info = typer.Argument(..., metavar=o.flag, help=o.flag_help)
        else:
            info = typer.Option(... if o.default is MISSING else o.flag_default, o.flag, help=o.flag_help)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=o.flag_type))
    params += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in list(inspect.signature(command, eval_str=True).parameters.values())[1:]]

    @functools.wraps(command)
    def run(**flags):
        cfg = ScanConfig(**{o.name: o.from_flag(flags.pop(name)) for o, name in zip(options, names)})
        return command(cfg, **flags)

    run.__signature__ = inspect.Signature(params, return_annotation=None)
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run


@app.command("scan", short_help="Capture averaged attention structure of a causal LM.")
@scan_flags
def scan(cfg: ScanConfig, quiet: bool = quiet_option(), threads: int = threads_option()) -> None:
    """Scan a causal LM for positional structure with memory bounded by the result.

    Runs the model through poslens' registered attention function (outputs unchanged) and
    accumulates, per layer and over all sequences: mean pre-softmax scores and attention
    weights (S x S), per-head slash profiles (SlashScore by offset), self-cosine maps and
    norms of hidden states and attention outputs, pre-RoPE q/k second moments, a bounded sample
    of pre-RoPE q/k vectors, and per-dimension logit contributions. Writes config.json,
    maps.safetensors, summary.json and score-map figures to OUT. Interrupt at any time and rerun
    with --resume.

    Data-parallel: `torchrun --nproc-per-node N -m poslens scan ...` shards the sequences over the
    ranks and all-reduces the sums; rank 0 writes OUT (docs/distributed.md).
    """
    use_threads(threads)
    from poslens.capture.scan.run import run_scan

    replacing = cfg.overwrite and Path(cfg.out).is_dir() and bool(run_entries(Path(cfg.out)))
    try:
        summary = run_scan(cfg, progress=not quiet)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM under the CLI: say what was kept and how to continue
        raise Interrupted(_interrupted(cfg, replacing)) from None
    if not quiet and "layers" in summary:  # ranks other than 0 of a distributed scan write and print nothing
        _print_scan(summary, Path(cfg.out))


def _interrupted(cfg: ScanConfig, replacing: bool) -> str:
    """What an interrupted scan kept, and the command that continues it."""
    from poslens.capture.scan.checkpoint import CHECKPOINT

    out = Path(cfg.out)
    if replacing:
        return (f"the previous run in {out} is kept as it was; run the same command again (with --overwrite) to "
                "replace it.")
    if (out / CHECKPOINT).is_file():
        return f"a checkpoint is saved in {out}; continue with: {resume_command()}"
    return f"stopped before its first checkpoint; rerun the same command (with --resume) to start {out} again."


def _print_scan(summary: dict, out: Path) -> None:
    from poslens.reporting.quantities import slash_matrix
    from poslens.reporting.readings.notes import beyond_context_note
    from poslens.rundir.load import load_run

    console = Console()
    console.print(scan_table(summary, slash_matrix(load_run(out))))
    beyond = beyond_context_note(summary)
    if beyond:
        console.print(beyond)
    tp = summary.get("throughput") or {}
    if tp.get("tokens_per_s"):
        peak = tp.get("peak_gpu_memory_bytes")
        console.print(f"{tp['tokens']:,} tokens in {tp['seconds']:.1f} s ({tp['tokens_per_s']:,.0f} tokens/s"
                      + (f"; peak GPU memory {peak / 2**30:.1f} GiB" if peak else "") + ")")
    if "capture_backends" in summary:
        from poslens.capture.backends.choice import used_line

        console.print(used_line(summary["capture_backends"]))
    console.print(f"wrote {out}/ ({', '.join(summary['files'])})")


def scan_table(summary: dict, slash=None):
    """The per-layer terminal table of a scan (fits 80 columns): sink-excluded relativity where the
    summary has it, the per-sequence APS where it has it (else the mean-map APS, so labelled), and
    each layer's strongest head at offsets Δ = 1..16 (larger offsets are the sink column, not slashes):
    from ``slash`` = ``(best score, its Δ)`` per ``[layer, head]`` where given (the scan's maps), else
    from the heads the summary lists per layer."""
    import numpy as np

    from poslens.fmt import fmt, rich_table
    from poslens.conventions import SLASH_MAX_DELTA
    from poslens.reporting.readings.common import layer_aps, layer_slash_head

    per_seq = any(l.get("aps_mean") is not None for l in summary["layers"])
    # the signed diagonal trend and the sink's weight, where the scan wrote them
    extra = {k: v for k, v in (("diagonal_trend", "trend"), ("sink_weight", "sink"))
             if any(l.get(k) is not None for l in summary["layers"])}
    # the relativity index is noise-corrected where the noise grid covered the whole map
    rel = [l for l in summary["layers"] if l.get("relativity_index") is not None]
    corrected = bool(rel) and all(l.get("relativity_index_noise_corrected") for l in rel)
    rows = []
    for i, l in enumerate(summary["layers"]):
        top = layer_slash_head(l)
        if slash is not None and i < len(slash[0]) and np.isfinite(np.asarray(slash[0][i], dtype=float)).any():
            row = np.asarray(slash[0][i], dtype=float)
            h = int(np.nanargmax(row))
            top = {"head": h, "offset": int(slash[1][i][h]), "score": float(row[h])}
        aps, aps_std = layer_aps(l)
        rows.append([l["layer"], l.get("relativity_index"), l.get("locality")]
                    + [l.get(k) for k in extra]
                    + [f"{fmt(aps)} ± {fmt(aps_std)}" if per_seq and aps_std is not None else aps,
                       f"h{top['head']} Δ={top['offset']}: {fmt(top['score'])}" if top else None])
    conv = (summary.get("layer_info") or {}).get("convention") or summary.get("layer_convention") or \
        "decoder layers from 0"
    return rich_table(f"{summary['model_type']}: {fmt(summary['num_seqs'])} sequences × {fmt(summary['seq_len'])} "
                      f"tokens ({conv.split(';')[0]})",
                      ["layer", "rel.\ncorrected" if corrected else "rel.", "loc."] + [extra[k] for k in extra]
                      + ["APS" if per_seq else "mean-map APS", f"slash head Δ ≤ {SLASH_MAX_DELTA}"], rows)
