"""Self-describing run directories with atomic writes.

Layout shared by every command that produces results (simulate, scan, train, ...):

- ``config.json``: every option, the seed and the library versions;
- ``*.safetensors``: tensors (float32 on disk, accumulated in float64 in memory);
- ``summary.json``: scalars in one shape for every command (:func:`write_summary`: command,
  paper, layers with explicit indices, tables, figures with captions, null for masked entries);
- ``*.png``: figures.

:func:`load_run` reads any run directory back into a :class:`Run`.

Every write goes to a temporary file in the same directory and is renamed into place, so a
reader never sees a half-written file and an interrupted run leaves the previous version intact.

A run directory records the files poslens wrote into it (``.poslens-files.json``,
:data:`MANIFEST`): ``--overwrite`` removes exactly those and refuses a directory holding anything
else. A run that replaces another is written into a sibling staging directory and swapped in only
once it has succeeded (:func:`staged_dir`, ``create_out_dir(..., staged=True)``), so a failure, a
full disk or Ctrl-C leaves the previous run as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path, PurePosixPath
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise write_error(path, e) from None
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if _is_write_error(e):
            raise write_error(path, e) from None
        raise
    if path.name != MANIFEST:
        _note_written(path)


#: errno values of a write that the user fixes (a full disk, a quota, a read-only or vanished place)
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT,
                 errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EFBIG}


def _is_write_error(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in _WRITE_ERRNOS
    # safetensors reports its file errors as SafetensorError("Error while serializing: I/O error: ...")
    return type(e).__name__ == "SafetensorError" and ("I/O" in str(e) or "IoError" in str(e) or "space" in str(e))


def write_error(path: Path, e: BaseException) -> PoslensError:
    """One line for a write that failed with ``e`` (a full disk, a read-only place...), naming the file."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[-1][:200]
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or "space" in why.lower():
        fix = "free some space there or choose another --out"
    else:
        fix = "choose a writable --out"
    return PoslensError(f"cannot write {path} ({why}); {fix}.")


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


