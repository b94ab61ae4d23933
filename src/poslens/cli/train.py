"""``poslens train`` and ``poslens zoo``: train small NoPE / RoPE / learned-PE models."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console

from poslens.cli.app import (app, batch_size_option, device_option, out_option, overwrite_option, quiet_option,
                             resume_command, resume_option, seed_option, seq_len_option, threads_option, use_threads)

_PRESET_HELP = "Size preset: micro (tests, seconds on CPU), tiny (CPU minutes), small, base, 1b (GPU)."


@app.command("train", short_help="Train a small NoPE / RoPE / learned-PE model.")
def train(
    out: str = out_option("Model directory to write (loadable with AutoModelForCausalLM/AutoTokenizer)."),
    pe: str = typer.Option("rope", "--pe", help="Positional encoding: none (NoPE, SmolLM3 config with no_rope_layers all 0), "
                           "rope (RoPE in every layer), learned (GPT-2 absolute positions)."),
    task: Optional[str] = typer.Option(None, "--task", help="Positional task: copy, reverse, add, wherex, order, identify, "
                                       "parity, offset. Leave out to train a language model on --data."),
    data: Optional[str] = typer.Option(None, "--data", help="Corpus for language-model runs: 'stdlib' (default: the Python "
                                       "standard library's sources), a text/JSONL file ('text' field) or a directory."),
    preset: Optional[str] = typer.Option(None, "--preset", help=_PRESET_HELP + " Default: tiny (the documented "
                                          "recipe)."),
    num_layers: Optional[int] = typer.Option(None, "--num-layers", help="Override the preset's number of layers."),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="Override the preset's width (MLP width scales with it)."),
    num_heads: Optional[int] = typer.Option(None, "--num-heads", help="Override the number of query heads."),
    num_kv_heads: Optional[int] = typer.Option(None, "--num-kv-heads", help="Override the number of key/value heads "
                                               "(not for learned)."),
    intermediate: Optional[int] = typer.Option(None, "--intermediate", help="Override the MLP width."),
    max_positions: Optional[int] = typer.Option(None, "--max-positions", help="The model's position limit "
                                                "(max_position_embeddings). Default: the preset's (1b: 4096), raised "
                                                "to the training length. A 16,384-token scan needs 16384."),
    rope_theta: float = typer.Option(10000.0, "--rope-theta", help="RoPE base (only used with --pe rope)."),
    init_std: float = typer.Option(0.02, "--init-std", help="Std of the normal weight initialisation (the random-init "
                                   "sweep of arXiv 2501.00073 uses 0.0002 to 2)."),
    vocab_size: int = typer.Option(4096, "--vocab-size", help="Byte-level BPE vocabulary for corpus runs."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Task training length L (lengths 1..L); the long test "
                                          "set uses L+1..2L. Default: the task's own (16 for copy/reverse)."),
    delta: int = typer.Option(1, "--delta", help="The offset task's Δ: output the token Δ positions back."),
    seq_len: int = seq_len_option(128, "Corpus runs: tokens per training sequence."),
    corpus_files: Optional[int] = typer.Option(None, "--corpus-files", help="Corpus runs: use only the first N files."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimiser steps. Default: 1500. 0 trains nothing: it "
                                        "saves the randomly initialised model (a random-initialisation control) with "
                                        "its loss on one batch, evaluated on one batch (quick even for --preset 1b)."),
    batch_size: Optional[int] = batch_size_option(None, "Sequences per step. Default: 64 for --task runs, 16 for "
                                                  "language-model runs."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate (AdamW). Default: 3e-3 for --task runs, "
                                       "2e-3 for language-model runs."),
    min_lr_ratio: float = typer.Option(0.1, "--min-lr-ratio", help="The cosine schedule ends at this fraction of --lr."),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Linear warmup steps (default: 5 percent of --steps)."),
    weight_decay: float = typer.Option(0.1, "--weight-decay", help="AdamW weight decay on weight matrices."),
    grad_clip: float = typer.Option(1.0, "--grad-clip", help="Clip the global gradient norm to this value."),
    eval_every: int = typer.Option(250, "--eval-every", help="Evaluate every N steps (0: only at the end)."),
    eval_examples: Optional[int] = typer.Option(None, "--eval-examples", help="Examples per evaluation split (tasks) / "
                                                "windows (corpus). Default: 500; one batch with --steps 0."),
    checkpoint_every: int = typer.Option(500, "--checkpoint-every", help="Write a resumable checkpoint every N "
                                         "steps; 0: only when the run stops early (Ctrl-C, SIGTERM, --stop-after)."),
    seed: int = seed_option("Seed for initial weights and data; a run is deterministic for a seed."),
    device: str = device_option(" bf16 autocast on CUDA."),
    threads: int = threads_option(),
    resume: bool = resume_option("Continue the run in --out from its last checkpoint (same options required); the "
                                 "loss trajectory is identical to an uninterrupted run."),
    overwrite: bool = overwrite_option("the training files in --out"),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", help="Stop with a checkpoint once this many steps are "
                                             "done (for time-boxed jobs); --resume continues."),
    quiet: bool = quiet_option("No progress bar and no summary table (--json still prints)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Train a small causal LM with NoPE, RoPE or learned positions, on a corpus or a positional task.

    Defaults are the recipe measured in docs/train.md: --preset tiny --steps 1500, with
    --batch-size 64 --lr 3e-3 for tasks (copy reaches 98 % exact match with NoPE, 100 % with
    RoPE) and --batch-size 16 --lr 2e-3 for language models. --preset micro trains in seconds.

    Writes a Hugging Face model directory (safetensors, tokenizer) with summary.json
    (initial/final loss, exact-match accuracy in and beyond the training lengths, tokens/s),
    train_log.jsonl and train_config.json. Ctrl-C or SIGTERM leaves a checkpoint; --resume continues it.
    """
    threads = use_threads(threads)
    from poslens.models.train import TrainConfig, default_eval_examples, train_model

    preset, steps, batch_size, lr = _recipe_defaults(task, preset=preset, steps=steps, batch_size=batch_size, lr=lr)
    if eval_examples is None:
        eval_examples = default_eval_examples(steps, batch_size)
    cfg = TrainConfig(
        out=out, pe=pe, task=task, data=data, preset=preset, layers=num_layers, hidden=hidden,
        heads=num_heads, kv_heads=num_kv_heads, intermediate=intermediate, rope_theta=rope_theta, init_std=init_std,
        max_positions=max_positions,
        vocab_size=vocab_size, max_len=max_len, delta=delta, seq_len=seq_len, corpus_files=corpus_files,
        steps=steps, batch_size=batch_size, lr=lr, min_lr_ratio=min_lr_ratio, warmup=warmup,
        weight_decay=weight_decay, grad_clip=grad_clip, eval_every=eval_every, eval_examples=eval_examples,
        checkpoint_every=checkpoint_every, seed=seed, device=device, threads=threads, resume=resume,
        overwrite=overwrite, stop_after=stop_after, progress=not quiet,
    )
    summary = train_model(cfg)
    if as_json or not quiet:
        _print_summary(summary, as_json)


