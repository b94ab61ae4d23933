"""Scan checkpoints: the float64 sums and the next sequence, written atomically every N batches, so a
killed scan resumed with the same options continues bit-identically (one file per rank under
torchrun). A fingerprint of the options that shape the sums guards against resuming a different scan."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import stats_record
from poslens.capture.scan.options import ScanConfig
from poslens.errors import PoslensError
from poslens.rundir.load import classify
from poslens.rundir.io import read_tensors, safetensors_shapes, write_tensors
from poslens.rundir.staging import written_by


CHECKPOINT = "checkpoint.safetensors"


#: config fields that change the accumulated tensors (a resume must match them exactly)
_FINGERPRINT_FIELDS = ("model_dir", "data", "seq_len", "num_seqs", "batch_size", "seed", "dtype", "layers",
                       "heads", "no_rope_layers", "bidirectional", "chunk_elems", "reservoir", "stats",
                       "aps_max_positions")


def _fingerprint_fields(options) -> dict:
    """The options that shape the sums, normalised as :func:`fingerprint` hashes them; ``options`` is a
    :class:`ScanConfig` or the ``options`` dict of a scan's config.json."""
    get = options.get if isinstance(options, dict) else lambda k, default=None: getattr(options, k, default)
    d = {k: get(k) for k in _FINGERPRINT_FIELDS}
    d["stats"] = stats_record(get("stats"))  # built-in names, then users' statistics by class
    if get("map_size", 0):  # only when set, so checkpoints of full-map scans keep their fingerprint
        d["map_size"] = get("map_size")
    d["model_dir"] = str(Path(get("model_dir")).resolve())
    return d


def fingerprint(cfg: ScanConfig) -> str:
    d = _fingerprint_fields(cfg)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


#: how the changed options are named: their flag, else (no flag: set from Python) their field name
_OPTION_FLAGS = {"model_dir": "MODEL_DIR"}


def changed_options(out: Path, cfg: ScanConfig) -> str:
    """``--seq-len: saved 64 vs now 32, ...``: the options of ``cfg`` that differ from the run in ``out``
    (its config.json), or ``""`` when they cannot be told apart there."""
    try:
        saved = json.loads((Path(out) / "config.json").read_text()).get("options")
        old = json.loads(json.dumps(_fingerprint_fields(saved), default=str))
    except (OSError, ValueError, AttributeError, TypeError, PoslensError):
        return ""
    now = json.loads(json.dumps(_fingerprint_fields(cfg), default=str))
    keys = sorted(k for k in set(old) | set(now) if old.get(k) != now.get(k))
    return ", ".join(f"{_OPTION_FLAGS.get(k, '--' + k.replace('_', '-'))}: saved {old.get(k)!r} vs now {now.get(k)!r}"
                     for k in keys)


def resume_mismatch(out: Path, what: Path, cfg: ScanConfig) -> PoslensError:
    """The error of a --resume whose options differ from the run that wrote ``what``, naming them."""
    diff = changed_options(out, cfg)
    return PoslensError(f"--resume: {what} was written by a scan with different options"
                        + (f" ({diff})" if diff else "") + "; rerun with the original options or choose a new --out.")


def save_checkpoint(out: Path, capture: Capture, next_seq: int, fp: str, *, name: str = CHECKPOINT,
                    extra: dict | None = None) -> None:
    write_tensors(out / name, capture.state_dict(),
                  metadata={"next_seq": next_seq, "fingerprint": fp, **capture.state_metadata(), **(extra or {})})


def checkpoint_meta(path: Path) -> dict:
    """The metadata of a scan checkpoint; one that is cut short or damaged is refused naming it and
    the fix (reads the header only)."""
    from safetensors import safe_open

    again = "rerun with --overwrite instead of --resume (the scan starts again, replacing the run directory)"
    safetensors_shapes(path, again=again)
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        return {k: json.loads(v) for k, v in meta.items()}
    except Exception as e:  # noqa: BLE001 - safetensors' own error type, or metadata that is not JSON
        raise PoslensError(f"{path}: damaged checkpoint ({type(e).__name__}); {again}.") from None


def load_checkpoint(out: Path, capture: Capture, fp: str, *, name: str = CHECKPOINT) -> int:
    """Load accumulators from ``out/name``; returns the next sequence index (0 if none).

    For a rank checkpoint of a distributed run the returned value is the number of that rank's
    own batches already accumulated (``batches_done``)."""
    path = out / name
    if not path.exists():
        return 0
    meta = checkpoint_meta(path)
    if meta.get("fingerprint") != fp:
        raise PoslensError(f"--resume: {path} was written by a scan with different options; rerun with the "
                           "original options or choose a new --out.")

    capture.load_state_dict(read_tensors(path), copy=False, metadata=meta)  # fresh from the file: adopt, not copy
    return int(meta["batches_done"]) if "batches_done" in meta else int(meta["next_seq"])


def check_finished(out: Path, ck_name: str, fp: str, cfg: ScanConfig | None = None) -> None:
    """Refuse to resume a finished scan: its checkpoint is gone (deleted unless --keep-checkpoint), so a
    resume would silently start again over its results."""
    try:
        written = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        written = None
    command = written_by(out) or ("model" if classify(out) == "model" else None)
    if command not in (None, "scan"):
        what = "a model directory" if command == "model" else f"a `poslens {command}` run"
        raise PoslensError(f"--resume: {out} is {what}, not a scan; there is no scan to resume. Choose a new --out.")
    if (out / ck_name).exists() or not (out / "summary.json").exists():
        return
    old = written.get("fingerprint") if isinstance(written, dict) else None
    if old is not None and old != fp:
        if cfg is not None:
            raise resume_mismatch(out, out, cfg)
        raise PoslensError(f"--resume: {out} was written by a scan with different options; rerun with the original "
                           "options or choose a new --out.")
    raise PoslensError(f"--resume: {out} is a finished scan (summary.json written, checkpoint removed); there is "
                       "nothing to resume. Choose a new --out to scan again.")


def rank_checkpoints(out: Path) -> dict[int, Path]:
    found = {}
    for f in out.glob("checkpoint.rank*.safetensors"):
        r = f.name[len("checkpoint.rank"):-len(".safetensors")]
        if r.isdigit():
            found[int(r)] = f
    return found


def check_resume_layout(out: Path, world_size: int) -> None:
    """Refuse to resume a run under a different number of processes than wrote its checkpoints."""
    ranks = rank_checkpoints(out)
    if world_size == 1:
        if ranks:
            w = checkpoint_meta(next(iter(ranks.values()))).get("world_size", "several")
            raise PoslensError(f"--resume: {out} holds the per-rank checkpoints of a {w}-process distributed scan; "
                               f"resume it with torchrun --nproc-per-node/--nnodes giving {w} processes in all.")
        return
    if not ranks and (out / CHECKPOINT).exists():
        raise PoslensError(f"--resume: {out}/{CHECKPOINT} was written by a single-process scan; resume it without "
                           "torchrun (or start a new --out for a distributed scan).")
    for r, f in sorted(ranks.items()):
        w = checkpoint_meta(f).get("world_size")
        if w != world_size or r >= world_size:
            raise PoslensError(f"--resume: {out} holds checkpoints of a {w}-process distributed scan but this job has "
                               f"{world_size} processes; relaunch with {w} processes in all (the shards differ).")
