"""``poslens neighborhood``, ``poslens sweep``, ``poslens probes``: the analyses of arXiv 2501.00073."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from poslens.cli_app import app


def _print_tables(summary: dict, out: Path) -> None:
    from rich.table import Table

    console = Console()
    for t in summary.get("tables", []):
        table = Table(title=t["title"])
        for c in t["columns"]:
            table.add_column(str(c), justify="right")
        for r in t["rows"]:
            table.add_row(*[str(v) for v in r])
        console.print(table)
    for line in summary.get("readings", []):
        console.print(f"- {line}")
    console.print(f"wrote {out}/")


@app.command("neighborhood")
def neighborhood(
    model_dir: Path = typer.Argument(..., help="Local Hugging Face model directory (config.json + *.safetensors)."),
    out: Path = typer.Option(..., "--out", help="Run directory to create (must be new unless --overwrite)."),
    data: str = typer.Option("random", "--data", help="random (i.i.d. token ids) | stdlib | text file | directory | "
                             "JSONL | datasets directory (as for `poslens scan`)."),
    seq_len: int = typer.Option(64, "--seq-len", help="Tokens per sequence T (APS costs O(T^3) per sequence)."),
    num_seqs: int = typer.Option(32, "--num-seqs", help="Sequences; APS is reported as mean ± std over them."),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per forward pass."),
    seed: int = typer.Option(0, "--seed", help="Seed of --data random."),
    bidirectional: bool = typer.Option(False, "--bidirectional", help="Also run the control without the causal "
                                       "mask and report it beside the causal numbers."),
    device: str = typer.Option("cpu", "--device", help="auto | cpu | cuda."),
    no_figures: bool = typer.Option(False, "--no-figures", help="Skip the PNG figures."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the files of an existing run directory."),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Allow pickle weights (.bin); they can run code."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow custom model code."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar or table."),
) -> None:
    """Self-cosine maps, adjacency probability score and norm score per layer (arXiv 2501.00073).

    Layer 0 is the token embeddings; layer l the concatenated head outputs of decoder layer l
    before the output projection (the residual stream is measured too). APS counts, over
    position triples j < k < i, how often cos(h_i, h_k) > cos(h_i, h_j): 1 = similarity rises
    towards the diagonal, 0.5 = chance. Writes config.json, neighborhood.safetensors,
    summary.json and figures to OUT.
    """
    from poslens.analysis.neighborhood import NeighborhoodConfig, run_neighborhood

    cfg = NeighborhoodConfig(model_dir=str(model_dir), out=str(out), data=data, seq_len=seq_len, num_seqs=num_seqs,
                             batch_size=batch_size, seed=seed, bidirectional=bidirectional, device=device,
                             figures=not no_figures, overwrite=overwrite, allow_pickle=allow_pickle,
                             trust_remote_code=trust_remote_code)
    summary = run_neighborhood(cfg, progress=not quiet)
    if not quiet:
        _print_tables(summary, out)


@app.command("sweep")
def sweep(
    out: Path = typer.Option(..., "--out", help="Run directory to create (must be new unless --overwrite)."),
    sigmas: str = typer.Option("0.0002,0.002,0.02,0.08,0.2,2", "--sigmas", help="Init standard deviations σ "
                               "(comma-separated; the paper's grid by default)."),
    shapes: str = typer.Option("6x384,2x384,6x128", "--shapes", help="LAYERSxWIDTH shapes (head dim 64), "
                               "comma-separated: the paper's 6x384, a shallower and a narrower one by default."),
    seq_len: int = typer.Option(64, "--seq-len", help="Characters per random sequence."),
    num_seqs: int = typer.Option(16, "--num-seqs", help="Random sequences per model (APS mean ± std over them)."),
    batch_size: int = typer.Option(16, "--batch-size", help="Sequences per forward pass."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and the sequences."),
    no_bidirectional: bool = typer.Option(False, "--no-bidirectional", help="Skip the non-causal control."),
    no_figures: bool = typer.Option(False, "--no-figures", help="Skip the PNG figures."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the files of an existing run directory."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar or table."),
) -> None:
    """Random-init sweep (arXiv 2501.00073): APS of untrained NoPE models over init σ, depth and width.

    Every weight matrix and the embedding are drawn from N(0, σ²); the same draw is rescaled for
    every σ. APS is measured per layer on i.i.d. random printable-ASCII sequences, causal and
    bidirectional. The default (3 shapes x 6 σ x 2 modes) takes about a minute on one CPU core.
    """
    from poslens.analysis.sweep import SweepConfig, parse_floats, run_sweep

    cfg = SweepConfig(out=str(out), sigmas=parse_floats(sigmas, "--sigmas"),
                      shapes=[s.strip() for s in shapes.split(",") if s.strip()], seq_len=seq_len,
                      num_seqs=num_seqs, batch_size=batch_size, seed=seed, bidirectional=not no_bidirectional,
                      figures=not no_figures, overwrite=overwrite)
    summary = run_sweep(cfg, progress=not quiet)
    if not quiet:
        _print_tables(summary, out)
