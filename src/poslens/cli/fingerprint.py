"""``poslens fingerprint``: the positional fingerprint of one or more models, side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.capture.scan.options import DATA_HELP, MODEL_DIR_HELP
from poslens.cli.app import (allow_pickle_option, app, batch_size_option, data_option, device_option, dtype_option,
                             no_figures_option, num_seqs_option, out_option, overwrite_option, quiet_option,
                             refuse_existing_out, seed_option, seq_len_option, threads_option, trust_remote_code_option,
                             use_threads)

# the defaults live with the library (poslens.analysis.fingerprint); repeated here so --help needs no torch
DEFAULT_SEQ_LEN = 256
DEFAULT_NUM_SEQS = 32


@app.command("fingerprint", short_help="Positional fingerprint of models, side by side.")
def fingerprint(
    models: list[Path] = typer.Argument(..., metavar="MODEL", help=MODEL_DIR_HELP + " Give several to compare them."),
    out: Path = out_option("Directory to create: fingerprint.json, fingerprint.html, figures, and the scans under "
                           "scans/ (must be new unless --overwrite)."),
    data: str = data_option("stdlib", "The text scan's sequences: " + DATA_HELP),
    seq_len: int = seq_len_option(DEFAULT_SEQ_LEN, "Tokens per sequence (both scans of every model)."),
    num_seqs: int = num_seqs_option(DEFAULT_NUM_SEQS, "Sequences per scan (text and random tokens)."),
    batch_size: int = batch_size_option(4),
    seed: int = seed_option("Seed of the random-token scan."),
    eps: float = typer.Option(0.3, "--eps", help="Sink threshold: a head whose mean weight on key 0 exceeds it is a "
                              "sink head (Gu et al. use 0.3)."),
    kappa: float = typer.Option(0.3, "--kappa", help="Slash threshold κ: a head with SlashScore(Δ) >= κ at some Δ "
                                "in 1..16 is a slash head."),
    massive_lambda: float = typer.Option(5.0, "--massive-lambda", help="A q/k dimension is massive when its RMS "
                                         "exceeds this many times the layer's mean (Jin et al. use 5)."),
    device: str = device_option(),
    dtype: str = dtype_option("auto", "auto | bf16 | fp16 | fp32 (auto: fp32 on CPU). Accumulators are float64 "
                              "regardless."),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    allow_pickle: bool = allow_pickle_option(),
    trust_remote_code: bool = trust_remote_code_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Positional fingerprint of every MODEL, side by side.

    Each model is scanned twice with the same shape, on text (--data, default the Python
    standard library's sources) and on uniformly random tokens. From the scans come, per layer and as one line per
    model: attention sinks (share of heads with mean weight on key 0 above --eps), slash heads
    and whether they persist on random tokens, the relativity index (sink excluded, above the
    noise floor) and its signed trend, APS ± sd, each head's RoPE frequency usage (high /
    medium / low bands), and massive q/k dimensions. Models with sliding-window layers (Gemma 3)
    get their traits per layer type too. Writes fingerprint.json, fingerprint.html (models in
    columns) and the figures to OUT.
    """
    threads = use_threads(threads)
    from poslens.analysis.fingerprint import FingerprintConfig, run_fingerprint
    from poslens.reporting.fingerprint import fingerprint_page, terminal_tables

    refuse_existing_out(out, overwrite=overwrite)
    result = run_fingerprint(FingerprintConfig(
        models=[str(m) for m in models], out=str(out), data=data, seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size,
        seed=seed, device=device, dtype=dtype, figures=not no_figures, overwrite=overwrite, eps=eps, kappa=kappa,
        massive_lambda=massive_lambda, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code),
        progress=not quiet, page=fingerprint_page)
    if quiet:
        return
    from rich.console import Console

    from poslens.reporting.readings.fingerprint import fingerprint_readings

    console = Console()
    for t in terminal_tables(result.summary):
        console.print(t)
    for line in fingerprint_readings(result.summary):
        console.print(f"- {line}", soft_wrap=False)
    console.print(f"wrote {out}/ ({', '.join(result.summary['files'][:3])}, figures, scans/)")
