"""``poslens panels``, ``kim-maps``, ``slash`` and ``slash-dynamics``: score-map and slash analyses as run directories."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.cli.app import (allow_pickle_option, app, batch_size_option, data_option, device_option, dtype_option,
                             model_dir_argument, no_figures_option, num_seqs_option, out_option, overwrite_option,
                             print_run, quiet_option, refuse_existing_out, scan_dir_argument, seed_option,
                             seq_len_option, threads_option, trust_remote_code_option, use_threads)
from poslens.cli.app import parse_floats
from poslens.runtime import parse_device


def _print(summary: dict, out: Path, quiet: bool, command: str) -> None:
    if not quiet:
        from poslens.reporting.readings.commands import omitted_offsets_reading

        shown, gone = _without_empty_offsets(summary)
        print_run(shown, out, command=command, notes=[omitted_offsets_reading(gone)] if gone else [], max_tables=3,
                  max_rows=25)


def _without_empty_offsets(summary: dict) -> tuple[dict, list]:
    """``(summary, offsets left out)``: the slash run's summary for the terminal, whose (κ, Δ) table ends
    at the last offset where some head is slash-dominant, and the offsets Δ of the rows it leaves out
    (none where every row has a head; summary.json keeps every row)."""
    rows = summary.get("sdh_counts")
    tables = summary.get("tables") or []
    if not rows or not tables or tables[0].get("rows") != rows:
        return summary, []
    width = len(tables[0]["columns"]) - 2  # Δ, one count per κ, the heads at the smallest κ
    last = max((i for i, r in enumerate(rows) if any(c for c in r[1: 1 + width])), default=0)
    if last == len(rows) - 1:
        return summary, []
    shown = {**summary, "tables": [{**tables[0], "rows": rows[: last + 1]}, *tables[1:]]}
    return shown, [r[0] for r in rows[last + 1:]]


@app.command("panels", short_help="Nine-panel Gram decomposition of one layer.")
def panels(
    model_dir: Path = model_dir_argument("Local model directory (config.json + *.safetensors) of an architecture with "
                                         "a sequential block (Llama family, Gemma, ...), or a .gguf file."),
    out: Path = out_option(),
    layer: int = typer.Option(0, "--layer", help="Layer whose nine Gram panels to compute (0-based; at most L-2)."),
    data: str = data_option("stdlib"),
    num_seqs: int = num_seqs_option(200),
    seq_len: int = seq_len_option(50, "Tokens per sequence (the paper uses 50)."),
    batch_size: int = batch_size_option(10),
    seed: int = seed_option(),
    device: str = device_option(),
    dtype: str = dtype_option("fp32"),
    allow_pickle: bool = allow_pickle_option(),
    trust_remote_code: bool = trust_remote_code_option(),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Nine-panel Gram decomposition of one layer (arXiv 2509.21042): YYᵀ, QKᵀ/√d, (AV)(AV)ᵀ,
    (AVW_O)(AVW_O)ᵀ, OOᵀ, LN(O)LN(O)ᵀ, the layer output's Gram, the next layer's YYᵀ and QKᵀ/√d,
    batch-averaged, with relativity and locality per panel and a 3x3 figure."""
    threads = use_threads(threads)
    from poslens.analysis.panels import PanelsConfig, run_panels

    refuse_existing_out(out, overwrite=overwrite)
    s = run_panels(PanelsConfig(model_dir=str(model_dir), out=str(out), layer=layer, data=data, num_seqs=num_seqs,
                                seq_len=seq_len, batch_size=batch_size, seed=seed, device=device, dtype=dtype,
                                allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, figures=not no_figures),
                   progress=not quiet)
    _print(s, out, quiet, "panels")


