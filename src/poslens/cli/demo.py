"""``poslens demo``: the README's main command."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.cli.app import (app, device_option, no_figures_option, out_option, overwrite_option, quiet_option,
                             refuse_existing_out, threads_option, use_threads)
from poslens.runtime import parse_device


@app.command(short_help="The whole flow on built-in data, in a few CPU minutes.")
def demo(
    out: Path = out_option("Where to write every step's results (must be new unless --overwrite).",
                           default=Path("runs/demo")),
    samples: int = typer.Option(20_000, help="Monte Carlo samples per simulation."),
    device: str = device_option(),
    quick: bool = typer.Option(False, "--quick", help="Tiny sizes everywhere (a smoke test in seconds)."),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option("an earlier demo in --out"),
    quiet: bool = quiet_option("Print nothing but errors (the results are in --out)."),
    threads: int = threads_option(),
) -> None:
    """Run the whole poslens flow on the built-in data with no arguments needed.

    Closed-form theory, the parameter-free simulator (NoPE; RoPE causal vs non-causal), and —
    as they are available — small-model training, scans and the HTML report.
    """
    threads = use_threads(threads)
    from rich.console import Console

    from poslens.demo import DemoConfig, run_demo
    from poslens.errors import PoslensError, require_fits
    from poslens.rundir.outdir import prepare_out_dir

    if samples < 1:
        raise PoslensError(f"--samples {samples}: must be a positive integer.")
    require_fits("--samples", samples)  # before the first step writes anything
    refuse_existing_out(out, overwrite=overwrite)
    cfg = DemoConfig(out=prepare_out_dir(out), samples=samples, device=parse_device(device), quick=quick,
                     figures=not no_figures, progress=not quiet)
    run_demo(cfg, console=Console(quiet=quiet), show_progress=not quiet)