#: bytes per element of the safetensors dtypes
_ST_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
                "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_shapes(path: str | Path, again: str = "download or save it again") -> dict[str, list[int]]:
    """The tensor shapes of a ``.safetensors`` file, from its header; a file cut short (a partial
    download), a damaged header or a tensor whose bytes do not match its shape is refused with a
    :class:`PoslensError` naming the file and saying what to do (``again``). Reads the header only."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else None
        if n is None or n > size - 8:
            raise PoslensError(f"{path}: truncated safetensors file ({size:,} bytes, shorter than its header); "
                               f"{again}.")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise PoslensError(f"{path}: damaged safetensors header (not JSON); {again}.") from None
    if not isinstance(header, dict):
        raise PoslensError(f"{path}: damaged safetensors header (not a JSON object); {again}.")
    shapes, need = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise PoslensError(f"{path}: damaged safetensors header (entry {name!r}); {again}.") from None
        item = _ST_ITEMSIZE.get(dtype)
        if item is not None and end - begin != math.prod(shape) * item:
            raise PoslensError(f"{path}: tensor {name} holds {end - begin:,} bytes but its shape {shape} ({dtype}) "
                               f"needs {math.prod(shape) * item:,}; the file is damaged, {again}.")
        shapes[name] = shape
        need = max(need, end)
    if 8 + n + need > size:
        raise PoslensError(f"{path}: truncated safetensors file ({size:,} bytes, its tensors need {8 + n + need:,}); "
                           f"{again}.")
    return shapes


def read_tensors(path: str | os.PathLike) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


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


def _make_stage(out: Path) -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as e:
        raise write_error(out.parent / f".{out.name}.partial-", e) from None


def commit_out_dir(path: str | os.PathLike) -> None:
    """Swap a run written into the staging directory of :func:`create_out_dir` (``staged``) into
    ``path`` (nothing when it wrote ``path`` itself)."""
    claim = _claims.get(_key(Path(path)))
    if claim is None or claim.stage is None:
        return
    _swap_in(claim.stage, Path(path), replace=claim.overwrite)
    shutil.rmtree(claim.stage, ignore_errors=True)
    claim.stage, claim.overwrite, claim.created = None, False, False


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


_claims: dict[str, _Claim] = {}


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
    claim = _Claim(fd, lock, created, overwrite)
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
    finally:
        unlock_out_dir(path)


#: the record of the files poslens wrote into a run directory: JSON ``{"files": [...]}``, paths relative to
#: the directory with "/" between folders; a path ending in "/" is a folder poslens wrote whole
MANIFEST = ".poslens-files.json"
#: what an interrupted write of poslens leaves behind: the temporary file of an atomic write, the
#: staging folders of a training run's saves and checkpoints
_LEFTOVER = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$|^\.(save|checkpoint)\.[a-z0-9_]{8}$")


def read_manifest(path: str | os.PathLike) -> set[str] | None:
    """The files poslens recorded writing into run directory ``path`` (:data:`MANIFEST`), or None
    when it holds no record (not a run, or a damaged record)."""
    try:
        data = json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files)


def _write_manifest(path: Path, files: set[str]) -> None:
    _atomic_write_bytes(path / MANIFEST, (json.dumps({"files": sorted(files)}, indent=1) + "\n").encode())


def record_written(out: str | os.PathLike, *names: str) -> None:
    """Add ``names`` (relative to run directory ``out``; a folder as ``"name/"``) to the files its
    record says poslens wrote. Files written with :func:`write_json`, :func:`write_tensors` or
    :func:`save_figure` into a directory this process holds are recorded by themselves."""
    out = Path(out)
    own = read_manifest(out) or set()
    if not set(names) <= own:
        _write_manifest(out, own | set(names))


def _note_written(path: Path) -> None:
    """Record ``path`` in the manifest of every run directory this process holds that contains it
    (a run written inside another, such as a fingerprint's scans, belongs to both)."""
    if not _claims:
        return
    _note_enclosing(path, [""])


def _note_enclosing(path: Path, files) -> None:
    """Record ``files`` (relative to ``path``; ``""``: ``path`` itself) in every held run directory
    that strictly contains ``path``."""
    real = os.path.realpath(path)
    for key in list(_claims):
        if real.startswith(key + os.sep):
            rel = PurePosixPath(Path(os.path.relpath(real, key)).as_posix())
            if not any(part.startswith(".") for part in rel.parts):  # staging folders
                record_written(Path(key), *[(rel / f).as_posix() if f else rel.as_posix() for f in files])


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
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.previous-", dir=out.parent)) if old else None
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


def save_figures(out_dir: str | os.PathLike, figures) -> list[dict]:
    """Save ``(file_name, figure, caption)`` triples into ``out_dir``; returns the run-dir contract's
    ``[{"file", "caption"}]`` list for ``summary.json``."""
    saved = []
    for name, fig, caption in figures:
        save_figure(fig, Path(out_dir) / name)
        saved.append({"file": name, "caption": caption})
    return saved


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize=None, **subplots_kw):
    """``(figure, axes)`` like ``pyplot.subplots``, but outside pyplot: no backend is chosen or
    changed and nothing is registered globally, so drawing a poslens figure leaves a notebook's
    matplotlib state as it was (saving to PNG renders with Agg)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **subplots_kw)


def close_figure(fig) -> None:
    """Release a figure: one made by pyplot is closed there; one of :func:`new_figure` is freed by
    the garbage collector and needs nothing."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close(fig)


