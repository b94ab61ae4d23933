"""The trainer: small NoPE / RoPE / learned-PE models on a corpus or a positional task.

``train_model(TrainConfig(...))`` trains and writes a model directory that plain transformers
can load (``AutoModelForCausalLM.from_pretrained(out)``, ``AutoTokenizer.from_pretrained(out)``,
safetensors), plus:

- ``train_config.json``: every option, the seed and library versions (``config.json`` is the
  model's own Hugging Face config);
- ``train_log.jsonl``: one record per optimiser step (loss, lr, grad norm, tokens) and one per
  evaluation (``"kind": "eval"``);
- ``summary.json``: ``initial_loss``, ``final_loss``, ``eval_loss``, ``eval_accuracy`` (tasks,
  training lengths), ``eval_accuracy_long`` (lengths L+1..2L), ``tokens_per_second``, ...;
- ``checkpoint-NNNNNNNN/`` + ``checkpoint.json`` while a run is unfinished.

Optimisation: AdamW (weight decay on matrices only), linear warmup then cosine decay to
``min_lr_ratio * lr``, gradient-norm clipping, bf16 autocast on CUDA (fp32 on CPU).

Determinism and exact resume: the initial weights depend only on the seed, and the batch of
step ``s`` depends only on (seed, s) (see :class:`poslens.data.tasks.TaskSource`,
:class:`CorpusSource`), so a checkpoint needs no data cursor. A checkpoint holds the model,
the optimiser and scheduler state and the torch RNG states, all in safetensors/JSON (no
pickle); it is written to a temporary directory and renamed into place (:mod:`poslens.models.checkpoint`).
Resuming reproduces the uninterrupted loss trajectory bit for bit on the same device and thread count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from poslens.data.corpus import load_texts
from poslens.data.tasks import TaskSource, exact_match_flags
from poslens.data.tokenizer import char_tokenizer, train_bpe_tokenizer
from poslens.errors import Interrupted, PoslensError, require, require_fits
from poslens.fmt import fmt
from poslens.models.checkpoint import (clear_own_files, load_checkpoint, remove_checkpoints, save_checkpoint,
                                      save_pretrained_atomic)
from poslens.models.families import PE_CHOICES, build_config, build_model, count_parameters, get_preset
from poslens.progress import task_progress
from poslens.rundir.staging import check_replaceable
from poslens.rundir.outdir import commit_out_dir, create_out_dir, prepare_out_dir
from poslens.rundir.lock import out_dir_lock, run_entries
from poslens.rundir.io import read_json, record_written, versions, write_json
from poslens.rundir.summary import write_summary
from poslens.runtime import parse_device, torch_threads

# Options that may differ between a run and its --resume (they do not change the trajectory).
RUNTIME_FIELDS = ("out", "device", "threads", "resume", "overwrite", "stop_after", "progress")


#: The command's defaults: the measured recipes of docs/train.md. A positional task with these
#: reaches 98 % (NoPE) / 100 % (RoPE) exact match on copy at the training lengths; the library's
#: ``TrainConfig`` defaults stay small (the micro preset, for tests).
RECIPES = {
    "task": {"preset": "tiny", "steps": 1500, "batch_size": 64, "lr": 3e-3},
    "corpus": {"preset": "tiny", "steps": 1500, "batch_size": 16, "lr": 2e-3},
}


def recipe(task: str | None) -> dict:
    """The documented recipe for a task run (``task`` given) or a language-model run."""
    return dict(RECIPES["task" if task else "corpus"])


def default_eval_examples(steps: int, batch_size: int) -> int:
    """Examples (tasks) / windows (corpus) per evaluation when ``--eval-examples`` is not given:
    500, or one batch for a random-initialisation control (``steps = 0``), whose loss is that of
    an untrained model and needs no long pass (on the 1b preset each window costs seconds of CPU)."""
    return min(500, batch_size) if steps == 0 else 500


@dataclass
class TrainConfig:
    """Every option of a training run (the CLI maps its flags one to one onto these fields)."""

    out: str
    pe: str = "rope"  # none | rope | learned
    task: str | None = None  # a positional task; None trains a language model on `data`
    data: str | None = None  # corpus for language-model runs: "stdlib" (default), a file or a directory
    preset: str = "micro"
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    intermediate: int | None = None
    max_positions: int | None = None  # max_position_embeddings; default: the preset's, raised to the training length
    rope_theta: float = 10000.0
    init_std: float = 0.02
    vocab_size: int = 4096  # BPE vocabulary for corpus runs (tasks use the fixed character vocabulary)
    max_len: int | None = None  # task training length L (default: the task's); long test up to 2L
    delta: int = 1  # the offset task's Δ
    seq_len: int = 128  # corpus runs: tokens per training sequence
    corpus_files: int | None = None  # corpus runs: use only the first N files (sorted)
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int | None = None  # default: 5 % of steps
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.95
    eval_every: int = 250  # 0: evaluate only at the end
    eval_examples: int = 500
    checkpoint_every: int = 500  # 0: only when stopping
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    resume: bool = False
    overwrite: bool = False
    stop_after: int | None = None  # stop (with a checkpoint) once this many steps are done
    progress: bool = True
    _meta: dict = field(default_factory=dict, repr=False)

    def trajectory_fields(self) -> dict:
        d = dataclasses.asdict(self)
        for k in RUNTIME_FIELDS + ("_meta",):
            d.pop(k, None)
        return d


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


class CorpusSource:
    """A tokenised corpus as one stream (documents separated by ``<eos>``); the last 2 % (at
    least a few windows) is held out. The batch of step ``s`` is a set of random windows drawn
    from a generator seeded by (seed, s)."""

    def __init__(self, stream, seq_len: int, seed: int):
        self.seq_len, self.seed = seq_len, seed
        n = len(stream)
        n_val = max(int(0.02 * n), 4 * (seq_len + 1))
        if n - n_val < 4 * (seq_len + 1):
            raise PoslensError(f"the corpus has only {n} tokens, too few for --seq-len {seq_len}; "
                               "pass a larger corpus or a smaller --seq-len.")
        self.train = np.asarray(stream[: n - n_val], dtype=np.int64)
        self.val = np.asarray(stream[n - n_val:], dtype=np.int64)
        self.pad_id = -1

    def _windows(self, arr, starts):
        x = torch.from_numpy(np.stack([arr[s: s + self.seq_len + 1] for s in starts]))
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def train_batch(self, step: int, batch_size: int):
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(self.train) - self.seq_len - 1, size=batch_size)
        return self._windows(self.train, starts)

    def val_batches(self, max_windows: int, batch_size: int):
        count = min(max_windows, (len(self.val) - 1) // (self.seq_len + 1))
        starts = [i * (self.seq_len + 1) for i in range(count)]
        for i in range(0, count, batch_size):
            yield self._windows(self.val, starts[i: i + batch_size])


def tokenize_corpus(tokenizer, texts: list[str]) -> list[int]:
    """All documents as one id stream, each followed by ``<eos>``."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        stream.extend(enc.ids)
        stream.append(eos)
    return stream


