"""The output directory of a command: the rule it must meet, checked once before any work starts
(:func:`check_out_dir`), then created (or staged beside the run it replaces) and committed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from poslens.errors import PoslensError
from poslens.rundir.io import write_error
from poslens.rundir.load import classify
from poslens.rundir.io import _claims
from poslens.rundir.lock import _acquire, _key, run_entries
from poslens.rundir.staging import _make_stage, _swap_in, check_replaceable, clear_run, sweep_stale_stages


def check_out_dir(out: str | os.PathLike, *, command: str | None, overwrite: bool = False,
                  resume: bool | None = None, hold: Callable[[Path], object] | None = None) -> Path:
    """The rule of a command's run directory ``out`` (docs/cli.md), checked once before any work starts;
    raises a :class:`PoslensError` in one line naming the input and the fix, writes nothing itself:

    - ``resume`` and ``overwrite`` together contradict each other;
    - ``out`` is a directory that can be created (:func:`prepare_out_dir`);
    - ``hold(path)``, where given, takes the directory's lock before the rest is checked, so that it
      cannot change under another process;
    - a non-empty directory is refused unless ``overwrite``, or ``resume`` (pass ``resume`` only for a
      command that can continue a run; None: the error does not offer it);
    - ``overwrite`` replaces only a run directory of ``command`` holding nothing poslens did not write
      (:func:`check_replaceable`); a run continued in place (``resume``) is never a model directory.
      ``command`` None: the caller decides what may be replaced."""
    path = Path(out)
    if resume and overwrite:
        raise PoslensError("--resume and --overwrite contradict each other; pass one.")
    prepare_out_dir(path)  # an existing file, an unwritable parent
    if hold is not None:
        hold(path)
    if not path.is_dir() or not run_entries(path):
        return path
    if overwrite:
        if command is not None:
            check_replaceable(path, command)
    elif not resume:
        fix = "pass --resume to continue it or --overwrite to replace it" if resume is not None else \
            "pass --overwrite to replace it"
        raise PoslensError(f"--out {path} already exists and is not empty; {fix}, or choose a new directory.")
    elif command not in (None, "train"):
        _refuse_model_dir(path)
    return path


def hold_run_dir(path: str | os.PathLike, *, command: str | None = None) -> None:
    """Take the lock of run directory ``path`` for the run about to write it (unless this process holds
    it already): the hold :func:`create_out_dir` uses, which :func:`release_out_dir` gives back."""
    path = Path(path)
    if _claims.get(_key(path)) is None:
        _acquire(path, implicit=True, command=command)


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
        raise PoslensError(f"--out {path}: cannot create it under {probe} ({_unwritable(probe)}); choose a writable "
                           "location.")
    return path


def _unwritable(probe: Path) -> str:
    """Why the existing ``probe`` cannot hold a new directory, in words: a file, a directory on a read-only
    file system, or one this user may not write."""
    if not probe.exists():
        return "missing"
    if not probe.is_dir():
        return "a file, not a directory"
    try:
        read_only = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    return "a directory on a read-only file system" if read_only else "a directory this user may not write to"


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
                   staged: bool = False, checked: bool = False) -> Path:
    """Create the run directory ``path`` (once every input is valid) and hold its lock; returns the
    directory the run writes into.

    Where the caller already holds the lock (:func:`lock_out_dir`), this only carries out a pending
    ``--overwrite`` (or ``overwrite`` here): with ``staged`` the new run is written into a sibling
    staging directory, returned here, and swapped in by :func:`commit_out_dir` once it has succeeded
    (until then the previous run stays as it was; :func:`release_out_dir` removes an uncommitted
    stage). Without ``staged`` the previous run's files are removed now. Without a lock it takes
    one, which :func:`release_out_dir` gives back. A model directory is refused unless ``command``
    is ``"train"`` (writing a run there would replace the model's config.json). ``checked``: the
    caller ran :func:`check_out_dir` under the lock it holds, so neither check is made again."""
    path = Path(path)
    if command != "train" and not checked:
        _refuse_model_dir(path)
    claim = _claims.get(_key(path))
    if claim is None:
        claim = _acquire(path, implicit=True)
    sweep_stale_stages(path, ("partial",))  # the scratch a killed writer of this run left beside it
    claim.overwrite = claim.overwrite or overwrite
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(path, e) from None
    if claim.overwrite and run_entries(path):
        if command is not None and not checked:
            check_replaceable(path, command)
        if staged:
            if claim.stage is None:
                claim.stage = _make_stage(path)
            return claim.stage
        clear_run(path)
    claim.overwrite = False
    return path


def _refuse_model_dir(path: Path) -> None:
    if path.is_dir() and classify(path) == "model":
        raise PoslensError(f"--out {path} is a model directory (its config.json describes a model); writing a run "
                           "there would replace the model's files. Choose a new --out.")


def commit_out_dir(path: str | os.PathLike) -> None:
    """Swap a run written into the staging directory of :func:`create_out_dir` (``staged``) into
    ``path`` (nothing when it wrote ``path`` itself)."""
    claim = _claims.get(_key(Path(path)))
    if claim is not None:
        claim.committed = True
    if claim is None or claim.stage is None:
        return
    _swap_in(claim.stage, Path(path), replace=claim.overwrite)
    shutil.rmtree(claim.stage, ignore_errors=True)
    claim.stage, claim.overwrite, claim.created = None, False, False