def _recipe_defaults(task: str | None, **given) -> tuple:
    """``(preset, steps, batch_size, lr)``: the options left unset take the measured recipe of
    docs/train.md for ``task`` (copy: 98 % NoPE, 100 % RoPE)."""
    from poslens.models.train import recipe

    r = recipe(task)
    return tuple(given[k] if given[k] is not None else r[k] for k in ("preset", "steps", "batch_size", "lr"))


def _print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(summary))
        return
    if "stopped_at_step" in summary:
        typer.echo(f"stopped after step {summary['stopped_at_step']} of {summary['steps']} (checkpoint in "
                   f"{summary['out']}); continue with: {resume_command()}")
        return
    from poslens.fmt import rich_table

    keys = ("pe", "task", "data", "preset", "steps", "params", "initial_loss", "final_loss", "eval_loss",
            "eval_accuracy", "eval_accuracy_long", "tokens_per_second", "train_seconds")
    Console().print(rich_table("training summary", ["", ""], [[k, summary[k]] for k in keys if k in summary],
                               show_header=False))


@app.command("zoo", short_help="Train the standard model set the report uses.")
def zoo(
    out: str = out_option("Directory that receives one model directory per zoo entry."),
    scale: str = typer.Option("cpu", "--scale", help="cpu: tiny presets within the CPU budget in docs/train.md; "
                              "gpu: small/base presets for a GPU; micro: a seconds-long smoke version."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated entry names to train (see --list)."),
    list_only: bool = typer.Option(False, "--list", help="Print the entries and their options, train nothing."),
    device: str = device_option(),
    threads: int = threads_option(),
    resume: bool = resume_option("Continue the zoo in --out: skip finished entries, continue unfinished ones from "
                                 "their checkpoints."),
    overwrite: bool = overwrite_option(help="Retrain from scratch the entries already in --out (an existing zoo "
                                       "is refused without --resume or --overwrite)."),
    quiet: bool = quiet_option("No progress bars and no result table."),
) -> None:
    """Train the standard model set used by the report: NoPE and RoPE on the default corpus and on
    two positional tasks (copy, reverse), plus untrained (random-init) NoPE/RoPE models.

    An existing zoo in --out is refused unless --resume (skip finished entries, continue the
    others where they stopped) or --overwrite (retrain them). zoo.json lists every entry with its
    summary.
    """
    threads = use_threads(threads)
    from poslens.models.zoo import run_zoo, zoo_entries

    if list_only:
        from poslens.fmt import rich_table

        rows = []
        for name, cfg in zoo_entries(scale, out).items():
            keys = ("pe", "task", "preset", "steps", "batch_size", "lr") if cfg.task else \
                ("pe", "data", "preset", "steps", "batch_size", "lr", "seq_len", "vocab_size")
            opts = cfg.trajectory_fields()
            rows.append([name, " ".join(f"{k}={opts[k]}" for k in keys)])
        Console().print(rich_table(f"zoo entries ({scale})", ["name", "options"], rows))
        return
    def entry_line(name: str, s: dict) -> None:  # replaces the entry's finished progress bar
        from poslens.fmt import fmt

        if not quiet:
            acc = f", exact match {fmt(s['eval_accuracy'])}" if s.get("eval_accuracy") is not None else ""
            Console(highlight=False).print(f"{name}: final loss {fmt(s.get('final_loss'))}{acc} "
                                           f"({fmt(s.get('train_seconds'))} s)")

    results = run_zoo(out, scale=scale, only=only.split(",") if only else None, device=device, threads=threads,
                      resume=resume, overwrite=overwrite, progress=not quiet, on_entry=entry_line)
    if quiet:
        return
    from poslens.fmt import rich_table

    cols = ("final_loss", "eval_accuracy", "eval_accuracy_long", "train_seconds")
    Console().print(rich_table(f"zoo ({scale}) in {out}", ("name",) + cols,
                               [[name, *(s.get(c) for c in cols)] for name, s in results.items()]))
