"""Where a model comes from: a local Hugging Face directory or a ``.gguf`` file.

Every command that takes a model resolves its argument with :func:`resolve_model` into a
:class:`ModelSource`. A directory is used as it is. A GGUF file (llama.cpp's format, how most
locally run models are held) is

1. checked without loading anything: magic, version, metadata, tensor table, and that the file
   holds every tensor's bytes (a truncated download fails here), and that its architecture is
   one transformers can dequantise *and* poslens has an adapter for;
2. dequantised once, through transformers' GGUF loader (``from_pretrained(dir, gguf_file=...)``,
   package ``gguf``), into a content-addressed cache directory
   ``$POSLENS_CACHE/gguf/<sha256>/`` (default ``~/.cache/poslens``): ``config.json``,
   ``model.safetensors`` (float32: the dequantiser yields float32 and every quantised value is
   exactly representable in it), tokenizer files and ``poslens_source.json``.

The cache directory is written into a staging directory and renamed into place under a file lock,
so concurrent processes (``torchrun`` ranks, two commands) dequantise once and never see a
half-written directory; later commands load the cached directory like any model directory.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import json
import logging
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from poslens.capture.model.adapters import ADAPTERS
from poslens.errors import PoslensError
from poslens.rundir.io import safetensors_shapes, versions, write_json
from poslens.runtime import cache_root, no_hf_progress_bars

GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "poslens_source.json"

#: GGUF ``general.architecture`` -> transformers ``model_type`` where the names differ
#: (transformers' GGUF loader renames these the same way).
_GGUF_RENAMES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen2moe": "qwen2_moe",
                 "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}


# --------------------------------------------------------------------------------------------
# the cache (its root, cache_root, is poslens.runtime's)
# --------------------------------------------------------------------------------------------
_SHA_MEMO: dict[tuple, str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file (memoised per process on path, size and modification time)."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _SHA_MEMO[key] = h.hexdigest()
    return _SHA_MEMO[key]


# --------------------------------------------------------------------------------------------
# reading a GGUF header (no tensors loaded)
# --------------------------------------------------------------------------------------------
@dataclass
class GGUFHeader:
    version: int
    metadata: dict  # scalar and string values; arrays are summarised as ("array", length)
    tensor_count: int
    data_start: int  # absolute offset of the tensor data section
    data_end: int  # absolute offset one past the last tensor's bytes
    file_size: int

    @property
    def architecture(self) -> str | None:
        a = self.metadata.get("general.architecture")
        return a if isinstance(a, str) else None


class _Reader:
    """Little-endian reader over a file object that turns a short read into a clear error."""

    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self, f, path: Path, size: int):
        self.f, self.path, self.size = f, path, size

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise PoslensError(f"{self.path}: truncated GGUF file (ends at byte {self.size:,} inside its header); "
                               "download or copy it again.")
        return b

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > self.size:
            raise PoslensError(f"{self.path}: corrupt GGUF header (a string of {n:,} bytes in a {self.size:,}-byte "
                               "file); download or copy it again.")
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool = True):
        if vtype in self._SCALARS:
            return self.unpack(self._SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.unpack("<I"), self.unpack("<Q")
            if etype in self._SCALARS:  # skip fixed-size elements in one read
                self.read(struct.calcsize(self._SCALARS[etype]) * n)
            else:
                for _ in range(n):
                    self.value(etype, keep=False)
            return ("array", n)
        raise PoslensError(f"{self.path}: corrupt GGUF header (unknown value type {vtype}); "
                           "download or copy it again.")


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse a GGUF file's header and tensor table and check that the file holds every tensor.

    Raises :class:`PoslensError` for a file that is not GGUF, a GGUF version this reader does not
    know, and a truncated or corrupt file. Reads only the header (fast, no tensor data)."""
    import gguf

    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise PoslensError(f"{p}: not a GGUF file (it does not start with the bytes 'GGUF'); pass a model "
                               "directory or a .gguf file written by llama.cpp's tools.")
        r = _Reader(f, p, size)
        version = r.unpack("<I")
        if version not in (2, 3):
            raise PoslensError(f"{p}: GGUF version {version} is not supported (2 and 3 are); convert the file "
                               "with a current llama.cpp.")
        n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.unpack("<I"))
        align = int(meta.get("general.alignment", 32) or 32)
        end = 0
        for _ in range(n_tensors):
            r.string()  # name
            n_dims = r.unpack("<I")
            if n_dims > 8:
                raise PoslensError(f"{p}: corrupt GGUF tensor table ({n_dims} dimensions); download it again.")
            dims = [r.unpack("<Q") for _ in range(n_dims)]
            ttype, offset = r.unpack("<I"), r.unpack("<Q")
            try:
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
            except (ValueError, KeyError):
                raise PoslensError(f"{p}: tensor type {ttype} is unknown to the installed gguf package; "
                                   "upgrade it (pip install -U gguf).") from None
            n = 1
            for d in dims:
                n *= d
            end = max(end, offset + n // block * type_size)
        start = f.tell()
        start += (-start) % align
    hdr = GGUFHeader(version=version, metadata=meta, tensor_count=n_tensors, data_start=start, data_end=start + end,
                     file_size=size)
    if hdr.data_end > size:
        raise PoslensError(f"{p}: truncated GGUF file ({size:,} bytes, its tensors need {hdr.data_end:,}); "
                           "download or copy it again.")
    return hdr


def gguf_model_type(header: GGUFHeader) -> str | None:
    """The transformers ``model_type`` a GGUF file dequantises to (None when it names no architecture)."""
    arch = header.architecture
    if arch is None:
        return None
    if arch == "llama" and "mistral" in str(header.metadata.get("general.name", "")).lower():
        return "mistral"
    return _GGUF_RENAMES.get(arch, arch)


def supported_gguf_architectures() -> list[str]:
    """GGUF architectures poslens can open: those transformers' GGUF loader dequantises whose model
    type has a poslens adapter (read at call time: adapters are added over time)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    out = []
    for arch in GGUF_SUPPORTED_ARCHITECTURES:
        if arch in ("general", "tokenizer"):
            continue
        if _GGUF_RENAMES.get(arch, arch) in ADAPTERS:
            out.append(arch)
    return sorted(out)


def check_gguf(path: str | os.PathLike) -> GGUFHeader:
    """:func:`read_gguf_header` plus the architecture check; nothing is loaded or written."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    p = Path(path)
    hdr = read_gguf_header(p)
    arch, mt = hdr.architecture, gguf_model_type(hdr)
    supported = ", ".join(supported_gguf_architectures()) or "none"
    if arch is None:
        raise PoslensError(f"{p}: the GGUF metadata has no general.architecture; poslens opens GGUF models of "
                           f"architectures {supported}.")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and mt not in GGUF_SUPPORTED_ARCHITECTURES:
        raise PoslensError(f"{p}: GGUF architecture {arch!r} cannot be dequantised by the installed transformers; "
                           f"poslens opens GGUF models of architectures {supported}.")
    if mt not in ADAPTERS:
        raise PoslensError(f"{p}: GGUF architecture {arch!r} (model type {mt!r}) has no poslens adapter; poslens "
                           f"opens GGUF models of architectures {supported}.")
    return hdr


# --------------------------------------------------------------------------------------------
# the resolver
# --------------------------------------------------------------------------------------------
@dataclass
class ModelSource:
    """A resolved model argument: ``kind`` is ``dir`` or ``gguf``; ``path`` what the user passed
    (resolved); ``sha256`` the GGUF file's hash (None for a directory)."""

    kind: str
    path: Path
    sha256: str | None = None
    header: GGUFHeader | None = None

    @property
    def cache_dir(self) -> Path | None:
        return cache_root() / "gguf" / self.sha256 if self.kind == "gguf" else None

    @property
    def is_cached(self) -> bool:
        return self.kind == "dir" or _cache_intact(self.cache_dir)

    def describe(self) -> dict:
        """What ``config.json`` of a run records about its model."""
        if self.kind == "dir":
            return {"kind": "dir", "path": str(self.path)}
        return {"kind": "gguf", "path": str(self.path), "sha256": self.sha256,
                "gguf_architecture": self.header.architecture if self.header else None,
                "dequantised_dir": str(self.cache_dir), "dequantised_dtype": "float32"}

    def directory(self, progress: bool = True) -> Path:
        """A loadable Hugging Face directory: the directory itself, or the GGUF's dequantised cache
        (created on first use)."""
        if self.kind == "dir":
            return self.path
        if not self.is_cached:
            dequantise_gguf(self, progress=progress)
        return self.cache_dir


def is_gguf_path(model: str | os.PathLike) -> bool:
    p = Path(model)
    return p.suffix.lower() == ".gguf" or (p.is_file() and _starts_with_magic(p))


def _starts_with_magic(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


_RESOLVED: dict[tuple, ModelSource] = {}


def resolve_model(model: str | os.PathLike) -> ModelSource:
    """Resolve a model argument. A ``.gguf`` file (or any file starting with the GGUF magic) is
    checked (:func:`check_gguf`) and hashed; anything else is taken as a model directory (its own
    checks are in :func:`poslens.capture.model.load.check_model_dir`). Loads and writes nothing."""
    p = Path(model).expanduser()
    if not is_gguf_path(p):
        return ModelSource("dir", p)
    if not p.exists():
        raise PoslensError(f"MODEL {p} does not exist; pass a local model directory or a .gguf file.")
    if p.is_dir():
        raise PoslensError(f"MODEL {p} is a directory named .gguf; pass the .gguf file itself or a model directory.")
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _RESOLVED:
        hdr = check_gguf(p)
        _RESOLVED[key] = ModelSource("gguf", p.resolve(), file_sha256(p), hdr)
    return _RESOLVED[key]


def model_directory(model: str | os.PathLike, progress: bool = True) -> Path:
    """``resolve_model(model).directory()``: the loadable directory of any model argument."""
    return resolve_model(model).directory(progress=progress)


def source_record(model: str | os.PathLike) -> dict:
    """The ``model_source`` entry of a run's ``config.json``."""
    return resolve_model(model).describe()


#: transformers' loggers (the weight-loading report, a table of missing and mismatched keys, and the
#: loader's warnings are logged under this name)
_LOAD_LOGGERS = ("transformers",)


#: True while transformers' load reports should be shown (``poslens --verbose``, set for one command)
SHOW_LOAD_REPORTS: contextvars.ContextVar[bool] = contextvars.ContextVar("poslens_show_load_reports", default=False)


@contextlib.contextmanager
def quiet_hf_loading(verbose: bool = False) -> Iterator[None]:
    """Transformers' load report, its warnings and its "Loading weights" bar off inside the block (unless
    ``verbose`` or ``poslens --verbose``): the report is tens of lines, and poslens says in one line what
    is wrong. The loggers' levels and the bars' setting are restored."""
    if verbose or SHOW_LOAD_REPORTS.get():
        yield
        return
    loggers = [logging.getLogger(name) for name in _LOAD_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with no_hf_progress_bars():
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)



# --------------------------------------------------------------------------------------------
# dequantisation
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except ImportError:  # no flock (Windows): the rename below still keeps the cache consistent
            pass
        yield


def _cache_intact(target: Path) -> bool:
    """Whether a GGUF's dequantised cache is whole: its config.json and weights, none cut short or
    damaged (reads the headers only). A damaged cache is dequantised again."""
    if not (target / "config.json").is_file():
        return False
    weights = sorted(target.glob("*.safetensors"))
    try:
        for f in weights:
            safetensors_shapes(f)
    except (PoslensError, OSError):
        return False
    return bool(weights)


def dequantise_gguf(src: ModelSource, progress: bool = True) -> Path:
    """Dequantise ``src`` (a GGUF source) into its cache directory; returns it. Idempotent and
    safe under concurrency (file lock + staging directory + rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = src.cache_dir
    with _file_lock(target.parent / f".{src.sha256}.lock"):
        if _cache_intact(target):  # another process finished it while we waited
            return target
        stage = Path(tempfile.mkdtemp(prefix=f".{src.sha256}.partial-", dir=target.parent))
        try:
            folder, name = str(src.path.parent), src.path.name
            try:
                # transformers' tensor bar ("Converting and de-quantizing") is a plain tqdm on stderr
                with no_hf_progress_bars(not progress), quiet_hf_loading(), \
                        (contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())):
                    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
            except (ValueError, KeyError, RuntimeError, NotImplementedError, TypeError) as e:
                detail = " ".join(str(e).split())
                if "ignore_mismatched_sizes" in detail or "size mismatch" in detail:
                    detail = ("its tensors' shapes do not match the architecture its metadata describes; the file "
                              "is damaged or was written by a faulty converter")
                raise PoslensError(f"{src.path}: transformers could not dequantise this GGUF file "
                                   f"({type(e).__name__}: {detail[:200]}).") from None
            # the loaded tensors are plain float32; only the quantizer record blocks save_pretrained
            model.hf_quantizer = None
            for obj in (model.config, getattr(model, "generation_config", None)):
                if obj is not None and hasattr(obj, "quantization_config"):
                    delattr(obj, "quantization_config")
            if hasattr(model, "is_quantized"):
                with contextlib.suppress(AttributeError):
                    model.is_quantized = False
            with no_hf_progress_bars(not progress), quiet_hf_loading():
                model.save_pretrained(str(stage), safe_serialization=True)
            del model
            try:
                with quiet_hf_loading(), \
                        (contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())):
                    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
                tok.save_pretrained(str(stage))
                tokenizer = True
            except Exception:  # noqa: BLE001 - a model without a usable tokenizer still scans random tokens
                tokenizer = False
            name = src.header.metadata.get("general.name") if src.header else None
            write_json(stage / SOURCE_FILE, {**src.describe(), "name": name if isinstance(name, str) else None,
                                             "tokenizer": tokenizer, "versions": versions()})
            for f in [stage, *stage.iterdir()]:  # mkdtemp/mkstemp make 0700/0600: a shared cache must be readable
                os.chmod(f, 0o755 if f.is_dir() else 0o644)
            if target.exists():  # a stale partial target (should not happen: renames are atomic)
                shutil.rmtree(target)
            os.replace(stage, target)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return target


def model_names(models: Iterable[str], names: Iterable[str] | None = None) -> list[str]:
    """A short unique name per model path: ``names`` where the caller gives them (checked: one per model,
    unique, safe as a directory name), else :func:`model_name` of each (``-2``, ``-3`` ... appended to
    repeats)."""
    models = [str(m) for m in models]
    if names is not None:
        names = [n for n in names]
        if len(names) != len(models):
            raise PoslensError(f"names=: {len(names)} names for {len(models)} models; pass one name per model.")
        for n in names:
            if not isinstance(n, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n):
                raise PoslensError(f"names=: {n!r} is not a usable name; use letters, digits, '.', '_' and '-' "
                                   "(it names a directory of the run and the keys of its maps).")
        if len(set(names)) != len(names):
            raise PoslensError(f"names=: {names} repeats a name; give each model its own.")
        return names
    out: list[str] = []
    for m in models:
        base = model_name(m)
        name, n = base, 1
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.append(name)
    return out


def model_name(model: str) -> str:
    """A model's short name, safe as a directory name: a ``.gguf`` file's stem; for poslens's own
    dequantised cache of a GGUF (a directory named by the file's hash) the stem of the GGUF it was made
    from, else the GGUF's ``general.name``; for another directory named by a hash, its config's
    ``_name_or_path``; else a directory's name; a loaded model's ``name_or_path`` named the same way
    (its class where it has none)."""
    m = str(model)
    if m.startswith("<in-memory"):  # "<in-memory Class: name_or_path>": the name, else the class
        cls, _, origin = m[len("<in-memory "):-1].partition(": ")
        origin = origin.rsplit(" #", 1)[0]  # a repeated model's "#2"
        base = model_name(origin) if origin and origin != "unnamed" else cls
    else:
        p = Path(m)
        base = p.stem if p.suffix.lower() == ".gguf" else (_cached_gguf_name(p) or _config_name(p) or p.name or str(p))
    return re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._") or "model"


def _config_name(path: Path) -> str | None:
    """A directory named by a hash (a Hugging Face cache snapshot): the model's name its config.json records
    (``_name_or_path``, e.g. ``HuggingFaceTB/SmolLM2-135M``: ``SmolLM2-135M``), where it names something else."""
    if not re.fullmatch(r"[0-9a-f]{32,}", path.name):
        return None
    try:
        name = json.loads((path / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(name, str) or not name.strip() or re.fullmatch(r"[0-9a-f]{32,}", Path(name).name):
        return None
    return Path(name.rstrip("/")).name or None


def _cached_gguf_name(path: Path) -> str | None:
    """The name of the GGUF a dequantised cache directory was made from (its record names the file)."""
    record = path / SOURCE_FILE
    try:
        rec = json.loads(record.read_text()) if record.is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("kind") != "gguf":
        return None
    if isinstance(rec.get("path"), str) and rec["path"]:
        return Path(rec["path"]).stem
    return rec.get("name") if isinstance(rec.get("name"), str) else None