@app.command("kim-maps", short_help="Raw and diagonal-normalised score maps of a scan.")
def kim_maps(
    scan_dir: Path = scan_dir_argument(),
    out: Path = out_option(),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Per-layer raw and diagonal-normalised score maps of a scan (Figure 5 of arXiv 2509.21042 for any
    model), with the relativity index, non-relativity and locality of every layer."""
    threads = use_threads(threads)
    from poslens.analysis.panels import run_score_maps

    refuse_existing_out(out, overwrite=overwrite)
    _print(run_score_maps(str(scan_dir), str(out), figures=not no_figures), out, quiet, "kim-maps")


@app.command("slash", short_help="Slash-dominant heads of a scan, their RoPE origin.")
def slash(
    scan_dir: Path = scan_dir_argument("Run directory of a finished `poslens scan` (in-distribution prompts)."),
    out: Path = out_option(),
    random_scan: Path = typer.Option(None, "--random-scan", help="A scan of the same model with --data random: tests "
                                     "whether each slash-dominant head persists on random tokens."),
    kappa: str = typer.Option("0.1,0.2,0.3,0.5,0.7,0.9", "--kappa", help="κ grid of the SDH table."),
    persist_kappa: float = typer.Option(None, "--persist-kappa", help="κ of the persistence test (default: the "
                                        "smallest grid value >= 0.3)."),
    min_delta: int = typer.Option(1, "--min-delta", help="Smallest offset Δ considered (0 includes attention to self)."),
    max_delta: int = typer.Option(16, "--max-delta", help="Largest offset Δ considered."),
    model_dir: Path = typer.Option(None, "--model-dir", help="The scanned model's directory or .gguf file, if it moved since the scan."),
    top: int = typer.Option(20, "--top", help="Heads listed in the per-head table."),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Slash-dominant heads (arXiv 2601.08297): SlashScore profiles, the (κ, Δ)-SDH table, persistence on
    random tokens, rank-one measures of pre-RoPE q/k, and the RoPE frequency decomposition predicting
    each head's slash profile and peak offset."""
    threads = use_threads(threads)
    from poslens.analysis.slash import SlashConfig, run_slash

    refuse_existing_out(out, overwrite=overwrite)
    s = run_slash(SlashConfig(scan_dir=str(scan_dir), out=str(out), random_scan=str(random_scan) if random_scan else None,
                              kappa=tuple(parse_floats(kappa, "--kappa")), persist_kappa=persist_kappa, min_delta=min_delta,
                              max_delta=max_delta, model_dir=str(model_dir) if model_dir else None, top=top,
                              figures=not no_figures))
    _print(s, out, quiet, "slash")


@app.command("slash-dynamics", short_help="Slash heads emerging while a model trains.")
def slash_dynamics(
    out: Path = out_option(),
    delta: int = typer.Option(1, "--delta", help="The offset task's Δ (the slash the model must learn)."),
    steps: int = typer.Option(300, "--steps", help="Training steps."),
    snapshots: str = typer.Option("0,20,50,100,200,300", "--snapshots", help="Steps at which to snapshot and scan."),
    num_layers: int = typer.Option(1, "--num-layers", help="Layers of the shallow RoPE transformer."),
    hidden: int = typer.Option(64, "--hidden", help="Model width."),
    num_heads: int = typer.Option(2, "--num-heads", help="Query heads."),
    num_kv_heads: int = typer.Option(1, "--num-kv-heads", help="Key/value heads."),
    lr: float = typer.Option(3e-3, "--lr", help="Peak learning rate."),
    num_seqs: int = num_seqs_option(32, "Sequences per scan (task prompts and random tokens)."),
    seq_len: int = seq_len_option(32, "Tokens per scanned sequence (at most 33)."),
    kappa: float = typer.Option(0.3, "--kappa", help="κ of the slash-dominance and persistence test."),
    seed: int = seed_option("Seed of weights, batches and prompts."),
    threads: int = threads_option(),
    device: str = device_option(),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    quiet: bool = quiet_option(),
) -> None:
    """Training dynamics of slash-dominant heads (arXiv 2601.08297): train a shallow RoPE transformer on the
    offset task with `poslens train`'s trainer, snapshot it during training, scan every snapshot on task
    prompts and on random tokens, and tabulate SlashScore(Δ), rank-one-ness of pre-RoPE q/k and RoPE band
    usage per step. A few CPU minutes at the defaults."""
    threads = use_threads(threads)
    from poslens.analysis.dynamics import DynamicsConfig, run_dynamics
    from poslens.capture.scan.options import parse_int_list

    refuse_existing_out(out, overwrite=overwrite)
    s = run_dynamics(DynamicsConfig(out=str(out), delta=delta, steps=steps,
                                    snapshots=parse_int_list(snapshots, "--snapshots") or [], layers=num_layers,
                                    hidden=hidden, heads=num_heads, kv_heads=num_kv_heads, lr=lr, scan_seqs=num_seqs,
                                    seq_len=seq_len, kappa=kappa, seed=seed, threads=threads,
                                    device=parse_device(device), figures=not no_figures, overwrite=overwrite),
                     progress=not quiet)
    _print(s, out, quiet, "slash-dynamics")