def figure_png(fig, dpi: int) -> bytes:
    """A figure rendered as PNG bytes (the figure is released)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    close_figure(fig)
    return buf.getvalue()


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """Atomically save a matplotlib figure as PNG and release it."""
    _atomic_write_bytes(Path(path), figure_png(fig, dpi))


# --------------------------------------------------------------------------------------------
# The summary contract: one shape for every command, one reader for every run
# --------------------------------------------------------------------------------------------
#: version of the common summary shape written by :func:`write_summary`
CONTRACT = 1
#: how every ``layers`` list names its entries
LAYER_CONVENTION = ("decoder layers counted from 0 (layer 0 = the first attention layer); "
                    "'embeddings' = the token embeddings before layer 0")

#: captions of the figure files commands write under fixed names (``summary["figures"]`` may
#: also give its own caption per file, which wins)
FIGURE_CAPTIONS = [
    (re.compile(r"^scores(_layers[\d-]+)?_raw\.png$"),
     "Mean pre-softmax attention scores per layer (rows: query position, columns: key position; "
     "the blank upper triangle is masked)."),
    (re.compile(r"^scores(_layers[\d-]+)?_diagnorm\.png$"),
     "Diagonal-normalised scores: each diagonal's mean removed. A purely relative map is uniform here; "
     "structure that remains depends on absolute position."),
    (re.compile(r"^scores(_layers[\d-]+)?_zoom\.png$"),
     "The first 64 query and key positions of the score maps, where attention sinks (key 0) and "
     "slashes (sub-diagonals) live."),
    (re.compile(r"^probs\.png$"), "Mean attention weights (post-softmax) per layer."),
    (re.compile(r"^kim_fig1\.png$"), "Closed-form layer-2 scores of the parameter-free model (alpha = 0, length 3)."),
]
_FIGURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp")

#: what a figure is for, so the report can keep the page short (a summary's own ``role`` wins):
#: ``main`` (shown), ``detail`` (kept in the run directory and named on the page, not shown),
#: ``per-layer`` (the same numbers as the summary's per-layer list, which the report draws as line
#: plots itself), ``zoom`` (a zoom on the first positions: shown only where the map is much larger)
FIGURE_ROLES = [
    (re.compile(r"^probs\.png$"), "detail"),
    (re.compile(r"^cosine_maps_bidirectional\.png$"), "detail"),
    (re.compile(r"^aps_by_layer\.png$"), "per-layer"),
    (re.compile(r"^scores(_layers[\d-]+)?_zoom\.png$"), "zoom"),
]
ROLES = ("main", "detail", "per-layer", "zoom")


def figure_role(name: str) -> str:
    """The standard role of a figure file name (``main`` when none is known)."""
    base = Path(name).name
    return next((role for pat, role in FIGURE_ROLES if pat.match(base)), "main")


def figure_caption(name: str) -> str:
    """The standard caption of a figure file name (its name when none is known)."""
    base = Path(name).name
    for pat, cap in FIGURE_CAPTIONS:
        if pat.match(base):
            return cap
    return base


def normalize_figures(figures: Any = None, files: Any = None) -> list[dict]:
    """``[{"file", "caption", "role"}]`` from a list of names or dicts (or, without one, the image
    files in a ``files`` list); ``role`` as the dict gives it, else :func:`figure_role`."""
    out: list[dict] = []
    if isinstance(figures, list):
        for f in figures:
            if isinstance(f, str):
                out.append({"file": f, "caption": figure_caption(f), "role": figure_role(f)})
            elif isinstance(f, dict) and isinstance(f.get("file"), str):
                role = f.get("role") if f.get("role") in ROLES else figure_role(f["file"])
                out.append({"file": f["file"], "caption": str(f.get("caption") or figure_caption(f["file"])),
                            "role": role})
    elif isinstance(files, list):
        out = [{"file": f, "caption": figure_caption(f), "role": figure_role(f)} for f in files
               if isinstance(f, str) and Path(f).suffix.lower() in _FIGURE_SUFFIXES]
    return out


def envelope(summary: Mapping, *, command: str, paper: str | list[str] | None = None,
             layers_describe: str | None = None, convention: str | None = None) -> dict:
    """``summary`` in the common shape every command writes (keys it already has are kept):

    - ``contract``: :data:`CONTRACT`; ``command``: the command that wrote it;
    - ``paper``: ``"kim"`` (arXiv 2509.21042), ``"slash"`` (arXiv 2601.08297), ``"neighborhood"``
      (arXiv 2501.00073), a list of them (a scan measures all three), or None;
    - ``layers``: a list of per-layer dicts, each with its ``layer`` index (an int, or
      ``"embeddings"``); ``layer_info`` says how indices count and what vectors they describe;
    - ``tables``: ``[{"title", "columns", "rows", "note"}]``; ``figures``: ``[{"file", "caption",
      "role"}]`` (:data:`FIGURE_ROLES`);
    - ``readings``: sentences (may be empty; the report derives them from the numbers);
    - NaN / masked entries as JSON null (every writer goes through :func:`write_json`).
    """
    s = dict(summary)
    s["contract"] = CONTRACT
    s["command"] = command
    if s.get("paper") is None:
        s["paper"] = paper
    layers = s.get("layers")
    s["layers"] = layers if isinstance(layers, list) else []
    info = dict(s.get("layer_info") or {})
    info["convention"] = convention or info.get("convention") or s.get("layer_convention") or LAYER_CONVENTION
    if layers_describe:
        info["describes"] = layers_describe
    info["indices"] = [l.get("layer") for l in s["layers"] if isinstance(l, dict)]
    s["layer_info"] = info
    s["tables"] = [t for t in s["tables"] if isinstance(t, dict)] if isinstance(s.get("tables"), list) else []
    s["figures"] = normalize_figures(s.get("figures"), s.get("files"))
    s.setdefault("readings", [])
    return s


def write_summary(out_dir: str | os.PathLike, summary: Mapping, *, command: str,
                  paper: str | list[str] | None = None, layers_describe: str | None = None,
                  convention: str | None = None) -> dict:
    """Atomically write ``out_dir/summary.json`` in the common shape (:func:`envelope`); returns it."""
    s = envelope(summary, command=command, paper=paper, layers_describe=layers_describe, convention=convention)
    write_json(Path(out_dir) / "summary.json", s)
    return s


#: papers of runs whose summary names none (written before the envelope)
COMMAND_PAPERS = {"scan": ["kim", "slash", "neighborhood"], "simulate": ["kim"]}


@dataclasses.dataclass
class Run:
    """One loaded run directory (see :func:`load_run`)."""

    path: Path
    kind: str  # "command" | "model" | "reproduce"
    command: str  # the writing command; "train" for model directories, "reproduce" for reproduction folders
    config: dict = dataclasses.field(default_factory=dict)
    summary: dict = dataclasses.field(default_factory=dict)
    index: dict = dataclasses.field(default_factory=dict)  # reproduction folders: index.json
    name: str = ""  # display name, unique within one report
    display_path: str | None = None  # path shown on a page (default: path)

    @property
    def paper(self) -> str | None:
        """The run's first (main) paper key, or None."""
        p = self.papers
        return p[0] if p else None

    @property
    def papers(self) -> list[str]:
        """The papers the run measures (``summary["paper"]``; for runs written without it, the
        command's: a scan measures all three, a simulation arXiv 2509.21042)."""
        p = self.summary.get("paper")
        if isinstance(p, str):
            return [p]
        if isinstance(p, list):
            return [x for x in p if isinstance(x, str)]
        return list(COMMAND_PAPERS.get(self.command, []))

    @property
    def layers(self) -> list[dict]:
        """Per-layer dicts (each with ``layer``); empty when the run has none."""
        return [l for l in self.summary.get("layers") or [] if isinstance(l, dict)] \
            if isinstance(self.summary.get("layers"), list) else []

    @property
    def tables(self) -> list[dict]:
        """The summary's well-formed tables (a ``tables`` entry that is not a list counts as none)."""
        tables = self.summary.get("tables")
        return [t for t in tables if isinstance(t, dict) and isinstance(t.get("columns"), list)
                and isinstance(t.get("rows"), list)] if isinstance(tables, list) else []

    @property
    def figures(self) -> list[dict]:
        """``[{"file", "caption"}]``, whichever way an older run listed them."""
        s = self.summary
        if isinstance(s.get("figures"), list) or isinstance(s.get("files"), list):
            return normalize_figures(s.get("figures"), s.get("files"))
        return [{"file": p.name, "caption": figure_caption(p.name), "role": figure_role(p.name)}
                for p in sorted(self.path.glob("*.png"))]


