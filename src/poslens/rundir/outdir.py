"""The output directory of a command: its name checked, created (or staged beside the run it
replaces) and committed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from poslens.errors import PoslensError
from poslens.rundir.io import write_error
from poslens.rundir.load import classify
from poslens.rundir.io import _claims
from poslens.rundir.lock import _acquire, _key, run_entries
from poslens.rundir.staging import _make_stage, _swap_in, check_replaceable, clear_run


def prepare_out_dir(out: str | os.PathLike, *, must_be_new: bool = False) -> Path:
    """Validate an output directory before any work starts.

    Raises a :class:`PoslensError` if ``out`` is an existing file, or (with ``must_be_new``) an
    existing non-empty directory (the lock file of :func:`lock_out_dir` does not count). Does not
    create anything: call :func:`create_out_dir` once every other input has been validated, so a
    rejected command writes nothing.
    """
    path = Path(out)
    check_path_name(path, "--out")
    try:
        resolved = path.resolve(strict=False)
    except (RuntimeError, OSError):  # a symbolic link loop
        raise PoslensError(f"--out {path}: a symbolic link that points (through others) back to itself; choose "
                           "another --out.") from None
    if path.is_symlink() and not path.exists():
        raise PoslensError(f"--out {path} is a symbolic link to {os.readlink(path)}, which does not exist; create "
                           "that directory first, or choose another --out.")
    if path.exists() and not path.is_dir():
        raise PoslensError(f"--out {path} is an existing file; pass a directory path instead.")
    if must_be_new and path.is_dir() and run_entries(path):
        raise PoslensError(f"--out {path} is not empty; choose a new directory or pass --overwrite.")
    probe = resolved.parent
    while not probe.exists() and not probe.is_symlink():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        what = "a file" if probe.exists() else "missing"
        raise PoslensError(f"--out {path}: cannot create it under {probe} ({what}); choose a writable location.")
    return path


def check_path_name(path: str | os.PathLike, flag: str) -> None:
    """Refuse a path whose name is not valid text (bytes that are not UTF-8): poslens writes the paths
    of its runs into JSON and HTML, which could not name it."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise PoslensError(f"{flag} {shown}: the path is not valid UTF-8 text; rename it or choose another.") from None


def create_out_dir(path: Path, *, command: str | None = None, overwrite: bool = False,
                   staged: bool = False) -> Path:
    """Create the run directory ``path`` (once every input is valid) and hold its lock; returns the
    directory the run writes into.

    Where the caller already holds the lock (:func:`lock_out_dir`), this only carries out a pending
    ``--overwrite`` (or ``overwrite`` here): with ``staged`` the new run is written into a sibling
    staging directory, returned here, and swapped in by :func:`commit_out_dir` once it has succeeded
    (until then the previous run stays as it was; :func:`release_out_dir` removes an uncommitted
    stage). Without ``staged`` the previous run's files are removed now. Without a lock it takes
    one, which :func:`release_out_dir` gives back. A model directory is refused unless ``command``
    is ``"train"`` (writing a run there would replace the model's config.json)."""
    path = Path(path)
    if command != "train" and path.is_dir() and classify(path) == "model":
        raise PoslensError(f"--out {path} is a model directory (its config.json describes a model); writing a run "
                           "there would replace the model's files. Choose a new --out.")
    claim = _claims.get(_key(path))
    if claim is None:
        claim = _acquire(path, implicit=True)
    claim.overwrite = claim.overwrite or overwrite
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(path, e) from None
    if claim.overwrite and run_entries(path):
        if command is not None:
            check_replaceable(path, command)
        if staged:
            if claim.stage is None:
                claim.stage = _make_stage(path)
            return claim.stage
        clear_run(path)
    claim.overwrite = False
    return path


def commit_out_dir(path: str | os.PathLike) -> None:
    """Swap a run written into the staging directory of :func:`create_out_dir` (``staged``) into
    ``path`` (nothing when it wrote ``path`` itself)."""
    claim = _claims.get(_key(Path(path)))
    if claim is None or claim.stage is None:
        return
    _swap_in(claim.stage, Path(path), replace=claim.overwrite)
    shutil.rmtree(claim.stage, ignore_errors=True)
    claim.stage, claim.overwrite, claim.created = None, False, False
