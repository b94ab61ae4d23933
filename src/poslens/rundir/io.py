"""Atomic writes: every file goes to a temporary file in the same directory and is renamed into place
(JSON, safetensors, bytes), under the process's umask; the library versions a run records."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import platform
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping

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


def make_shareable(path: Path) -> None:
    """Give ``path`` the modes of every other file poslens writes (0644 / 0755 under the usual umask):
    mkdtemp and mkstemp create temporary folders and files private (0700 / 0600)."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_UMASK)


def _atomic_write(path: Path, write: Callable[[str], None], exclusive: bool = False) -> None:
    """Write ``path`` all-or-nothing: ``write(tmp)`` fills a temporary file next to it, which is then
    fsynced, made world-readable (mkstemp creates 0600; results are meant to be shared) and renamed.
    ``exclusive``: ``path`` must not exist when the file is put in place (a hard link, which fails where
    another writer made ``path`` meanwhile): :class:`FileExistsError` then, and ``path`` is left as it is."""
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
        if exclusive:
            _link_new(tmp, path)
        else:
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


def _link_new(tmp: str, path: Path) -> None:
    """Put ``tmp`` in place as ``path`` only where ``path`` does not exist (FileExistsError otherwise);
    ``tmp`` is removed. On a file system without hard links, the check and the rename are two steps."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if path.exists():
            raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


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


def _atomic_write_bytes(path: Path, data: bytes, exclusive: bool = False) -> None:
    _atomic_write(path, lambda tmp: Path(tmp).write_bytes(data), exclusive)


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


# the manifest: the files poslens wrote into a run directory
#: the run directories this process holds (real path -> its lock's claim, :mod:`poslens.rundir.lock`)
_claims: dict = {}

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