def _read_json_dict(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PoslensError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); the run may be damaged.") from None
    except OSError as e:
        raise PoslensError(f"{path}: cannot be read ({e.strerror}).") from None
    if not isinstance(data, dict):
        raise PoslensError(f"{path}: expected a JSON object, found {type(data).__name__}.")
    return data


def _check_run_files(path: Path, summary: dict) -> None:
    """Refuse a run whose ``.safetensors`` files are cut short or have a damaged header (else a reader
    would drop their maps without a word), naming the file; reads the headers only. (A summary.json
    entry of the wrong shape is skipped by :class:`Run`'s readers, like every odd entry.)"""
    again = "the run is damaged: rerun the command that wrote it"
    own = read_manifest(path)
    # (checkpoints are removed by the run that wrote them once it finishes)
    expected = {f for f in own or () if not f.endswith("/") and not PurePosixPath(f).name.startswith("checkpoint")}
    if own is None and summary.get("command") == "scan":  # a run without a record: a scan always writes its maps
        expected = {"maps.safetensors"}
    missing = sorted(f for f in expected if not (path / f).exists())
    if missing:
        raise PoslensError(f"{path / missing[0]} is missing; {again}.")
    for f in sorted(path.glob("*.safetensors")):
        if f.name.startswith("checkpoint"):  # a scan's resumable state: checked when resumed
            continue
        safetensors_shapes(f, again=again)


