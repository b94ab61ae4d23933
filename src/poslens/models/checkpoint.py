"""What a training run writes besides its log: the model's and tokenizer's files, its checkpoints, and
their removal.

Every write goes through :mod:`poslens.rundir`: the files of ``save_pretrained`` are written into a
staged folder of the run directory and renamed into place one by one; a checkpoint is a staged
folder of safetensors and JSON files (no pickle), each written atomically, renamed whole into
``checkpoint-NNNNNNNN/`` and then pointed to by ``checkpoint.json``. A reader never sees a
half-written file, and an interrupted save leaves only a staged folder that ``--overwrite`` removes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_model

from poslens.errors import PoslensError
from poslens.rundir.io import (_atomic_write, _is_write_error, make_shareable, read_json, record_written,
                               safetensors_shapes, write_error, write_json, write_tensors)
from poslens.rundir.staging import move_into, staged_folder
from poslens.runtime import no_hf_progress_bars

# Files a training run writes into its directory; a --resume of a run stopped before its first checkpoint
# removes exactly these (--overwrite removes everything, once check_replaceable has found nothing else).
OWN_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
             "summary.json", "train_config.json", "train_log.jsonl", "checkpoint.json")


def clear_own_files(out: Path) -> None:
    """Remove the files of :data:`OWN_FILES` and every checkpoint folder from ``out``."""
    for name in OWN_FILES:
        p = out / name
        if p.is_file():
            p.unlink()
    for p in out.glob("checkpoint-*"):
        if p.is_dir():
            shutil.rmtree(p)


def save_pretrained_atomic(obj, out: Path) -> None:
    """``obj.save_pretrained`` (a model or a tokenizer) into run directory ``out``, file by file atomically."""
    with staged_folder(out, "save") as tmp:
        try:
            with no_hf_progress_bars():
                obj.save_pretrained(tmp)
        except Exception as e:  # a full disk: safetensors' SafetensorError, or an OSError
            if _is_write_error(e):
                raise write_error(out, e) from None
            raise
        move_into(tmp, out)


def save_checkpoint(out: Path, step: int, model, optimizer, scheduler, state: dict) -> None:
    """Write ``checkpoint-{step:08d}/`` (model, optimiser and RNG states in safetensors, the scheduler, the
    optimiser's scalars and ``state`` in ``state.json``), point ``checkpoint.json`` to it and remove older ones."""
    with staged_folder(out, "checkpoint") as tmp:
        _atomic_write(tmp / "model.safetensors", lambda path: save_model(model, path))
        osd = optimizer.state_dict()
        tensors, scalars = {}, {}
        for idx, st in osd["state"].items():
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    tensors[f"{idx}.{k}"] = v
                else:
                    scalars[f"{idx}.{k}"] = v
        write_tensors(tmp / "optimizer.safetensors", tensors)
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                rng[f"cuda{i}"] = s
        write_tensors(tmp / "rng.safetensors", rng)
        write_json(tmp / "state.json", {"step": step, "optimizer_param_groups": osd["param_groups"],
                                        "optimizer_scalars": scalars, "scheduler": scheduler.state_dict(), **state})
        final = out / f"checkpoint-{step:08d}"
        record_written(out, f"{final.name}/")
        for f in [tmp, *tmp.iterdir()]:
            make_shareable(f)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    write_json(out / "checkpoint.json", {"step": step, "dir": final.name})
    for old in out.glob("checkpoint-*"):
        if old.is_dir() and old.name != final.name:
            shutil.rmtree(old)


def remove_checkpoints(out: Path) -> None:
    """Remove every checkpoint folder of ``out`` and ``checkpoint.json`` (a finished run needs none)."""
    for old in out.glob("checkpoint-*"):
        if old.is_dir():
            shutil.rmtree(old)
    (out / "checkpoint.json").unlink(missing_ok=True)


def load_checkpoint(out: Path, model, optimizer, scheduler) -> dict:
    """The state of the last checkpoint, loaded into ``model``, ``optimizer`` and ``scheduler``; a
    checkpoint that is missing, cut short or damaged is one error naming the file."""
    fix = "the run cannot be continued (pass --overwrite to start again)"
    try:
        ptr = read_json(out / "checkpoint.json")
        ck = out / str(ptr["dir"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PoslensError(f"--resume: {out}/checkpoint.json is damaged ({type(e).__name__}); {fix}.") from None
    if not ck.is_dir():
        raise PoslensError(f"--resume: {out}/checkpoint.json points to {ck.name}, which is missing; {fix}.")
    for name in ("state.json", "model.safetensors", "optimizer.safetensors", "rng.safetensors"):
        if not (ck / name).is_file():
            raise PoslensError(f"--resume: {ck / name} is missing; {fix}.")
        if name.endswith(".safetensors"):
            safetensors_shapes(ck / name, again=fix)
    try:
        return _restore(ck, model, optimizer, scheduler)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise PoslensError(f"--resume: the checkpoint {ck} is damaged or does not fit this run ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]}); {fix}.") from None


def _restore(ck: Path, model, optimizer, scheduler) -> dict:
    state = read_json(ck / "state.json")
    load_model(model, str(ck / "model.safetensors"))
    flat = load_file(str(ck / "optimizer.safetensors"))
    opt_state: dict = {}
    for key, v in flat.items():
        idx, k = key.split(".", 1)
        opt_state.setdefault(int(idx), {})[k] = v
    for key, v in state["optimizer_scalars"].items():
        idx, k = key.split(".", 1)
        opt_state.setdefault(int(idx), {})[k] = v
    groups = state["optimizer_param_groups"]
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    scheduler.load_state_dict(state["scheduler"])
    rng = load_file(str(ck / "rng.safetensors"))
    torch.set_rng_state(rng["torch"])
    cuda_states = [rng[k] for k in sorted(k for k in rng if k.startswith("cuda"))]
    if cuda_states and torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_states)
    return state
