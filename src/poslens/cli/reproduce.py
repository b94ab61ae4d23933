"""``poslens reproduce``: the papers' figures, one command each."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.cli.app import (app, device_option, no_figures_option, out_option, overwrite_option, quiet_option,
                             refuse_existing_out, seed_option, threads_option, use_threads)
from poslens.runtime import parse_device


@app.command(short_help="The papers' figures: what they showed, what we measure.")
def reproduce(
    name: str = typer.Argument(..., metavar="NAME", help="Experiment name (see the list below), or all."),
    out: Path = out_option("Directory for the figures, runs and index (must be new unless --overwrite).",
                           default=Path("runs/reproduce")),
    samples: int = typer.Option(100_000, help="Monte Carlo samples per simulation (paper: 100,000)."),
    seed: int = seed_option("Random seed."),
    device: str = device_option(),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option("the directory --out"),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Reproduce a paper figure (or all of them) and say, per figure, what the paper showed and what we measured.

    Experiments: kim-fig1, kim-fig2, kim-alpha, kim-layernorm, kim-fig4 (simulator); zuo-adjacency, zuo-sweep, zuo-probes,
    kim-trained-panels, slash-sdh (small models; trained ones from the zoo in $POSLENS_ZOO or
    runs/zoo, random-init stand-ins otherwise); real (the three papers' analyses on the real pretrained models of
    `poslens models fetch`; part of all when they are present); all.
    Writes DIR/NAME/ run directories, DIR/index.json, DIR/index.md and DIR/index.html.
    """
    threads = use_threads(threads)
    from rich.console import Console

    from poslens.errors import PoslensError
    from poslens.progress import task_progress
    from poslens.reproduce import ReproContext, names, run_reproduction
    from poslens.rundir.outdir import prepare_out_dir

    if name not in names():
        raise PoslensError(f"unknown experiment {name!r}; choose one of: {', '.join(names())}.")
    refuse_existing_out(out, overwrite=overwrite)
    out = prepare_out_dir(out)
    with task_progress(f"reproduce {name}", samples, enabled=not quiet) as update:
        ctx = ReproContext(samples=samples, device=parse_device(device), seed=seed, figures=not no_figures,
                           progress=update)
        records = run_reproduction(name, out, ctx)
    if not quiet:
        c = Console()
        for r in records:
            c.print(f"[bold]{r['name']}[/bold]: {'[green]reproduced' if r['reproduced'] else '[red]NOT reproduced'}[/]")
            for line in str(r["measured"]).splitlines():
                c.print(f"  {line}")
        c.print(f"wrote {out}/index.md")
