"""``poslens theory``: closed forms, printed as a table or JSON."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from poslens.cli.app import app

theory_app = typer.Typer(help="Closed-form predictions the simulations and scans are checked against.",
                         no_args_is_help=True)
app.add_typer(theory_app, name="theory", short_help="Closed forms the simulations are checked against.")


@theory_app.command("kim", short_help="Layer-1 g(i), h(i) and layer-2 scores (arXiv 2509.21042).")
def kim(
    alpha: float = typer.Option(0.0, help="Pairwise inner product of the unit-norm inputs, in [0, 1)."),
    seq_len: int = typer.Option(8, "--seq-len", help="Sequence length N."),
    as_json: bool = typer.Option(False, "--json", help="Print {scores, g, h} as JSON (scores: N x N, null above the diagonal)."),
) -> None:
    """Closed form of arXiv 2509.21042: layer-1 g(i), h(i) and the layer-2 pre-softmax score matrix.

    Exact for the L2-normalised parameter-free causal layer when every pair of inputs has inner
    product alpha. Rows are queries, columns keys, 0-indexed.
    """
    from poslens.theory import kim_theory

    t = kim_theory(alpha, seq_len)
    if as_json:
        typer.echo(json.dumps(t.to_json()))
        return
    from poslens.fmt import rich_table

    console = Console()
    rows = [[i, *[float(v) for v in t.scores[i]]] for i in range(seq_len)]  # NaN above the diagonal reads "–"
    console.print(rich_table(f"Layer-2 pre-softmax scores, alpha={alpha}, N={seq_len} (rows: query, cols: key)",
                             ["q\\k", *[str(j) for j in range(seq_len)]], rows))
    # g and h at four decimals (not fmt's three digits): the closed form is compared digit by digit with the paper
    console.print("g(i): " + " ".join(f"{float(v):.4f}" for v in t.g))
    console.print("h(i): " + " ".join(f"{float(v):.4f}" for v in t.h))
