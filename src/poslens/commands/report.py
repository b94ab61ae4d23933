"""``poslens report``: one self-contained HTML file from run directories."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.cli_app import app


@app.command("report")
def report(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories (simulate, scan, train, reproduce, analysis "
                                          "commands), or folders that hold them (a demo, zoo or reproduce output)."),
    out: Path = typer.Option(Path("report.html"), "--out", help="HTML file to write (replaced atomically)."),
    title: str = typer.Option("poslens report", "--title", help="Title at the top of the page."),
) -> None:
    """Write one self-contained HTML report: a section per paper, tables, readings, comparisons.

    Every figure is embedded as a data: URI and the page loads nothing from the network (its
    Content-Security-Policy forbids it), so the file can be mailed or archived on its own.
    Folders that hold run directories are searched (three levels deep); with several runs of
    the same kind (NoPE and RoPE scans, say) the report adds side-by-side comparison tables.
    """
    from rich.console import Console

    from poslens.errors import PoslensError
    from poslens.report import write_report

    if out.suffix.lower() not in (".html", ".htm"):
        raise PoslensError(f"--out {out}: the report is HTML; pass a file name ending in .html.")
    path = write_report(run_dirs, out, title=title)
    Console().print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
