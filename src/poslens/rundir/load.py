"""The one reader of run directories: :func:`load_run` -> :class:`Run`."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path, PurePosixPath

from poslens.conventions import MAX_COUNT, MAX_SEQ_LEN
from poslens.errors import PoslensError
from poslens.rundir.io import safetensors_shapes
from poslens.rundir.io import read_manifest
from poslens.rundir.summary import figure_caption, figure_role, normalize_figures

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


#: the counts a run directory's config.json and summary.json state, and the largest each may be
_COUNTS = {"seq_len": MAX_SEQ_LEN, "num_seqs": MAX_COUNT, "num_layers": MAX_COUNT, "num_heads": MAX_COUNT,
           "head_dim": MAX_COUNT, "noise_groups": MAX_COUNT, "batch_size": MAX_COUNT, "samples": MAX_COUNT}


def _check_what_it_says(path: Path, name: str, data: dict) -> None:
    """Refuse a run whose ``name`` (config.json, summary.json) states a count that is not a whole number
    in range, or (summary.json) a ``layers`` entry that is not a layer, naming the file and the field:
    a reader would otherwise compute with it (a sequence length of 10^23 never finishes) or drop the
    layer without a word."""
    again = "the run is damaged: rerun the command that wrote it"
    for key, most in _COUNTS.items():
        v = data.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= most:
            shown = json.dumps(v)[:40]
            raise PoslensError(f"{path / name}: field {key!r} is {shown}, not a whole number from 0 to {most:,}; "
                               f"{again}.")
    if name != "summary.json" or "layers" not in data:
        return
    layers = data["layers"]
    if not isinstance(layers, list):
        raise PoslensError(f"{path / name}: field 'layers' is a {type(layers).__name__}, not a list of layers; {again}.")
    seen = set()
    for i, l in enumerate(layers):
        v = l.get("layer") if isinstance(l, dict) else None
        ok = v == "embeddings" or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_COUNT)
        if not ok or v in seen:
            what = "a repeated layer" if ok else (f"layer {json.dumps(v)[:40]}" if isinstance(l, dict)
                                                  else f"a {type(l).__name__}")
            raise PoslensError(f"{path / name}: field 'layers' entry {i} is {what}, not one layer (a number from 0, "
                               f"or \"embeddings\"); {again}.")
        seen.add(v)


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
        if not f.is_file():  # a folder (or another non-file) where the tensors should be
            raise PoslensError(f"{f} is not a file; {again}.")
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
        _check_what_it_says(path, "config.json", config)
        _check_what_it_says(path, "summary.json", summary)
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