# --------------------------------------------------------------------------------------------
# Validation and output directory
# --------------------------------------------------------------------------------------------


def validate_config(cfg: TrainConfig) -> None:
    """Every check that does not need the data; raises :class:`PoslensError` naming the option."""
    require(cfg.pe in PE_CHOICES, f"--pe {cfg.pe!r} is unknown; choose one of {', '.join(PE_CHOICES)}.")
    require(cfg.steps >= 0, f"--steps must be >= 0 (got {cfg.steps}); 0 saves the randomly initialised model.")
    require(cfg.batch_size >= 1, f"--batch-size must be >= 1 (got {cfg.batch_size}).")
    require_fits("--batch-size", cfg.batch_size)
    require_fits("--steps", max(cfg.steps, 1))
    require_fits("--eval-examples", max(cfg.eval_examples, 1))
    require(cfg.lr > 0 and math.isfinite(cfg.lr), f"--lr must be a positive number (got {cfg.lr}).")
    require(0 <= cfg.min_lr_ratio <= 1, f"--min-lr-ratio must be in [0, 1] (got {cfg.min_lr_ratio}).")
    require(cfg.warmup is None or cfg.warmup >= 0, f"--warmup must be >= 0 (got {cfg.warmup}).")
    require(cfg.weight_decay >= 0, f"--weight-decay must be >= 0 (got {cfg.weight_decay}).")
    require(cfg.grad_clip > 0, f"--grad-clip must be > 0 (got {cfg.grad_clip}).")
    require(0 <= cfg.beta1 < 1 and 0 <= cfg.beta2 < 1, "--beta1/--beta2 must be in [0, 1).")
    require(cfg.eval_every >= 0, f"--eval-every must be >= 0 (got {cfg.eval_every}).")
    require(cfg.eval_examples >= 1, f"--eval-examples must be >= 1 (got {cfg.eval_examples}).")
    require(cfg.checkpoint_every >= 0, f"--checkpoint-every must be >= 0 (got {cfg.checkpoint_every}).")
    require(cfg.stop_after is None or cfg.stop_after >= 0, "--stop-after must be >= 0.")
    require(cfg.threads is None or cfg.threads >= 1, f"--threads must be >= 1 (got {cfg.threads}).")
    require(cfg.max_positions is None or cfg.max_positions >= 1,
            f"--max-positions must be >= 1 (got {cfg.max_positions}).")
    require(not (cfg.resume and cfg.overwrite), "--resume and --overwrite contradict each other; pass one.")
    if cfg.task is not None:
        require(cfg.data is None, "--data is for language-model runs; leave it out with --task.")
        src = TaskSource(cfg.task, cfg.max_len, cfg.seed, cfg.delta)  # validates task, lengths, delta
        max_pos = src.max_tokens
    else:
        require(cfg.max_len is None, "--max-len is for --task runs; use --seq-len for language-model runs.")
        require(cfg.seq_len >= 2, f"--seq-len must be >= 2 (got {cfg.seq_len}).")
        require_fits("--seq-len", cfg.seq_len)
        require(cfg.corpus_files is None or cfg.corpus_files >= 1, "--corpus-files must be >= 1.")
        max_pos = cfg.seq_len
    require(cfg.max_positions is None or cfg.max_positions >= max_pos,
            f"--max-positions {cfg.max_positions} is below the {max_pos} positions training needs "
            f"({'the task' if cfg.task else '--seq-len'}); raise it or leave it out.")
    build_config(cfg.pe, cfg.preset, 300, rope_theta=cfg.rope_theta, init_std=cfg.init_std,
                 **_shape_overrides(cfg, max_pos))


