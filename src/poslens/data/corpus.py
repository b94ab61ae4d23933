"""Text corpora. The built-in default is the Python standard library's own source files.

``load_texts(spec)`` understands:

- ``"stdlib"``: every ``*.py`` file under the running interpreter's standard library (found via
  ``sysconfig``; site-packages and test data excluded), in sorted order so runs are reproducible;
- a ``.txt`` (or any text) file: its whole content as one document;
- a ``.jsonl`` file: one document per line, from its ``text`` field;
- a directory: every ``.txt``, ``.md``, ``.py`` and ``.jsonl`` file below it, sorted.

Pre-tokenised data (``input_ids``), random tokens and ``datasets`` directories are sequence
sources rather than texts; the capture engine handles those.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Callable, Iterator

from poslens.errors import PoslensError

TEXT_SUFFIXES = (".txt", ".md", ".py", ".jsonl", ".rst")


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_source_files(limit: int | None = None) -> list[Path]:
    """Sorted ``*.py`` files of the standard library, without site-packages and test suites."""
    root = stdlib_dir()
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
    files = sorted(p for p in root.rglob("*.py") if not (set(p.relative_to(root).parts[:-1]) & skip))
    if not files:
        raise PoslensError(f"no Python sources found under the standard library at {root}; pass --data FILE instead.")
    return files[:limit] if limit else files


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def iter_jsonl(path: Path, accept: Callable[[dict], bool] = lambda obj: True,
               need: str = "a JSON object") -> Iterator[dict]:
    """Yield the JSON objects of a JSONL file; blank lines are skipped.

    A line that is not JSON (or not UTF-8), an object ``accept`` rejects, or an ``input_ids`` list
    that holds anything but non-negative integers raises a :class:`PoslensError` naming the file
    and line and saying that each line needs ``need``.
    """
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                raise PoslensError(f"{path}:{n}: not UTF-8 text (byte {e.start}); JSONL files are UTF-8.") from None
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PoslensError(f"{path}:{n}: not valid JSON ({e.msg}); each line must be one JSON object.") from None
            if not isinstance(obj, dict) or not accept(obj):
                raise PoslensError(f"{path}:{n}: each JSONL line needs {need}.")
            ids = obj.get("input_ids")
            if isinstance(ids, list):
                bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0]
                if bad:
                    raise PoslensError(f"{path}:{n}: input_ids holds {bad[0]!r}; token ids are non-negative integers.")
            yield obj


def _jsonl_texts(path: Path) -> Iterator[str]:
    for obj in iter_jsonl(path, lambda o: isinstance(o.get("text"), str), 'a string "text" field'):
        yield obj["text"]


def iter_texts(spec: str | Path, limit_files: int | None = None) -> Iterator[str]:
    """Yield documents from a corpus spec (see module docstring); errors name the bad path."""
    if str(spec) == "stdlib":
        for p in stdlib_source_files(limit_files):
            yield _read_text(p)
        return
    path = Path(spec)
    if not path.exists():
        raise PoslensError(f"corpus {path} does not exist; pass 'stdlib', a text/JSONL file or a directory.")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if limit_files:
            files = files[:limit_files]
    else:
        files = [path]
    for f in files:
        if f.suffix == ".jsonl":
            yield from _jsonl_texts(f)
        else:
            yield _read_text(f)


def load_texts(spec: str | Path, limit_files: int | None = None, min_chars: int = 1) -> list[str]:
    """All documents of a corpus as a list; raises if there is no text at all."""
    texts = [t for t in iter_texts(spec, limit_files) if len(t) >= min_chars]
    if not texts or not any(t.strip() for t in texts):
        raise PoslensError(f"corpus {spec} holds no text; pass a non-empty file or directory.")
    return texts
