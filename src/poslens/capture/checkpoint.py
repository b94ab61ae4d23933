"""Scan checkpoints: the float64 sums and the next sequence, written atomically every N batches, so a
killed scan resumed with the same options continues bit-identically (one file per rank under
torchrun). A fingerprint of the options that shape the sums guards against resuming a different scan."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from poslens.capture.attention import Capture, stats_record
from poslens.capture.plan import ScanConfig
from poslens.errors import PoslensError
from poslens.rundir import read_tensors, write_tensors


CHECKPOINT = "checkpoint.safetensors"


#: config fields that change the accumulated tensors (a resume must match them exactly)
_FINGERPRINT_FIELDS = ("model_dir", "data", "seq_len", "num_seqs", "batch_size", "seed", "dtype", "layers",
                       "heads", "no_rope_layers", "bidirectional", "chunk_elems", "reservoir", "stats",
                       "aps_max_positions")


def fingerprint(cfg: ScanConfig) -> str:
    d = {k: getattr(cfg, k) for k in _FINGERPRINT_FIELDS}
    d["stats"] = stats_record(cfg.stats)  # built-in names, then users' statistics by class
    if cfg.map_size:  # only when set, so checkpoints of full-map scans keep their fingerprint
        d["map_size"] = cfg.map_size
    d["model_dir"] = str(Path(cfg.model_dir).resolve())
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(out: Path, capture: Capture, next_seq: int, fp: str, *, name: str = CHECKPOINT,
                    extra: dict | None = None) -> None:
    write_tensors(out / name, capture.state_dict(),
                  metadata={"next_seq": next_seq, "fingerprint": fp, **capture.state_metadata(), **(extra or {})})


def checkpoint_meta(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    return {k: json.loads(v) for k, v in meta.items()}


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


def check_finished(out: Path, ck_name: str, fp: str) -> None:
    """Refuse to resume a finished scan: its checkpoint is gone (deleted unless --keep-checkpoint), so a
    resume would silently start again over its results."""
    if (out / ck_name).exists() or not (out / "summary.json").exists():
        return
    try:
        old = json.loads((out / "config.json").read_text()).get("fingerprint")
    except (OSError, ValueError):
        old = None
    if old is not None and old != fp:
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
