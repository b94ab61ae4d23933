"""Find and load run directories for the report.

A *run* is one directory poslens wrote:

- a command's run directory: ``config.json`` with a ``"command"`` key (simulate, scan, panels,
  slash, ...) and ``summary.json``;
- a model directory (``poslens train`` / the zoo): a Hugging Face ``config.json`` (``model_type``)
  and usually ``summary.json`` / ``train_log.jsonl``;
- a reproduction folder (``poslens reproduce``): ``index.json`` with an ``experiments`` list.

Any other directory is a *container* when run directories lie below it (a demo or zoo output
folder, say); it is expanded into those. Everything else is an error that names the directory.
"""

from __future__ import annotations

from pathlib import Path

from poslens.errors import PoslensError
from poslens.rundir.load import Run, classify, load_run

#: how deep a container is searched for run directories
MAX_DEPTH = 3
#: a folder that is not itself a run (nor a poslens container) and holds more runs than this is an
#: ambiguous search (``poslens report /tmp``): refused unless ``allow_many``
MAX_FOUND = 5
#: files that mark a folder written by poslens to hold runs (a demo, a zoo): never ambiguous
CONTAINER_MARKERS = ("demo.json", "zoo.json")
#: sub-directories never searched: training checkpoints, staging folders of atomic writes
_SKIP_PREFIXES = (".", "checkpoint-", "__")


def _children(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(_SKIP_PREFIXES))
    except OSError:
        return []


def expand(path: Path, depth: int = MAX_DEPTH) -> tuple[list[Path], list[str]]:
    """Run directories at or below ``path``; returns ``(run_paths, skipped)``.

    ``skipped`` lists, as sentences, directories that looked like unfinished runs.
    """
    kind = classify(path)
    if kind is not None:
        if kind == "command" and not (path / "summary.json").is_file():
            return [], [f"{path}: unfinished run (no summary.json)"]
        return [path], []
    if depth <= 0:
        return [], []
    runs: list[Path] = []
    skipped: list[str] = []
    for child in _children(path):
        r, s = expand(child, depth - 1)
        runs += r
        skipped += s
    return runs, skipped


def collect(paths: list[str | Path], *, allow_many: bool = False) -> tuple[list[Run], list[str]]:
    """Load every given run directory, expanding containers; returns ``(runs, skipped)``.

    A path given explicitly that is neither a run directory nor holds any raises
    :class:`PoslensError` naming it; so does an explicitly given unfinished run, and (unless
    ``allow_many``) a folder that is no poslens container yet holds more than :data:`MAX_FOUND`
    runs: a search that bundles unrelated runs.
    """
    if not paths:
        raise PoslensError("no run directories given; pass one or more RUN_DIRs (or a folder that holds them).")
    runs: list[Run] = []
    skipped: list[str] = []
    seen: set[Path] = set()
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise PoslensError(f"{p} does not exist; pass run directories written by poslens commands.")
        if not p.is_dir():
            raise PoslensError(f"{p} is a file; pass the run directory that holds config.json and summary.json.")
        if classify(p) is not None:
            found, skip = [p], []
        else:
            found, skip = expand(p)
            marked = any((p / m).is_file() for m in CONTAINER_MARKERS)
            if len(found) > MAX_FOUND and not marked and not allow_many:
                shown = ", ".join(str(f) for f in found[:4])
                raise PoslensError(f"{p} is not a run directory and holds {len(found)} runs up to {MAX_DEPTH} levels "
                                   f"below it ({shown}, ...); pass the run directories you mean, or --all to "
                                   "include every one.")
            if not found:
                if skip:
                    raise PoslensError(f"{p} holds only unfinished runs ({'; '.join(skip)}); finish or resume them.")
                load_run(p)  # raises the "not a run directory" error naming p
        skipped += skip
        for f in found:
            key = f.resolve()
            if key in seen:
                continue
            seen.add(key)
            runs.append(load_run(f))
    _name_runs(runs)
    return runs, skipped


def _name_runs(runs: list[Run]) -> None:
    """Short unique display names: the directory name, with parents added where names clash."""
    parts = {id(r): r.path.resolve().parts for r in runs}
    # a fingerprint's scans (OUT/scans/<model>/text|random) are named by their model first
    depth = {id(r): 2 if len(parts[id(r)]) > 2 and parts[id(r)][-3] == "scans" and parts[id(r)][-1] in
             ("text", "random") else 1 for r in runs}
    for _ in range(8):
        names: dict[str, list[Run]] = {}
        for r in runs:
            names.setdefault("/".join(parts[id(r)][-depth[id(r)]:]), []).append(r)
        clash = [rs for rs in names.values() if len(rs) > 1]
        if not clash:
            break
        for rs in clash:
            for r in rs:
                depth[id(r)] = min(depth[id(r)] + 1, len(parts[id(r)]))
    for r in runs:
        r.name = "/".join(parts[id(r)][-depth[id(r)]:])
