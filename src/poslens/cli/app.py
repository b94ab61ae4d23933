"""The typer application object. The command modules in :mod:`poslens.cli` attach to it.

Kept separate from ``poslens/cli/__init__.py`` so a command module can import ``app`` without
import cycles; the package ``__init__`` imports every command module and runs the app.
"""

from __future__ import annotations

import typer

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


def parse_device(device: str) -> str:
    """Resolve ``auto|cpu|cuda`` into a torch device string, with a clear error if CUDA is absent."""
    import torch

    from poslens.errors import PoslensError

    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise PoslensError(f"--device {device!r} is not one of auto, cpu, cuda.")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PoslensError(f"--device {device}: no CUDA GPU is visible; use --device cpu or auto.")
    return device
