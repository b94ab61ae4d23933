"""What poslens wrote into a run directory (the manifest), what ``--overwrite`` may replace, and the
staged swap of a finished run into place."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path, PurePosixPath
from typing import Iterator

from poslens.errors import PoslensError
from poslens.rundir.io import _is_write_error, make_shareable, record_written, write_error
from poslens.rundir.load import classify
from poslens.rundir.io import MANIFEST, _LEFTOVER, _claims, _note_enclosing, _write_manifest, read_manifest
from poslens.rundir.lock import LOCK_FILE, _key, out_dir_lock, pid_alive, run_entries


def _tree_files(root: Path) -> set[str]:
    """Every file below ``root`` (relative, "/"-separated), the record of a run written there whole."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for name in filenames:
            if not (rel == Path(".") and name in (LOCK_FILE, MANIFEST)):
                out.add((rel / name).as_posix())
    return out


def foreign_files(path: str | os.PathLike) -> list[Path]:
    """What run directory ``path`` holds beyond the files its record (:data:`MANIFEST`) says poslens
    wrote: a user's files and folders, dotfiles included, in sorted order; every entry when it
    holds no record."""
    path = Path(path)
    own = read_manifest(path)
    if own is None:
        return run_entries(path)
    whole = {n.rstrip("/") for n in own if n.endswith("/")}
    files = {n for n in own if not n.endswith("/")}
    parents = {p.as_posix() for n in own for p in PurePosixPath(n.rstrip("/")).parents if p.as_posix() != "."}
    found: list[Path] = []

    def walk(d: Path, rel: str) -> None:
        for p in sorted(d.iterdir()):
            r = rel + p.name
            if p.name in (LOCK_FILE, MANIFEST):  # this run's, or a run's written inside it
                continue
            if _LEFTOVER.match(p.name) and not p.is_symlink():
                continue
            if p.is_dir() and not p.is_symlink():
                if r in whole:
                    continue
                if r in parents:
                    walk(p, r + "/")
                    continue
                found.append(p)
            elif r not in files:
                found.append(p)

    walk(path, "")
    return found


def written_by(path: Path) -> str | None:
    """The command whose run directory ``path`` is (``train`` for a directory it trained, ``demo``,
    ``reproduce``), or None: not a poslens run (an empty directory, a model from elsewhere, other files)."""
    kind = classify(path)
    if kind == "command":
        try:
            cmd = json.loads((path / "config.json").read_text()).get("command")
        except (OSError, ValueError, AttributeError):
            return None
        return cmd if isinstance(cmd, str) else None
    if kind == "model":
        return "train" if (path / "train_config.json").is_file() else None
    if kind == "reproduce":
        return "reproduce"
    if (path / "demo.json").is_file():
        return "demo"
    if (path / "train_config.json").is_file():  # a training run stopped before it wrote its model config
        return "train"
    return None


def check_replaceable(out: str | os.PathLike, command: str) -> None:
    """Refuse ``--overwrite`` of ``out`` unless it is empty or a run directory of ``command`` holding
    only files poslens writes; the error says why and what to do instead."""
    path = Path(out)
    if not path.is_dir() or not run_entries(path):
        return
    kind = classify(path)
    owner = written_by(path)
    if kind == "model" and owner is None:
        raise PoslensError(f"--out {path} is a model directory, not a poslens run (its config.json describes a "
                           "model); --overwrite would destroy the model. Choose a new --out.")
    if owner is None:
        names = ", ".join(p.name for p in run_entries(path)[:3])
        raise PoslensError(f"--out {path} holds files poslens did not write ({names}); --overwrite replaces only "
                           f"a run directory of `poslens {command}`. Choose a new --out, or move those files away.")
    if owner != command:
        raise PoslensError(f"--out {path} is a `poslens {owner}` run; --overwrite replaces only a run of "
                           f"`poslens {command}`. Choose a new --out, or delete that run first.")
    foreign = foreign_files(path)
    if foreign and read_manifest(path) is None:
        raise PoslensError(f"--out {path} holds no record of the files poslens wrote ({MANIFEST}: a run of an older "
                           "poslens, or one stopped before it wrote anything), so --overwrite cannot tell them from "
                           "yours. Choose a new --out, or delete the old run yourself.")
    if foreign:
        first = foreign[0].relative_to(path)
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise PoslensError(f"--out {path} is a `poslens {owner}` run but also holds {first}{more}, which poslens did "
                           "not write; --overwrite would delete it. Move it away, or choose a new --out.")


def clear_run(path: Path) -> None:
    """Remove what poslens wrote into run directory ``path`` (its record, :data:`MANIFEST`, and the
    leftovers of interrupted writes), then the folders that left empty; without a record, everything
    but its lock file (callers check :func:`check_replaceable` first)."""
    path = Path(path)
    own = read_manifest(path)
    if own is None:
        for p in run_entries(path):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        return
    for name in sorted(own):
        p = path / name.rstrip("/")
        if p.is_dir() and not p.is_symlink():
            if name.endswith("/"):
                shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            if _LEFTOVER.match(name):
                p = Path(dirpath) / name
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for d in sorted({p.as_posix() for n in own for p in PurePosixPath(n.rstrip("/")).parents if p.as_posix() != "."},
                    key=len, reverse=True):
        with contextlib.suppress(OSError):
            (path / d).rmdir()  # only when empty
    (path / MANIFEST).unlink(missing_ok=True)


