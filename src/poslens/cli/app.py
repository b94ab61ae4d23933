"""The typer application object. The command modules in :mod:`poslens.cli` attach to it.

Kept separate from ``poslens/cli/__init__.py`` so a command module can import ``app`` without
import cycles; the package ``__init__`` imports every command module and runs the app.
"""

from __future__ import annotations

import typer

from poslens.runtime import parse_device  # noqa: F401  (moved to poslens.runtime; re-exported until the CLI moves)

app = typer.Typer(
    name="poslens",
    help=(
        "Measure where positional information in causal transformers comes from: the causal mask, "
        "RoPE, and their interaction. Start with `poslens demo`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def threads_option():
    """The ``--threads`` option of every command that computes (see :mod:`poslens.runtime`)."""
    return typer.Option(0, "--threads", min=0,
                        help="CPU threads for torch. 0 (default): the CPUs not busy with other processes "
                             "right now, at least 1 (a thread sharing a core with a busy process slows the "
                             "others down).")


def use_threads(threads: int) -> int:
    """Apply ``--threads`` for the rest of the command; returns the count in force."""
    from poslens.runtime import apply_threads

    return apply_threads(threads)
