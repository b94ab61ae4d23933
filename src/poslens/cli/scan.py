"""``poslens scan``: accumulate positional maps of a Hugging Face causal LM into a run directory."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from poslens.cli.app import (MODEL_DIR_HELP, allow_pickle_option, app, batch_size_option, data_option,
                             device_option, dtype_option, model_dir_argument, no_figures_option, num_seqs_option,
                             out_option, overwrite_option, quiet_option, refuse_existing_out, resume_option,
                             seed_option, seq_len_option, threads_option, trust_remote_code_option, use_threads)


@app.command("scan", short_help="Capture averaged attention structure of a causal LM.")
def scan(
    model_dir: Path = model_dir_argument(MODEL_DIR_HELP[:-1] + " (dequantised once into the cache, docs/models.md)."),
    out: Path = out_option("Run directory to create (must be new unless --resume or --overwrite)."),
    data: str = data_option("stdlib"),
    seq_len: int = seq_len_option(256, "Tokens per sequence (at most the model's maximum)."),
    num_seqs: int = num_seqs_option(64),
    batch_size: int = batch_size_option(4),
    seed: int = seed_option(),
    dtype: str = dtype_option("auto", "auto | bf16 | fp16 | fp32 (auto: fp32 on CPU, the checkpoint's half precision "
                              "on CUDA). Accumulators are float64 regardless."),
    device: str = device_option(" Under torchrun: cuda:LOCAL_RANK."),
    device_map: str = typer.Option(None, "--device-map", help="auto | balanced | sequential: spread a model too large "
                                   "for one device over all visible devices (accelerate); accumulators stay on the "
                                   "first GPU (or the CPU)."),
    layers: str = typer.Option(None, "--layers", help="Layers to capture, e.g. 0,1,8-11 (default: all)."),
    heads: str = typer.Option(None, "--heads", help="LAYER.HEAD pairs that also get per-head S x S maps, e.g. 3.5,10.2."),
    no_rope_layers: str = typer.Option(None, "--no-rope-layers", help="Control: attend with un-rotated q/k in these layers."),
    bidirectional: bool = typer.Option(False, "--bidirectional", help="Control: drop the causal mask in every layer."),
    reservoir: int = typer.Option(256, "--reservoir", help="Token slots (a uniform sample of all sequence "
                                  "positions) whose pre-RoPE q/k vectors are kept in every layer; 0 = none."),
    stats: str = typer.Option("all", "--stats", help="Statistics to accumulate, comma-separated: scores, probs, slash, "
                              "cosine (residual stream), attn_cosine, qk (q/k second moments and the --reservoir sample), "
                              "dim_logit; or all; or a user's poslens.Statistic by its importable name, e.g. mypkg.stats.Entropy "
                              "(docs/statistics.md). Unrequested ones cost nothing; the summary reads them as null."),
    map_size: int = typer.Option(0, "--map-size", help="Keep the S x S maps (scores, probs, cosine, attn_cosine, "
                                 "--heads maps) as exact block means on an N x N grid (blocks of ceil(S/N) "
                                 "positions) for long contexts; slash profiles and norms stay exact. 0 = full maps."),
    keep_checkpoint: bool = typer.Option(False, "--keep-checkpoint", help="Keep OUT/checkpoint.safetensors after a "
                                         "finished scan (default: deleted, it is as large as the accumulators)."),
    no_figures: bool = no_figures_option(),
    resume: bool = resume_option("Continue from OUT/checkpoint.safetensors (same options)."),
    overwrite: bool = overwrite_option(),
    checkpoint_every: int = typer.Option(10, "--checkpoint-every", help="Write an accumulator checkpoint every N batches."),
    allow_pickle: bool = allow_pickle_option(),
    trust_remote_code: bool = trust_remote_code_option("Allow custom model code from MODEL_DIR."),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Scan a causal LM for positional structure with memory bounded by the result.

    Runs the model through poslens' registered attention function (outputs unchanged) and
    accumulates, per layer and over all sequences: mean pre-softmax scores and attention
    weights (S x S), per-head slash profiles (SlashScore by offset), self-cosine maps and
    norms of hidden states and attention outputs, pre-RoPE q/k second moments, a bounded sample
    of pre-RoPE q/k vectors, and per-dimension logit contributions. Writes config.json, maps.safetensors, summary.json and score-map
    figures to OUT. Interrupt at any time and rerun with --resume.

    Data-parallel: `torchrun --nproc-per-node N -m poslens scan ...` shards the sequences over the
    ranks and all-reduces the sums; rank 0 writes OUT (docs/distributed.md).
    """
    threads = use_threads(threads)
    from poslens.capture.scan import ScanConfig, run_scan
    from poslens.cli.parse import parse_heads, parse_int_list

    refuse_existing_out(out, overwrite=overwrite, resume=resume)
    cfg = ScanConfig(
        model_dir=str(model_dir), out=str(out), data=data, seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size,
        seed=seed, dtype=dtype, device=device, layers=parse_int_list(layers, "--layers"), heads=parse_heads(heads),
        no_rope_layers=parse_int_list(no_rope_layers, "--no-rope-layers") or [], bidirectional=bidirectional,
        figures=not no_figures, resume=resume, overwrite=overwrite, checkpoint_every=checkpoint_every, allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code, device_map=device_map, reservoir=reservoir,
        stats=[p.strip() for p in stats.split(",")], map_size=map_size, keep_checkpoint=keep_checkpoint,
    )
    summary = run_scan(cfg, progress=not quiet)
    if not quiet and "layers" in summary:  # ranks other than 0 of a distributed scan write and print nothing
        _print_scan(summary, out)


def _print_scan(summary: dict, out: Path) -> None:
    from poslens.report.cards import slash_matrix
    from poslens.rundir import load_run

    console = Console()
    console.print(scan_table(summary, slash_matrix(load_run(out))))
    tp = summary.get("throughput") or {}
    if tp.get("tokens_per_s"):
        peak = tp.get("peak_gpu_memory_bytes")
        console.print(f"{tp['tokens']:,} tokens in {tp['seconds']:.1f} s ({tp['tokens_per_s']:,.0f} tokens/s"
                      + (f"; peak GPU memory {peak / 2**30:.1f} GiB" if peak else "") + ")")
    console.print(f"wrote {out}/ ({', '.join(summary['files'])})")


def scan_table(summary: dict, slash=None):
    """The per-layer terminal table of a scan (fits 80 columns): sink-excluded relativity where the
    summary has it, the per-sequence APS where it has it (else the mean-map APS, so labelled), and
    each layer's strongest head at offsets Δ = 1..16 (larger offsets are the sink column, not slashes):
    from ``slash`` = ``(best score, its Δ)`` per ``[layer, head]`` where given (the scan's maps), else
    from the heads the summary lists per layer."""
    import numpy as np

    from poslens.fmt import fmt, rich_table
    from poslens.report.readings import SLASH_MAX_DELTA, layer_aps, layer_slash_head

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
