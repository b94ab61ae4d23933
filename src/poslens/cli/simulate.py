"""``poslens simulate``: the parameter-free transformer lab (arXiv 2509.21042)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from poslens.cli.app import (app, device_option, no_figures_option, out_option, overwrite_option, quiet_option,
                             refuse_existing_out, seed_option, seq_len_option, threads_option, use_threads)
from poslens.runtime import parse_device


@app.command(short_help="The parameter-free transformer: mean score maps.")
def simulate(
    alpha: float = typer.Option(0.0, help="Mean pairwise inner product of the inputs, in [0, 1)."),
    num_layers: int = typer.Option(4, "--num-layers", help="Number of parameter-free layers."),
    seq_len: int = seq_len_option(50, "Sequence length."),
    dim: int = typer.Option(64, help="Model dimension d (also RoPE's head dimension)."),
    samples: int = typer.Option(100_000, help="Monte Carlo samples (sequences). Memory does not grow with it."),
    norm: str = typer.Option("l2", help="Row normalisation: l2 or layernorm (no affine)."),
    scale: Optional[str] = typer.Option(None, help="LayerNorm score scaling: sqrt-d (default) or d."),
    rope: bool = typer.Option(False, "--rope/--no-rope", help="Rotate queries and keys with RoPE (values stay unrotated)."),
    rope_theta: float = typer.Option(10000.0, "--rope-theta", help="RoPE base."),
    causal: bool = typer.Option(True, "--causal/--no-causal", help="Causal mask, or bidirectional control."),
    seed: int = seed_option("Random seed; results depend on seed and samples only."),
    device: str = device_option(),
    chunk_size: int = typer.Option(0, "--chunk-size", help="Sequences per compute chunk (0 = automatic)."),
    target_stderr: Optional[float] = typer.Option(None, "--target-stderr",
                                                  help="Stop early once every score's standard error is below this."),
    no_figures: bool = no_figures_option(),
    out: Path = out_option("Run directory to write (must be new unless --overwrite).", default=Path("runs/simulate")),
    overwrite: bool = overwrite_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Simulate the parameter-free causal transformer and write mean score maps with standard errors.

    Each layer computes X <- Softmax(Mask(Q K^T)) Y + X with Y = Norm(X), Q = K = RoPE(Y) or Y.
    Inputs x_i = normalize(z_i + sqrt(alpha/(1-alpha)) c) have mean inner product alpha.
    Writes DIR/config.json, DIR/maps.safetensors (scores, scores_stderr, probs: [L,S,S]),
    DIR/summary.json (per layer, counted from 0: relativity_index, locality, signed diagonal_trend,
    within_diag_rms with its noise floor, p-values from 16 independent sample groups) and PNG heat maps.
    """
    workers = threads or None  # 0: one worker per CPU (the chunks never wait for each other)
    threads = use_threads(threads)
    from rich.console import Console

    from poslens.progress import task_progress
    from poslens.reporting.terminal import print_simulation_summary
    from poslens.rundir.outdir import prepare_out_dir
    from poslens.simulator import SimConfig, run_simulation, save_result

    cfg = SimConfig(alpha=alpha, layers=num_layers, seq_len=seq_len, dim=dim, samples=samples, norm=norm,
                    scale=scale, rope=rope, rope_theta=rope_theta, causal=causal, seed=seed,
                    device=parse_device(device), chunk_size=chunk_size, target_stderr=target_stderr).validate()
    refuse_existing_out(out, overwrite=overwrite)
    out = prepare_out_dir(out)
    with task_progress(f"simulate ({cfg.label()})", cfg.samples, enabled=not quiet) as update:
        res = run_simulation(cfg, progress=lambda done, total: update(done, total), workers=workers)
    save_result(res, out, figures=not no_figures)
    if not quiet:
        print_simulation_summary(res.summary, Console())
        Console().print(f"wrote {out}/ (config.json, maps.safetensors, summary.json{'' if no_figures else ', PNGs'})")
