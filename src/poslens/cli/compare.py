"""``poslens compare``: two variants of a model on the same sequences; which positional readings changed."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.analysis.compare.config import DEFAULT_GROUPS, DEFAULT_MAP_SIZE, DEFAULT_NUM_SEQS, DEFAULT_SEQ_LEN
from poslens.cli.app import (allow_pickle_option, app, batch_size_option, data_option, device_option, dtype_option,
                             no_figures_option, num_seqs_option, out_option, overwrite_option, quiet_option,
                             refuse_existing_out, seed_option, threads_option, trust_remote_code_option, use_threads)



@app.command("compare", short_help="Two variants on the same tokens: what changed.")
def compare(
    model_a: Path = typer.Argument(..., metavar="A", help="The reference model: a Hugging Face directory or a .gguf file."),
    model_b: Path = typer.Argument(None, metavar="B", help="The other model (same tokenizer, same layers and "
                                   "heads); omit it to compare A with A under --variant."),
    variant: list[str] = typer.Option([], "--variant", help="Applied to B (repeat to combine): "
                                      "rope-scaling=linear|dynamic|yarn|llama3:FACTOR | rope-theta=X | "
                                      "dtype=bfloat16|float16 | window=W | an ablate intervention with its layers, "
                                      "e.g. rope-off@3, sink-off@all, rope-band:low@0,3."),
    out: Path = out_option("Run directory to create: summary.json (every change with its verdict), "
                           "compare.safetensors (both sides' per-group readings and per-token losses), figures."),
    data: str = data_option("stdlib"),
    seq_len: str = typer.Option(str(DEFAULT_SEQ_LEN), "--seq-len", help="Tokens per sequence; several lengths, e.g. "
                                "512,2048,8192, scan both sides at each, on the same sequences cut to each length."),
    beyond_context: bool = typer.Option(False, "--beyond-context", help="Allow lengths past A's trained context "
                                        "(max_position_embeddings); readings there are marked as beyond it."),
    num_seqs: int = num_seqs_option(DEFAULT_NUM_SEQS, "Sequences; both sides read the same ones."),
    batch_size: int = batch_size_option(4),
    seed: int = seed_option("Seed of --data random."),
    noise_groups: int = typer.Option(DEFAULT_GROUPS, "--noise-groups", help="Sequence groups of the paired "
                                     "statistics (sequence n in group n % G); 16 lets the exact sign-flip test "
                                     "reach p = 1/32768."),
    map_size: int = typer.Option(DEFAULT_MAP_SIZE, "--map-size", help="Score maps as block means on at most N x N "
                                 "blocks (0: full S x S maps); slash, sink and entropy stay exact."),
    device: str = device_option(),
    dtype: str = dtype_option("auto", "auto | bf16 | fp16 | fp32 for models loaded from a path (auto: fp32 on "
                              "CPU); use --variant dtype=bfloat16 to compare precisions."),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    allow_pickle: bool = allow_pickle_option(),
    trust_remote_code: bool = trust_remote_code_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """What changed between two variants of a model, reading by reading, with its noise.

    Both sides read the same sequences, so every difference is paired: per sequence group, B − A of
    the sink share, the best SlashScore and its offset, the previous-token score, the entropy and
    the mean attention distance (per head), the relativity index, locality and diagonal trend of
    the score map, the RoPE band energy shares and the massive q/k dimensions (per layer), and the
    next-token loss by position. Each change has its standard error over the groups, a sign-flip
    p-value (Benjamini–Hochberg over the reading's layers and heads) and a verdict: changed or
    unchanged. A variant is applied to the loaded model and undone afterwards; two models are
    loaded one after the other, never both at once.
    """
    threads = use_threads(threads)
    from poslens.analysis.compare.config import CompareConfig
    from poslens.analysis.compare.run import run_compare

    refuse_existing_out(out, overwrite=overwrite)
    result = run_compare(CompareConfig(
        model_a=str(model_a), model_b=str(model_b) if model_b is not None else None, variants=list(variant),
        out=str(out), data=data, seq_lens=seq_len, num_seqs=num_seqs, batch_size=batch_size, seed=seed,
        noise_groups=noise_groups, map_size=map_size, beyond_context=beyond_context, device=device, dtype=dtype,
        figures=not no_figures, overwrite=overwrite, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code),
        progress=not quiet)
    if quiet:
        return
    from rich.console import Console

    from poslens.fmt import print_table
    from poslens.reporting.readings.commands import command_readings

    summary = result["summary"]
    console = Console()
    rows = {}
    for r in summary["changes"]:
        key = (r["reading"], r["seq_len"], "head" if r["head"] is not None else "layer" if r["layer"] is not None else "positions")
        n = rows.setdefault(key, [0, 0, 0.0])
        n[0] += 1
        n[1] += r["verdict"] == "changed"
        n[2] = max(n[2], abs(r["delta"] or 0.0))
    print_table(f"Changes B − A ({summary['sides']['b']['label']} against {summary['sides']['a']['label']}; "
                "decoder layers from 0)", ["reading", "tokens", "cells", "changed", "of", "largest |Δ|"],
                [[k[0], k[1], k[2], v[1], v[0], v[2]] for k, v in rows.items()], console=console)
    for line in command_readings("compare", summary) or []:
        console.print(f"- {line}", soft_wrap=False)
    console.print(f"wrote {out}/ (summary.json, compare.safetensors, figures)")
