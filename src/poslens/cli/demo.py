"""``poslens demo``: the README's main command."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.cli.app import app, parse_device
from poslens.cli.app import threads_option, use_threads  # --threads


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Where to write every step's results."),
    samples: int = typer.Option(20_000, help="Monte Carlo samples per simulation."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    quick: bool = typer.Option(False, "--quick", help="Tiny sizes everywhere (a smoke test in seconds)."),
    threads: int = threads_option(),
) -> None:
    """Run the whole poslens flow on the built-in data with no arguments needed.

    Closed-form theory, the parameter-free simulator (NoPE; RoPE causal vs non-causal), and —
    as they are available — small-model training, scans and the HTML report.
    """
    threads = use_threads(threads)
    from poslens.demo import DemoConfig, run_demo
    from poslens.errors import PoslensError
    from poslens.rundir import prepare_out_dir

    if samples < 1:
        raise PoslensError(f"--samples {samples}: must be a positive integer.")
    run_demo(DemoConfig(out=prepare_out_dir(out), samples=samples, device=parse_device(device), quick=quick))
