"""``poslens explore``: one offline interactive page of heads, layers, maps and comparisons."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.cli.app import app, out_option, overwrite_option, quiet_option


@app.command("explore", short_help="An interactive page of heads, layers, maps and comparisons.")
def explore(
    run_dirs: list[Path] = typer.Argument(..., metavar="RUN_DIR", help="Run directories of poslens scan or poslens "
                                          "compare (a text scan and a --data random scan of the same model pair up "
                                          "as the random-token control)."),
    out: Path = out_option("HTML file to write (must be new unless --overwrite; written atomically).",
                           default=Path("explore.html")),
    title: str = typer.Option("poslens explorer", "--title", help="Title at the top of the page."),
    overwrite: bool = overwrite_option("the HTML file --out"),
    quiet: bool = quiet_option("Print only the page written (errors still print)."),
) -> None:
    """Write one self-contained HTML page to look through runs: click a head, see its map.

    Views: Heads (a layers × heads grid of each per-head reading: sink, best SlashScore and its
    offset, previous-token score, mean distance, massive query dimensions; click or arrow keys
    select a head, which shows its mean attention map, its diagonal profile against uniform causal
    attention and the same head on the random-token control); Layers (each per-layer reading
    against depth with its noise floor, and each layer's map); Compare (poslens compare runs: the
    change B − A of every head on a diverging scale, unchanged cells grey, A's and B's maps and
    their difference); Lengths (a reading against length, the trained context marked).

    Per-head maps need a scan with --heads all (every head's map, block-averaged to at most
    128 × 128); without them the page shows what the run has and says so. The page holds float16
    data and Plotly's offline bundle, and loads nothing from the network.
    """
    from rich.console import Console

    from poslens.api import explore as make_page

    page = make_page(*run_dirs, out=out, overwrite=overwrite, title=title)
    console = Console(highlight=False, quiet=quiet, soft_wrap=True)
    for note in page.notes:
        console.print(f"note: {note}")
    Console(highlight=False, soft_wrap=True).print(f"wrote {page.path} ({page.path.stat().st_size / 1e6:.1f} MB)")
