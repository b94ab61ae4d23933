"""The model zoo: the standard set of small models the report analyses.

``run_zoo(out, scale="cpu")`` trains, one after another, into ``out/<name>/``:

- ``nope-stdlib``, ``rope-stdlib``: language models on the default corpus (the Python standard
  library's sources), for the adjacency / causal-mask analyses (arXiv 2501.00073, 2509.21042)
  and the slash analyses (arXiv 2601.08297);
- ``nope-copy``, ``rope-copy``, ``nope-reverse``, ``rope-reverse``: the two positional tasks
  whose in- and out-of-length accuracy docs/train.md reports;
- ``nope-random``, ``rope-random``: the same architectures untrained (``steps = 0``).

Scales: ``cpu`` (``tiny`` preset, the budget in docs/train.md), ``gpu`` (``small`` for the
tasks, ``base`` for the corpus models), ``micro`` (seconds; a smoke test of the recipe).
Every entry is an ordinary :class:`poslens.models.train.TrainConfig`, so a rerun resumes unfinished
entries and skips finished ones; ``out/zoo.json`` lists the entries and their summaries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from poslens.errors import PoslensError
from poslens.models.train import TrainConfig, train_model
from poslens.rundir.outdir import prepare_out_dir
from poslens.rundir.io import read_json, write_json

SCALES = ("micro", "cpu", "gpu")

# Per scale: (preset, task steps, task batch, task lr, corpus preset, corpus steps, corpus batch, corpus lr).
_RECIPES = {
    "micro": dict(task_preset="micro", task_steps=20, task_batch=16, task_lr=3e-3,
                  lm_preset="micro", lm_steps=20, lm_batch=8, lm_lr=3e-3, seq_len=64, vocab=512, corpus_files=20),
    "cpu": dict(task_preset="tiny", task_steps=1500, task_batch=64, task_lr=3e-3,
                lm_preset="tiny", lm_steps=1500, lm_batch=16, lm_lr=2e-3, seq_len=128, vocab=4096, corpus_files=None),
    "gpu": dict(task_preset="small", task_steps=10000, task_batch=128, task_lr=1e-3,
                lm_preset="base", lm_steps=3000, lm_batch=64, lm_lr=6e-4, seq_len=512, vocab=8192, corpus_files=None),
}
TASKS = ("copy", "reverse")
PES = ("none", "rope")
_PE_NAME = {"none": "nope", "rope": "rope"}


def zoo_entries(scale: str, out: str | Path) -> dict[str, TrainConfig]:
    """Name -> training config of every zoo entry at ``scale``."""
    if scale not in SCALES:
        raise PoslensError(f"--scale {scale!r} is unknown; choose one of {', '.join(SCALES)}.")
    r = _RECIPES[scale]
    out = Path(out)
    entries: dict[str, TrainConfig] = {}
    for pe in PES:
        name = f"{_PE_NAME[pe]}-stdlib"
        entries[name] = TrainConfig(out=str(out / name), pe=pe, data="stdlib", preset=r["lm_preset"],
                                    steps=r["lm_steps"], batch_size=r["lm_batch"], lr=r["lm_lr"],
                                    seq_len=r["seq_len"], vocab_size=r["vocab"], corpus_files=r["corpus_files"],
                                    eval_every=max(1, r["lm_steps"] // 5), eval_examples=256,
                                    checkpoint_every=max(1, r["lm_steps"] // 5))
    for task in TASKS:
        for pe in PES:
            name = f"{_PE_NAME[pe]}-{task}"
            entries[name] = TrainConfig(out=str(out / name), pe=pe, task=task, preset=r["task_preset"],
                                        steps=r["task_steps"], batch_size=r["task_batch"], lr=r["task_lr"],
                                        eval_every=max(1, r["task_steps"] // 6), eval_examples=500,
                                        checkpoint_every=max(1, r["task_steps"] // 3))
    for pe in PES:
        name = f"{_PE_NAME[pe]}-random"
        entries[name] = TrainConfig(out=str(out / name), pe=pe, data="stdlib", preset=r["lm_preset"], steps=0,
                                    batch_size=r["lm_batch"], seq_len=r["seq_len"], vocab_size=r["vocab"],
                                    corpus_files=r["corpus_files"], eval_examples=64)
    return entries


def run_zoo(out: str | Path, *, scale: str = "cpu", only: list[str] | None = None, device: str = "auto",
            threads: int | None = None, resume: bool = False, overwrite: bool = False,
            progress: bool = True, on_entry: Callable[[str, dict], None] | None = None) -> dict[str, dict]:
    """Train every (or every ``only``) entry into ``out/<name>``; returns name -> summary.
    ``on_entry(name, summary)`` runs after each entry (the CLI prints its result line there).

    Entries already in ``out`` are refused unless ``resume`` (finished ones are skipped,
    unfinished ones continue from their checkpoints) or ``overwrite`` (retrained from scratch)."""
    entries = zoo_entries(scale, out)
    if only:
        unknown = [n for n in only if n not in entries]
        if unknown:
            raise PoslensError(f"--only: unknown entries {', '.join(unknown)}; choose from {', '.join(entries)}.")
        entries = {n: entries[n] for n in only}
    root = prepare_out_dir(out)
    if resume and overwrite:
        raise PoslensError("--resume and --overwrite contradict each other; pass one.")
    if root.is_dir() and any(root.iterdir()) and not (resume or overwrite):
        raise PoslensError(f"--out {root} already exists and is not empty; pass --resume to continue it or "
                           "--overwrite to replace it, or choose a new directory.")
    busy = [n for n in entries if (root / n).is_dir() and any((root / n).iterdir())]
    results: dict[str, dict] = {}
    index_path = root / "zoo.json"
    index = read_json(index_path) if index_path.is_file() else {"scale": scale, "entries": {}}
    if index.get("scale") != scale:
        raise PoslensError(f"{root} holds a zoo of scale {index.get('scale')!r}; use that scale or another --out.")
    for name, cfg in entries.items():
        cfg.device, cfg.threads, cfg.progress = device, threads, progress
        cfg.resume = resume and name in busy
        cfg.overwrite = overwrite and name in busy
        results[name] = train_model(cfg)
        # Re-read before writing so entries finished meanwhile by another `zoo --only` survive.
        if index_path.is_file():
            index = read_json(index_path)
        index["entries"][name] = {"config": cfg.trajectory_fields(), "summary": results[name]}
        write_json(index_path, index)
        if on_entry is not None:
            on_entry(name, results[name])
    return results