def classify(path: Path) -> str | None:
    """``"command"``, ``"model"``, ``"reproduce"`` or None (not a run directory itself)."""
    idx = path / "index.json"
    if idx.is_file():
        try:
            if isinstance(json.loads(idx.read_text()).get("experiments"), list):
                return "reproduce"
        except (json.JSONDecodeError, OSError, AttributeError):
            pass
    cfg = path / "config.json"
    if cfg.is_file():
        try:
            data = json.loads(cfg.read_text())
        except (json.JSONDecodeError, OSError):
            return "command"  # load_run reports the damage, naming the file
        if isinstance(data, dict) and "command" in data:
            return "command"
        if isinstance(data, dict) and "model_type" in data:
            return "model"
    return None


def load_run(path: str | os.PathLike) -> Run:
    """Load any run directory (command run, model directory, reproduction folder) into a :class:`Run`;
    raises :class:`PoslensError` naming it when it is not one."""
    path = Path(path)
    if not path.exists():
        raise PoslensError(f"{path} does not exist; pass run directories written by poslens commands.")
    if not path.is_dir():
        raise PoslensError(f"{path} is a file; pass the run directory that holds config.json and summary.json.")
    kind = classify(path)
    if kind == "reproduce":
        return Run(path, "reproduce", "reproduce", index=_read_json_dict(path / "index.json"))
    if kind == "command":
        config = _read_json_dict(path / "config.json")
        if not (path / "summary.json").is_file():
            raise PoslensError(f"{path} has no summary.json: the `{config.get('command')}` run has not finished; "
                               "resume it (--resume) or pass another directory.")
        summary = _read_json_dict(path / "summary.json")
        _check_run_files(path, summary)
        return Run(path, "command", str(summary.get("command") or config.get("command")), config=config,
                   summary=summary)
    if kind == "model":
        config = _read_json_dict(path / "config.json")
        summary = _read_json_dict(path / "summary.json") if (path / "summary.json").is_file() else {}
        _check_run_files(path, summary)
        train_cfg = path / "train_config.json"
        if train_cfg.is_file():
            config = {**config, "_train_config": _read_json_dict(train_cfg)}
        return Run(path, "model", "train", config=config, summary=summary)
    raise PoslensError(f"{path} is not a poslens run directory (no config.json with a \"command\", no model "
                       "config.json, no reproduction index.json) and holds none below it.")