def _shape_overrides(cfg: TrainConfig, needed_positions: int) -> dict:
    return dict(layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, kv_heads=cfg.kv_heads,
                intermediate=cfg.intermediate,
                max_positions=cfg.max_positions or max(get_preset(cfg.preset).max_positions, needed_positions))


def _dir_state(out: Path) -> str:
    """``new`` (missing or empty), ``run`` (a poslens training directory) or ``other``."""
    if not out.is_dir() or not run_entries(out):
        return "new"
    return "run" if (out / "train_config.json").is_file() else "other"


def _check_out_dir(cfg: TrainConfig) -> tuple[Path, str]:
    """``(out, mode)``: what to do with the output directory, decided before anything is written.

    ``fresh`` (missing or empty), ``overwrite`` (``--overwrite``: remove the run's own files),
    ``resume`` (``--resume`` and a checkpoint), ``complete`` (``--resume`` of a finished run:
    nothing to do), ``restart`` (``--resume`` of a run stopped before its first checkpoint).
    Anything else is refused with the option that fixes it.
    """
    out = prepare_out_dir(cfg.out)
    state = _dir_state(out)
    if state == "new":
        return out, "fresh"
    if cfg.overwrite:
        check_replaceable(out, "train")  # a model from elsewhere, another command's run, files of the user
        return out, "overwrite"
    if not cfg.resume:
        what = "a training run" if state == "run" else "files (another model?)"
        raise PoslensError(f"--out {out} already holds {what}; pass --resume to continue it, --overwrite to replace "
                           "it, or choose a new directory.")
    if state == "other":
        raise PoslensError(f"--resume: {out} is not a poslens training directory (no train_config.json); "
                           "nothing was changed.")
    saved = read_json(out / "train_config.json")
    saved_fields = {k: v for k, v in saved.items() if k not in RUNTIME_FIELDS + ("_meta",)}
    now = json.loads(json.dumps(cfg.trajectory_fields()))
    diff = sorted(k for k in set(saved_fields) | set(now) if saved_fields.get(k) != now.get(k))
    if diff:
        detail = ", ".join(f"--{k.replace('_', '-')}: saved {saved_fields.get(k)!r} vs now {now.get(k)!r}"
                           for k in diff)
        raise PoslensError(f"--resume: options differ from the run in {out} ({detail}); "
                           "repeat the original options to continue it.")
    if (out / "checkpoint.json").is_file():
        return out, "resume"
    if (out / "summary.json").is_file():
        return out, "complete"
    return out, "restart"  # the run stopped before its first checkpoint: start it again


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def lr_factor(step: int, steps: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimiser step ``step`` (0-based): linear warmup, cosine decay."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _read_log(path: Path, upto_step: int) -> list[dict]:
    records = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption
            if r.get("step", 0) <= upto_step:
                records.append(r)
    return records


def _evaluate(model, source, cfg: TrainConfig, device: str, amp, *, final: bool) -> dict:
    if cfg.task is not None:
        n = cfg.eval_examples if final else min(cfg.eval_examples, 256)
        res: dict = {}
        by_len: dict[int, list[bool]] = {}
        splits = (("in", ""), ("long", "_long")) if final else (("in", ""),)
        for split, suffix in splits:
            examples, lengths = source.eval_examples_with_lengths(split, n)
            flags, loss = exact_match_flags(model, examples, source.pad_id, device=device, autocast_dtype=amp)
            res[f"eval_accuracy{suffix}"] = sum(flags) / len(flags)
            res[f"eval_loss{suffix}"] = loss
            for length, f in zip(lengths, flags):
                by_len.setdefault(length, []).append(f)
        if final:
            res["accuracy_by_length"] = {k: sum(v) / len(v) for k, v in sorted(by_len.items())}
        return res
    was = model.training
    model.eval()
    total, count = 0.0, 0
    batches = list(source.val_batches(cfg.eval_examples if final else min(cfg.eval_examples, 64), cfg.batch_size))
    # The final pass gets its own bar: on a large preset it takes minutes of CPU.
    with torch.no_grad(), task_progress("evaluate", len(batches), enabled=final and cfg.progress) as update:
        for i, (x, y) in enumerate(batches):
            x, y = x.to(device), y.to(device)
            with (torch.autocast("cuda", dtype=amp) if amp else contextlib.nullcontext()):
                logits = model(input_ids=x).logits
            total += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
            count += y.numel()
            update(i + 1)
    model.train(was)
    return {"eval_loss": total / max(count, 1)}


@dataclass
class _Session:
    """What one training session carries between its parts: the model and optimiser, the data, and
    the counters a checkpoint saves (``step``, ``tokens_seen``, seconds)."""

    cfg: TrainConfig
    out: Path
    device: str
    amp: Any  # bf16 autocast dtype on CUDA, None on CPU
    source: Any  # TaskSource | CorpusSource
    tokenizer: Any
    model: Any
    optimizer: Any
    scheduler: Any
    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0
    train_cpu_seconds: float = 0.0
    losses: dict = field(default_factory=dict)  # step -> training loss
    pending: list = field(default_factory=list)  # log records not yet appended to train_log.jsonl

    @property
    def log_path(self) -> Path:
        return self.out / "train_log.jsonl"

    def flush_log(self) -> None:
        if self.pending:
            with open(self.log_path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in self.pending))
            self.pending.clear()

    def checkpoint(self) -> None:
        self.flush_log()
        save_checkpoint(self.out, self.step, self.model, self.optimizer, self.scheduler,
                         {"tokens_seen": self.tokens_seen, "train_seconds": self.train_seconds,
                          "train_cpu_seconds": self.train_cpu_seconds})


