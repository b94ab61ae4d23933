"""Self-describing run directories with atomic writes.

Layout shared by every command that produces results (simulate, scan, train, ...):

- ``config.json``: every option, the seed and the library versions;
- ``*.safetensors``: tensors (float32 on disk, accumulated in float64 in memory);
- ``summary.json``: scalars;
- ``*.png``: figures.

Every write goes to a temporary file in the same directory and is renamed into place, so a
reader never sees a half-written file and an interrupted run leaves the previous version intact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from poslens.errors import PoslensError


def versions() -> dict[str, str]:
    """Versions of Python and of the libraries a result depends on."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in ("poslens", "torch", "transformers", "numpy", "safetensors", "tokenizers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


_UMASK = os.umask(0)
os.umask(_UMASK)


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write ``path`` all-or-nothing: ``write(tmp)`` fills a temporary file next to it, which is then
    fsynced, made world-readable (mkstemp creates 0600; results are meant to be shared) and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def _jsonable(obj: Any) -> Any:
    """Convert dataclasses, paths, tensors and non-finite floats into plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "tolist"):  # torch / numpy scalars and arrays
        return _jsonable(obj.tolist())
    return obj


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON; NaN/inf become ``null``."""
    text = json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n"
    _atomic_write_bytes(Path(path), text.encode())


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as f:
        return json.load(f)


def write_tensors(path: str | os.PathLike, tensors: Mapping[str, Any], metadata: dict | None = None) -> None:
    """Atomically write a dict of tensors to a ``.safetensors`` file.

    Written by ``safetensors.torch.save_file`` into a temporary file next to ``path`` (then fsync
    and rename), which streams the tensors' own buffers: no serialised copy of the whole file is
    held in memory (scan accumulators at 4,096 tokens are gigabytes).
    """
    import torch
    from safetensors.torch import save_file

    clean = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    meta = {k: json.dumps(_jsonable(v)) for k, v in (metadata or {}).items()}
    _atomic_write(Path(path), lambda tmp: save_file(clean, tmp, metadata=meta or None))


def read_tensors(path: str | os.PathLike) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def prepare_out_dir(out: str | os.PathLike, *, must_be_new: bool = False) -> Path:
    """Validate an output directory before any work starts.

    Raises a :class:`PoslensError` if ``out`` is an existing file, or (with ``must_be_new``) an
    existing non-empty directory. Does not create anything: call :func:`create_out_dir` once
    every other input has been validated, so a rejected command writes nothing.
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise PoslensError(f"--out {path} is an existing file; pass a directory path instead.")
    if must_be_new and path.is_dir() and any(path.iterdir()):
        raise PoslensError(f"--out {path} is not empty; choose a new directory or pass --overwrite.")
    parent = path.resolve().parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise PoslensError(f"--out {path}: cannot create it under {probe}; choose a writable location.")
    return path


def create_out_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike) -> Iterator[Path]:
    """Write a run's files into a hidden sibling directory, then move them into ``out``.

    If anything fails inside the ``with`` block, ``out`` is left exactly as it was (a previous
    run's results stay intact) and the staging directory is removed: nothing is half-written.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield stage
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(stage.iterdir()):
            target = out / f.name
            if target.is_dir() and not f.is_dir():
                raise PoslensError(f"{target} is a directory; cannot replace it with a file.")
            if f.is_dir():
                if target.exists():
                    shutil.rmtree(target)
                shutil.move(str(f), str(target))
            else:
                os.replace(f, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def save_figures(out_dir: str | os.PathLike, figures) -> list[dict]:
    """Save ``(file_name, figure, caption)`` triples into ``out_dir``; returns the run-dir contract's
    ``[{"file", "caption"}]`` list for ``summary.json``."""
    saved = []
    for name, fig, caption in figures:
        save_figure(fig, Path(out_dir) / name)
        saved.append({"file": name, "caption": caption})
    return saved


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """Atomically save a matplotlib figure as PNG and close it."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    _atomic_write_bytes(Path(path), buf.getvalue())
