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

import json
from dataclasses import dataclass, field
from pathlib import Path

from poslens.errors import PoslensError

#: how deep a container is searched for run directories
MAX_DEPTH = 3
#: sub-directories never searched: training checkpoints, staging folders of atomic writes
_SKIP_PREFIXES = (".", "checkpoint-", "__")


@dataclass
class Run:
    """One loaded run directory."""

    path: Path
    kind: str  # "command" | "model" | "reproduce"
    command: str  # config["command"], "train" for models, "reproduce" for reproduction folders
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    index: dict = field(default_factory=dict)  # reproduction folders: index.json
    name: str = ""  # display name, unique within one report
    display_path: str | None = None  # path shown on the page (default: path)

    @property
    def paper(self) -> str | None:
        p = self.summary.get("paper")
        return p if isinstance(p, str) else None


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


def load_run(path: str | Path) -> Run:
    """Load one run directory; raises :class:`PoslensError` naming it when it is not one."""
    path = Path(path)
    if not path.exists():
        raise PoslensError(f"{path} does not exist; pass run directories written by poslens commands.")
    if not path.is_dir():
        raise PoslensError(f"{path} is a file; pass the run directory that holds config.json and summary.json.")
    kind = classify(path)
    if kind == "reproduce":
        index = _read_json_dict(path / "index.json")
        return Run(path, "reproduce", "reproduce", index=index)
    if kind == "command":
        config = _read_json_dict(path / "config.json")
        if not (path / "summary.json").is_file():
            raise PoslensError(f"{path} has no summary.json: the `{config.get('command')}` run has not finished; "
                               "resume it (--resume) or pass another directory.")
        return Run(path, "command", str(config.get("command")), config=config,
                   summary=_read_json_dict(path / "summary.json"))
    if kind == "model":
        config = _read_json_dict(path / "config.json")
        summary = _read_json_dict(path / "summary.json") if (path / "summary.json").is_file() else {}
        train_cfg = path / "train_config.json"
        if train_cfg.is_file():
            config = {**config, "_train_config": _read_json_dict(train_cfg)}
        return Run(path, "model", "train", config=config, summary=summary)
    raise PoslensError(f"{path} is not a poslens run directory (no config.json with a \"command\", no model "
                       "config.json, no reproduction index.json) and holds none below it.")


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


def collect(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Load every given run directory, expanding containers; returns ``(runs, skipped)``.

    A path given explicitly that is neither a run directory nor holds any raises
    :class:`PoslensError` naming it; so does an explicitly given unfinished run.
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
    depth = {id(r): 1 for r in runs}
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