def _load_data(cfg: TrainConfig, out: Path, mode: str):
    """``(source, tokenizer, positions needed)``; loading the corpus validates it. Writes nothing."""
    if cfg.task is not None:
        source = TaskSource(cfg.task, cfg.max_len, cfg.seed, cfg.delta)
        return source, char_tokenizer(model_max_length=source.max_tokens), source.max_tokens
    texts = load_texts(cfg.data or "stdlib", limit_files=cfg.corpus_files)
    if mode == "resume" and (out / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(out)
    else:
        tokenizer = train_bpe_tokenizer(texts, cfg.vocab_size, model_max_length=cfg.seq_len)
    return CorpusSource(tokenize_corpus(tokenizer, texts), cfg.seq_len, cfg.seed), tokenizer, cfg.seq_len


def _build_optimisation(cfg: TrainConfig, model):
    """``(optimizer, scheduler, warmup steps)``: AdamW (decay on matrices only), warmup then cosine."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8)
    warmup = cfg.warmup if cfg.warmup is not None else max(1, round(0.05 * cfg.steps)) if cfg.steps else 0
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg.steps, warmup, cfg.min_lr_ratio))
    return optimizer, scheduler, warmup


def _start_session(cfg: TrainConfig, out: Path, mode: str, device: str) -> _Session:
    """Data, model and optimiser, then (only now) the directory: fresh files, or the checkpoint's state."""
    source, tokenizer, needed = _load_data(cfg, out, mode)
    model = build_model(cfg.pe, cfg.preset, len(tokenizer), seed=cfg.seed, rope_theta=cfg.rope_theta,
                        init_std=cfg.init_std, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        **_shape_overrides(cfg, needed)).to(device)
    model.train()
    optimizer, scheduler, warmup = _build_optimisation(cfg, model)
    # From here on the directory is ours to write. A run replacing another (--overwrite) is written into a
    # sibling staging directory and swapped in once it has finished (commit_out_dir): until then, and if
    # it fails or is interrupted, the previous run stays as it was.
    out = create_out_dir(out, command="train", overwrite=mode == "overwrite", staged=True)
    s = _Session(cfg, out, device, torch.bfloat16 if device.startswith("cuda") else None, source, tokenizer, model,
                 optimizer, scheduler)
    if mode == "restart":
        clear_own_files(out)
    if mode == "resume":
        st = load_checkpoint(out, model, optimizer, scheduler)
        s.step, s.tokens_seen, s.train_seconds = st["step"], st["tokens_seen"], st["train_seconds"]
        s.train_cpu_seconds = st.get("train_cpu_seconds", 0.0)
        records = _read_log(s.log_path, s.step)
        s.log_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        records = []
        record_written(out, s.log_path.name)
        meta = {"versions": versions(), "params": count_parameters(model), "warmup_resolved": warmup}
        write_json(out / "train_config.json", {**dataclasses.asdict(cfg), "_meta": meta})
        save_pretrained_atomic(tokenizer, out)
        s.log_path.write_text("")
    s.losses = {r["step"]: r["loss"] for r in records if r.get("kind") == "train"}
    return s


def _untrained_loss(s: _Session) -> None:
    """A random-init run (``steps = 0``) records the loss of the first batch, untrained."""
    x, y = s.source.train_batch(0, s.cfg.batch_size)
    with torch.no_grad():
        logits = s.model(input_ids=x.to(s.device)).logits.float()
        loss0 = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(s.device).reshape(-1),
                                      ignore_index=-100))
    s.losses[0] = loss0
    s.pending.append({"kind": "train", "step": 0, "loss": loss0, "lr": 0.0, "tokens": 0})


