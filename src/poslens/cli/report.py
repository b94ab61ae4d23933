"""``poslens report``: one self-contained HTML file from run directories."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.cli.app import app, out_option, overwrite_option, quiet_option


@app.command("report", short_help="One self-contained HTML report over run directories.")
def report(
    run_dirs: list[Path] = typer.Argument(..., metavar="RUN_DIR", help="Run directories (simulate, scan, train, reproduce, analysis "
                                          "commands), or folders that hold them (a demo, zoo or reproduce output)."),
    out: Path = out_option("HTML file to write (must be new unless --overwrite; written atomically).",
                           default=Path("report.html")),
    title: str = typer.Option("poslens report", "--title", help="Title at the top of the page."),
    all_runs: bool = typer.Option(False, "--all", help="Include every run found below a folder that is not itself a "
                                  "run, even more than 5 (without it such a search is refused as ambiguous)."),
    overwrite: bool = overwrite_option("the HTML file --out"),
    quiet: bool = quiet_option("Do not list the runs included (errors still print)."),
) -> None:
    """Write one self-contained HTML report: a section per paper, tables, readings, comparisons.

    Every figure is embedded as a data: URI and the page loads nothing from the network (its
    Content-Security-Policy forbids it), so the file can be mailed or archived on its own.
    Folders that hold run directories are searched (three levels deep); a folder that is no
    poslens output (demo, zoo) and holds more than 5 runs is refused unless --all. The runs
    included are listed before the page is written. With several runs of one command (NoPE and
    RoPE scans, say) the report overlays them in one set of per-layer plots.
    """
    from rich.console import Console

    from poslens.errors import PoslensError
    from poslens.reporting import collect, write_runs

    if out.suffix.lower() not in (".html", ".htm"):
        raise PoslensError(f"--out {out}: the report is HTML; pass a file name ending in .html.")
    if out.exists() and out.is_dir():
        raise PoslensError(f"--out {out} is a directory; pass a file name such as {out / 'report.html'}.")
    if out.exists() and not overwrite:
        raise PoslensError(f"--out {out} already exists; pass --overwrite to replace it, or choose a new file name.")
    runs, skipped = collect(run_dirs, allow_many=all_runs)
    console = Console(highlight=False, quiet=quiet)
    console.print(f"including {len(runs)} run director{'y' if len(runs) == 1 else 'ies'}:")
    for r in runs:
        console.print(f"  {r.path}  ({r.command})", soft_wrap=True)
    for s in skipped:
        console.print(f"  skipped: {s}", soft_wrap=True)
    path = write_runs(runs, out, title=title, skipped=skipped, new=not overwrite)
    console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