def _swap_in(stage: Path, out: Path, *, replace: bool) -> None:
    """Move the run written into ``stage`` into ``out``, its files recorded (:data:`MANIFEST`). With
    ``replace``, the previous run's files are first moved aside and deleted only once every new one
    is in place; whatever fails on the way (a full disk, Ctrl-C) puts everything back."""
    files = _tree_files(stage)
    _write_manifest(stage, files)
    old: list[str] = []
    if replace and out.is_dir():
        foreign = foreign_files(out)
        if foreign:
            raise PoslensError(f"--out {out}: {foreign[0].relative_to(out)} appeared there while the run was written "
                               "(poslens did not write it); the previous run is kept as it was. Move it away and "
                               "run again, or choose a new --out.")
        old = sorted(p.name for p in run_entries(out))
    aside = Path(tempfile.mkdtemp(prefix=stage_prefix(out, "previous"), dir=out.parent)) if old else None
    moved_old: list[str] = []
    moved_new: list[str] = []
    try:
        for name in old:
            os.replace(out / name, aside / name)
            moved_old.append(name)
        for f in sorted(stage.iterdir()):
            target = out / f.name
            if target.exists() or target.is_symlink():
                if not (target.is_dir() and f.is_dir() and not any(target.iterdir())):
                    raise PoslensError(f"{target} already exists; cannot put the new run's {f.name} there. Move it "
                                       "away, or choose a new --out.")
                target.rmdir()
            os.replace(f, target)
            moved_new.append(f.name)
    except BaseException as e:
        for name in reversed(moved_new):
            os.replace(out / name, stage / name)
        for name in reversed(moved_old):
            os.replace(aside / name, out / name)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        if _is_write_error(e):
            raise write_error(out, e) from None
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    _note_enclosing(out, sorted(files))
    sweep_stale_stages(out)  # what a killed writer of this run left beside it


# --------------------------------------------------------------------------------------------
# the staging folders beside a run, named by their owner
# --------------------------------------------------------------------------------------------
def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def stage_prefix(out: Path, kind: str) -> str:
    """The name's start of a staging folder beside run directory ``out``: ``.OUT.partial-PID@HOST-`` (the
    new run being written) or ``.OUT.previous-PID@HOST-`` (the run it replaces, moved aside during the
    swap), naming the process that owns it (``HOST``: a tag of this host's name)."""
    return f".{out.name}.{kind}-{os.getpid()}@{_host_tag()}-"


#: a staging folder's name: its run, its kind, its owner (mkdtemp's 8 random characters end it)
_STAGE = re.compile(r"^\.(?P<run>.+)\.(?P<kind>partial|previous)-(?P<pid>\d+)@(?P<host>[0-9a-f]{8})-[a-z0-9_]{8}$")


def sweep_stale_stages(out: Path, kinds: tuple[str, ...] = ("partial", "previous")) -> list[Path]:
    """Remove the staging folders beside ``out`` (:func:`stage_prefix`) of ``kinds`` whose owner is gone:
    a process of this host that no longer runs (killed with SIGKILL, say, mid-write or mid-swap). Those of a
    live process, of another host, or not named by their owner are kept. Returns the folders removed."""
    out = Path(out)
    removed = []
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return removed
    host = _host_tag()
    for p in siblings:
        m = _STAGE.match(p.name)
        if not m or m["run"] != out.name or m["kind"] not in kinds or m["host"] != host:
            continue
        pid = int(m["pid"])
        if pid == os.getpid() or pid_alive(pid) or p.is_symlink() or not p.is_dir():
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike) -> Iterator[Path]:
    """Write a run's files into a hidden sibling directory, then swap them into ``out``.

    If anything fails inside the ``with`` block, ``out`` is left exactly as it was (a previous
    run's results stay intact) and the staging directory is removed: nothing is half-written. The
    swap happens under ``out``'s lock (:func:`lock_out_dir`); a pending ``--overwrite`` replaces the
    previous run's files (:func:`_swap_in`), so none of them is left beside the new ones.
    """
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(out, e) from None
    stage = _make_stage(out)
    try:
        yield stage
        with out_dir_lock(out):
            claim = _claims[_key(out)]
            _swap_in(stage, out, replace=claim.overwrite)
            claim.overwrite = False
            claim.created = False  # the run's files are in it now
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _make_stage(out: Path) -> Path:
    sweep_stale_stages(out, ("partial",))  # a killed writer's scratch (the run it replaced stays till a swap)
    try:
        return Path(tempfile.mkdtemp(prefix=stage_prefix(out, "partial"), dir=out.parent))
    except OSError as e:
        raise write_error(out.parent / stage_prefix(out, "partial"), e) from None


@contextlib.contextmanager
def staged_folder(out: Path, kind: str) -> Iterator[Path]:
    """A hidden folder ``.{kind}.XXXXXXXX`` inside run directory ``out`` (``kind``: ``save`` or
    ``checkpoint``, the leftovers :func:`clear_run` knows) to write files into before they are renamed
    into place; whatever is still in it on leaving, the folder included, is removed."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{kind}.", dir=out))
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def move_into(tmp: Path, out: Path) -> None:
    """Rename every file of staged folder ``tmp`` into run directory ``out`` (each rename is atomic),
    each with the modes of the files poslens writes, then remove ``tmp``; the run records them as its
    own (``--overwrite`` removes them)."""
    names = sorted(f.name for f in tmp.iterdir())
    record_written(out, *names)
    for name in names:
        make_shareable(tmp / name)
        os.replace(tmp / name, out / name)
    tmp.rmdir()