def _train_step(s: _Session) -> float:
    """One optimiser step on the batch of step ``s.step``; advances the counters, returns the loss."""
    cfg = s.cfg
    t0, c0 = time.perf_counter(), time.process_time()
    x, y = s.source.train_batch(s.step, cfg.batch_size)
    n_tok = int((x != s.source.pad_id).sum())
    x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
    with (torch.autocast("cuda", dtype=s.amp) if s.amp else contextlib.nullcontext()):
        logits = s.model(input_ids=x).logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), cfg.grad_clip)
    lr = s.optimizer.param_groups[0]["lr"]
    s.optimizer.step()
    s.scheduler.step()
    s.optimizer.zero_grad(set_to_none=True)
    loss_v = float(loss.detach())  # synchronises, so the timing below is real
    s.step += 1
    s.train_seconds += time.perf_counter() - t0
    s.train_cpu_seconds += time.process_time() - c0
    s.tokens_seen += n_tok
    s.losses[s.step] = loss_v
    s.pending.append({"kind": "train", "step": s.step, "loss": loss_v, "lr": lr,
                      "grad_norm": float(grad_norm), "tokens": s.tokens_seen})
    return loss_v


def _train_loop(s: _Session, stop_at: int) -> None:
    """Steps up to ``stop_at`` with evaluations, checkpoints and the progress bar; an interrupt
    leaves a checkpoint and becomes a one-line error."""
    cfg = s.cfg
    label = f"train {cfg.pe}/{cfg.task or 'corpus'}/{cfg.preset}"
    acc = ""
    try:
        with task_progress(label, cfg.steps, enabled=cfg.progress, done=s.step) as update:
            if cfg.steps == 0:
                _untrained_loss(s)
            while s.step < stop_at:
                loss_v = _train_step(s)
                step = s.step
                if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                    ev = _evaluate(s.model, s.source, cfg, s.device, s.amp, final=False)
                    s.pending.append({"kind": "eval", "step": step, **ev})
                    acc = f" acc {fmt(ev['eval_accuracy'])}" if "eval_accuracy" in ev else acc
                if step % 10 == 0 or step == stop_at:
                    update(step, info=f"loss {fmt(loss_v)}{acc} {fmt(s.tokens_seen / max(s.train_seconds, 1e-9))} tok/s")
                if step < stop_at and cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    s.checkpoint()
                elif len(s.pending) >= 200:
                    s.flush_log()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM under the CLI (a scheduler's time limit): keep the steps done
        s.checkpoint()
        raise Interrupted(f"after step {s.step}; a checkpoint is saved in {s.out}; "
                          "rerun the same command with --resume to continue.") from None


def _finish(s: _Session, setup_seconds: float) -> dict:
    """Final evaluation, the model's files and ``summary.json``; removes the checkpoints."""
    cfg, source, out = s.cfg, s.source, s.out
    ev = _evaluate(s.model, source, cfg, s.device, s.amp, final=True)
    s.pending.append({"kind": "eval", "step": s.step, **ev})
    s.flush_log()
    save_pretrained_atomic(s.model.to(torch.float32), out)
    ordered = [s.losses[k] for k in sorted(s.losses)]
    tail = ordered[-min(20, len(ordered)):]
    summary = {
        "pe": cfg.pe, "task": cfg.task, "data": None if cfg.task else (cfg.data or "stdlib"), "preset": cfg.preset,
        "steps": cfg.steps, "params": count_parameters(s.model),
        "params_non_embedding": count_parameters(s.model, non_embedding=True),
        "initial_loss": ordered[0] if ordered else None,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "eval_loss": ev.get("eval_loss"), "eval_examples": cfg.eval_examples,
        "eval_accuracy": ev.get("eval_accuracy"), "eval_accuracy_long": ev.get("eval_accuracy_long"),
        "eval_loss_long": ev.get("eval_loss_long"), "accuracy_by_length": ev.get("accuracy_by_length"),
        "train_lengths": [source.lo, source.L] if cfg.task else None,
        "long_lengths": [source.L + 1, 2 * source.L] if cfg.task else None,
        "tokens_seen": s.tokens_seen, "train_seconds": s.train_seconds,
        # CPU time of the process over the training steps, all threads: on a shared machine it
        # shows how much compute a run needed independently of how long it waited for a core.
        "train_cpu_seconds": s.train_cpu_seconds,
        "tokens_per_second": s.tokens_seen / s.train_seconds if s.train_seconds > 0 else None,
        "setup_seconds_last_session": setup_seconds, "device": s.device, "threads": torch.get_num_threads(),
        "vocab_size": len(s.tokenizer),
    }
    summary = write_summary(out, summary, command="train")
    remove_checkpoints(out)
    return summary


def train_model(cfg: TrainConfig) -> dict:
    """Train (or resume) as ``cfg`` says and return the summary (also in ``out/summary.json``).

    Every input is validated before the output directory is created or touched; an existing
    directory is refused unless ``resume`` (continue it) or ``overwrite`` (replace the files a
    run writes, and nothing else) is set. The directory's mode (see :func:`_check_out_dir`):
    ``fresh`` / ``overwrite`` / ``restart`` start at step 0, ``resume`` continues from the
    checkpoint, ``complete`` returns the finished run's summary. ``cfg.threads`` applies inside
    the call only.
    """
    validate_config(cfg)
    device = parse_device(cfg.device)
    prepare_out_dir(cfg.out)
    with out_dir_lock(cfg.out, command="train"):  # a second process writing --out is refused
        return _train_locked(cfg, device)


def _train_locked(cfg: TrainConfig, device: str) -> dict:
    out, mode = _check_out_dir(cfg)
    if mode == "complete":
        return read_json(out / "summary.json")
    with torch_threads(cfg.threads or None):
        t_setup = time.perf_counter()
        s = _start_session(cfg, out, mode, device)
        setup_seconds = time.perf_counter() - t_setup
        stop_at = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
        try:
            _train_loop(s, stop_at)
        except Interrupted:
            if s.out != out:  # replacing a run: the new one is dropped, the previous one kept as it was
                raise Interrupted(f"after step {s.step}; --out {out} keeps the previous run as it was (the "
                                  "replacing run is dropped); rerun with --overwrite to start again.") from None
            raise
        if s.step < cfg.steps:  # --stop-after: leave a checkpoint for --resume
            s.checkpoint()
            commit_out_dir(out)
            return {"stopped_at_step": s.step, "steps": cfg.steps, "out": str(out)}
        summary = _finish(s, setup_seconds)
        commit_out_dir(out)
        return summary


def load_trained(path: str | os.PathLike, device: str = "cpu"):
    """``(model, tokenizer, summary)`` of a directory written by :func:`train_model` (plain transformers)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    if not (p / "config.json").is_file():
        raise PoslensError(f"{p} holds no trained model (no config.json); train one with `poslens train`.")
    from poslens.capture.model.source import quiet_hf_loading

    with quiet_hf_loading():  # transformers' report and "Loading weights" bar (shown with poslens --verbose)
        model = AutoModelForCausalLM.from_pretrained(p).to(device).eval()
    tok = AutoTokenizer.from_pretrained(p)
    summary = read_json(p / "summary.json") if (p / "summary.json").is_file() else {}
    return model, tok, summary
