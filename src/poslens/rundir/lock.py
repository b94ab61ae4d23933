"""One run per directory: the lock a command holds while it writes, and its release."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from poslens.errors import PoslensError
from poslens.rundir.io import _UMASK, _claims

# --------------------------------------------------------------------------------------------
# One run per directory: the lock, and what --overwrite may replace
# --------------------------------------------------------------------------------------------
#: the lock file a command holds in its run directory while it writes it (JSON: pid, host, command)
LOCK_FILE = ".poslens.lock"


@dataclasses.dataclass
class _Claim:
    """This process's hold on one run directory's lock."""

    fd: int  # the open lock file, flock'ed: the OS frees the lock when the process dies
    lock: Path  # absolute
    created: bool  # the directory was made to hold the lock: removed again if nothing else lands in it
    overwrite: bool  # the previous run's files are still to be removed (create_out_dir, staged_dir)
    explicit: int = 0  # holds of lock_out_dir / out_dir_lock
    implicit: int = 0  # the hold create_out_dir took itself (given back by release_out_dir)
    stage: Path | None = None  # the staging directory of a run that replaces the previous one (create_out_dir)
    fresh: bool = False  # the directory was new (or empty) when the lock was taken: all in it is this run's
    failed: bool = False  # the run failed (mark_failed): a fresh directory is emptied when the lock is given back
    committed: bool = False  # the run finished (commit_out_dir): nothing of it is removed


def _key(path: Path) -> str:
    return os.path.realpath(path)


def run_entries(path: Path) -> list[Path]:
    """The entries of a run directory, less the lock file."""
    return sorted(p for p in Path(path).iterdir() if p.name != LOCK_FILE)


def _holder(lock: Path) -> dict:
    try:
        data = json.loads(lock.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _acquire(path: Path, *, implicit: bool = False, overwrite: bool = False, command: str | None = None) -> _Claim:
    import socket
    import time

    try:
        import fcntl
    except ImportError:  # no flock (Windows): the PID in the file is all there is
        fcntl = None
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    fresh = created or not run_entries(path)
    lock = Path(_key(path)) / LOCK_FILE
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~_UMASK)
        except OSError as e:  # e.g. the lock file of another user's run
            raise PoslensError(f"--out {path}: cannot open its lock file {lock} ({e.strerror}); choose another "
                               "--out.") from None
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                held = _holder(lock)
                if held.get("pid") not in (None, os.getpid()) and pid_alive(int(held["pid"])):
                    raise BlockingIOError
        except BlockingIOError:
            os.close(fd)
            h = _holder(lock)
            who = f"PID {h.get('pid', '?')}" + (f" on {h['host']}" if h.get("host") else "") + \
                (f", `poslens {h['command']}`" if h.get("command") else "")
            raise PoslensError(f"--out {path} is being written by another poslens process ({who}); wait for it to "
                               "finish, stop it, or choose another --out.") from None
        except BaseException:
            os.close(fd)
            raise
        # the lock file may have been removed (and made anew) by its previous holder in between
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    # a holder that died left its record behind (its flock went with it): the lock is taken over
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                              "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode() + b"\n", 0)
    claim = _Claim(fd, lock, created, overwrite, fresh=fresh)
    if implicit:
        claim.implicit = 1
    else:
        claim.explicit = 1
    _claims[str(lock.parent)] = claim
    return claim


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_failed(out: str | os.PathLike | None) -> None:
    """Mark the run writing ``out`` as failed (an error, not an interrupt nor a :class:`Resumable` failure,
    which keep their checkpoints): when the last hold is given back, a directory that was new or empty when the run took
    it is emptied again (and removed if the run made it), so a plain rerun is not refused. A run that
    finished (:func:`poslens.rundir.outdir.commit_out_dir`) or that writes into a directory holding an
    earlier run is left as it is."""
    import sys

    from poslens.errors import Interrupted, Resumable

    if out is None or isinstance(sys.exc_info()[1], (Interrupted, Resumable)):  # an interrupt, or a failure that
        # leaves checkpoints to resume from (a lost rank), unwinds: kept
        return
    claim = _claims.get(_key(Path(out)))
    if claim is not None:
        claim.failed = True


def lock_out_dir(out: str | os.PathLike, *, command: str | None = None, overwrite: bool = False) -> Path:
    """Take the lock of run directory ``out`` (creating the directory to hold it) for this process;
    returns its absolute path (for :func:`unlock_out_dir`).

    A second live process is refused with a :class:`PoslensError` naming the holder; the lock of a
    process that died is taken over. Holds nest within one process (give each back with
    :func:`unlock_out_dir`). With ``overwrite`` the directory's files are removed once the run
    starts writing (:func:`create_out_dir`, or the commit of :func:`staged_dir`), not before, so a
    command refused later leaves the previous run intact. When the last hold is given back, the lock
    file is removed, and so is the directory if it was made for the lock and is still empty."""
    path = Path(out)
    claim = _claims.get(_key(path))
    if claim is None:
        _acquire(path, overwrite=overwrite, command=command)
    else:
        claim.explicit += 1
        claim.overwrite = claim.overwrite or overwrite
    return Path(_key(path))  # absolute: gives the hold back even after a change of directory


def unlock_out_dir(out: str | os.PathLike) -> None:
    """Give back one :func:`lock_out_dir` hold on ``out`` (nothing if this process holds none)."""
    claim = _claims.get(_key(Path(out)))
    if claim is not None and claim.explicit:
        claim.explicit -= 1
        _maybe_release(claim)


def release_out_dir(out: str | os.PathLike) -> None:
    """Give back the hold :func:`create_out_dir` took itself (nothing if it took none)."""
    claim = _claims.get(_key(Path(out)))
    if claim is not None and claim.implicit:
        claim.implicit -= 1
        _maybe_release(claim)


def _maybe_release(claim: _Claim) -> None:
    if claim.explicit or claim.implicit:
        return
    path = claim.lock.parent
    del _claims[str(path)]
    if claim.stage is not None:  # a replacing run that did not finish: the previous run stays as it was
        shutil.rmtree(claim.stage, ignore_errors=True)
    if claim.failed and claim.fresh and not claim.committed:  # a failed run into a new --out: nothing half-written
        for p in run_entries(path):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
    try:
        try:
            if os.stat(claim.lock).st_ino == os.fstat(claim.fd).st_ino:
                os.unlink(claim.lock)
        except FileNotFoundError:
            pass
    finally:
        os.close(claim.fd)
    if claim.created:
        try:
            path.rmdir()  # only when empty: a command refused before it wrote anything leaves no --out
        except OSError:
            pass


@contextlib.contextmanager
def out_dir_lock(out: str | os.PathLike, *, command: str | None = None, overwrite: bool = False) -> Iterator[Path]:
    """:func:`lock_out_dir` for the ``with`` block; given back however the block ends."""
    path = lock_out_dir(out, command=command, overwrite=overwrite)
    try:
        yield path
    except Exception:
        mark_failed(path)
        raise
    finally:
        unlock_out_dir(path)
