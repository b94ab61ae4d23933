"""The slash training-dynamics experiment (arXiv 2601.08297, the shallow-transformer result).

A shallow RoPE transformer is trained by poslens' own trainer on the ``offset`` task (position t
must output the token Δ positions back, which one head can do by attending along the Δ-th
sub-diagonal). Weights are snapshotted at chosen steps (the trainer's ``stop_after`` + resume,
which reproduces the uninterrupted trajectory), and every snapshot is scanned twice with
:func:`poslens.capture.scan.run.run_scan`: on in-distribution prompts (``<bos>`` + random letters,
the task's own inputs) and on i.i.d. uniformly random tokens of the whole vocabulary. Per step
and head the run records SlashScore(Δ) (both prompt sets), the rank-one measures of pre-RoPE
q/k and the RoPE band usage of the rank-one decomposition (:mod:`poslens.analysis.slash`).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poslens.analysis.slash import decompose_scan, model_rope_geometry
from poslens.metrics.judge.commands import judge_dynamics
from poslens.metrics.rank import rank_table
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.data.tasks import encode_example, evaluate_task, get_task
from poslens.data.tokenizer import char_vocab
from poslens.errors import PoslensError, require_positive
from poslens.fmt import fmt
from poslens.models.train import TrainConfig, load_trained, train_model
from poslens.progress import task_progress
from poslens.rope import BANDS
from poslens.rundir.figures import new_figure, save_figure
from poslens.conventions import LAYER_CONVENTION
from poslens.rundir.summary import write_summary
from poslens.rundir.outdir import prepare_out_dir
from poslens.rundir.io import read_tensors, versions, write_json
from poslens.rundir.staging import staged_dir
from poslens.runtime import set_threads


@dataclass
class DynamicsConfig:
    out: str
    delta: int = 1
    steps: int = 300
    snapshots: list[int] = field(default_factory=lambda: [0, 20, 50, 100, 200, 300])
    layers: int = 1
    hidden: int = 64
    heads: int = 2
    kv_heads: int = 1
    batch_size: int = 32
    lr: float = 3e-3
    rope_theta: float = 10000.0
    scan_seqs: int = 32
    seq_len: int = 32
    kappa: float = 0.3
    seed: int = 0
    threads: int = 1
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda[:N]; resolved by poslens.runtime.parse_device
    figures: bool = True
    overwrite: bool = False  # replace the files of an existing run directory (else it must be new)


def _validate(cfg: DynamicsConfig) -> list[int]:
    snaps = sorted(set(int(s) for s in cfg.snapshots) | {cfg.steps})
    if cfg.steps < 1 or any(s < 0 or s > cfg.steps for s in snaps):
        raise PoslensError(f"--snapshots {cfg.snapshots}: every step must lie in 0..--steps {cfg.steps}.")
    if not 1 <= cfg.delta < cfg.seq_len - 1:
        raise PoslensError(f"--delta {cfg.delta}: must be between 1 and --seq-len - 2 ({cfg.seq_len - 2}).")
    if cfg.seq_len - 1 > 32:
        raise PoslensError(f"--seq-len {cfg.seq_len}: the offset task trains lengths up to 32 letters; pass 33 or less.")
    require_positive(("--num-seqs", cfg.scan_seqs), ("--batch-size", cfg.batch_size), ("--num-layers", cfg.layers))
    if not 0 < cfg.kappa <= 1:
        raise PoslensError(f"--kappa {cfg.kappa}: must lie in (0, 1].")
    return snaps


def _train_config(cfg: DynamicsConfig, train_dir: Path, stop_after: int, resume: bool):
    return TrainConfig(out=str(train_dir), pe="rope", task="offset", delta=cfg.delta, preset="micro",
                       layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, kv_heads=cfg.kv_heads,
                       rope_theta=cfg.rope_theta, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                       eval_every=0, eval_examples=200, checkpoint_every=0, seed=cfg.seed, device=cfg.device,
                       threads=cfg.threads, resume=resume, stop_after=stop_after if stop_after < cfg.steps else None,
                       progress=False)


def _in_distribution_prompts(path: Path, cfg: DynamicsConfig, vocab: dict) -> None:
    """JSONL of ``input_ids``: ``<bos>`` + seq_len - 1 random letters, the offset task's own inputs."""
    task = get_task("offset")
    rng = random.Random(f"dynamics-scan/{cfg.seed}")
    lines = [json.dumps({"input_ids": encode_example(task, rng, cfg.seq_len - 1, vocab, cfg.delta)[0]})
             for _ in range(cfg.scan_seqs)]
    path.write_text("\n".join(lines) + "\n")


def _snapshot(weights: Path, snap: Path, config) -> None:
    """A loadable model directory from a trainer checkpoint's ``model.safetensors``."""
    from safetensors.torch import load_model
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):  # the random init is overwritten; the global RNG is left alone
        model = AutoModelForCausalLM.from_config(config)
    load_model(model, str(weights))
    model.save_pretrained(str(snap))


def step_metrics(maps: dict, maps_random: dict, geometry: dict, delta: int) -> list[dict]:
    """Per head of one snapshot: SlashScore(Δ) in/random, rank-one measures, band usage, predicted peak."""
    slash, slash_r = maps["slash"].double(), maps_random["slash"].double()
    L, H, S = slash.shape
    ranks = rank_table(maps["q_gram"], maps["k_gram"])
    dec = decompose_scan({k: v.double() for k, v in maps.items()}, rotary_dim=geometry["rotary_dim"],
                         base=geometry["base"], scaling=geometry["scaling"], rope_layers=[True] * L, min_delta=1,
                         max_delta=min(S - 1, max(2 * delta, 8)))
    rows = []
    for r in dec:
        l, h = r["layer"], r["head"]
        rows.append({"layer": l, "head": h, "slash_in": float(slash[l, h, delta]),
                     "slash_random": float(slash_r[l, h, delta]), "q_top1": float(ranks["q_top1_energy"][l, h]),
                     "k_top1": float(ranks["k_top1_energy"][l, h]),
                     "q_effective_rank": float(ranks["q_effective_rank"][l, h]),
                     "band_usage": r["band_usage"], "predicted_peak": r["predicted_peak"],
                     "observed_peak": r["observed_peak"]})
    return rows


def run_dynamics(cfg: DynamicsConfig, progress: bool = True) -> dict:
    """Train, snapshot, scan and tabulate; writes the run directory ``cfg.out`` (see module doc)."""
    snaps = _validate(cfg)
    prepare_out_dir(cfg.out, must_be_new=not cfg.overwrite)
    t0 = time.time()
    with set_threads(cfg.threads), staged_dir(cfg.out) as stage, \
            task_progress("slash-dynamics", 2 * len(snaps), enabled=progress) as update:
        train_dir, snap_root = stage / "train", stage / "snapshots"
        snap_root.mkdir()
        _train_to_snapshots(cfg, snaps, train_dir, snap_root, update)
        geom = model_rope_geometry(str(train_dir))
        records = _scan_snapshots(cfg, snaps, geom, stage, train_dir, snap_root, update)
        if cfg.figures:
            save_figure(_figure(records, cfg), stage / "dynamics.png")
        summary = _summary(cfg, records, geom, wall_s=time.time() - t0)
        write_json(stage / "config.json", {"command": "slash-dynamics", **dataclasses.asdict(cfg),
                                           "versions": versions()})
        write_summary(stage, summary, command="slash-dynamics",
                      layers_describe="per training step under 'steps': heads named by decoder layer (from 0) "
                                      "and head index")
    return summary


def _train_to_snapshots(cfg: DynamicsConfig, snaps: list[int], train_dir: Path, snap_root: Path, update) -> None:
    """Train, stopping at each snapshot step; the trainer's ``checkpoint-<step>`` of every step before
    the last is kept as ``snap_root/.ck-<step>`` (progress ticks 1..len(snaps))."""
    for n, s in enumerate(snaps):
        train_model(_train_config(cfg, train_dir, s, resume=n > 0))
        if s < cfg.steps:
            shutil.copytree(train_dir / f"checkpoint-{s:08d}", snap_root / f".ck-{s}")
        update(n + 1, info=f"trained to step {s}")


def _snapshot_dir(cfg: DynamicsConfig, s: int, train_dir: Path, snap_root: Path, config) -> Path:
    """The loadable model directory of step ``s`` (from its kept checkpoint, or the final model), with
    the tokenizer files."""
    snap = snap_root / f"step-{s:06d}"
    if s < cfg.steps:
        ck = snap_root / f".ck-{s}"
        _snapshot(ck / "model.safetensors", snap, config)
        shutil.rmtree(ck)
    else:
        snap.mkdir()
        for f in ("config.json", "model.safetensors"):
            shutil.copy(train_dir / f, snap / f)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (train_dir / f).is_file():
            shutil.copy(train_dir / f, snap / f)
    return snap


def _scan_pair(cfg: DynamicsConfig, snap: Path, prompts: Path) -> dict:
    """The maps of two scans of one snapshot: ``in`` (the task's prompts) and ``random`` (i.i.d. tokens)."""
    scans = {}
    for kind, data in (("in", str(prompts)), ("random", "random")):
        sd = snap / f"scan-{kind}"
        run_scan(ScanConfig(model_dir=str(snap), out=str(sd), data=data, seq_len=cfg.seq_len, num_seqs=cfg.scan_seqs,
                            batch_size=8, seed=cfg.seed, device=cfg.device, dtype="fp32", figures=False),
                 progress=False)
        scans[kind] = read_tensors(sd / "maps.safetensors")
    return scans


def _scan_snapshots(cfg: DynamicsConfig, snaps: list[int], geom: dict, stage: Path, train_dir: Path,
                    snap_root: Path, update) -> list[dict]:
    """One record per snapshot step: train loss, task accuracy, per-head metrics and the best head
    (progress ticks len(snaps)+1..2 len(snaps))."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(train_dir))
    prompts = stage / "prompts_in_distribution.jsonl"
    _in_distribution_prompts(prompts, cfg, char_vocab())
    log = [json.loads(x) for x in (train_dir / "train_log.jsonl").read_text().splitlines() if x.strip()]
    loss_at = {r["step"]: r["loss"] for r in log if r.get("kind") == "train"}
    records = []
    for n, s in enumerate(snaps):
        snap = _snapshot_dir(cfg, s, train_dir, snap_root, config)
        scans = _scan_pair(cfg, snap, prompts)
        model, _, _ = load_trained(snap)
        acc = evaluate_task(model, "offset", count=200, seed=cfg.seed, delta=cfg.delta)
        heads = step_metrics(scans["in"], scans["random"], geom, cfg.delta)
        best = max(heads, key=lambda r: r["slash_in"])
        records.append({"step": s, "loss": loss_at.get(s), "accuracy": acc.get("eval_accuracy"),
                        "accuracy_long": acc.get("eval_accuracy_long"), "heads": heads, "best": best})
        update(len(snaps) + n + 1, info=f"scanned step {s}")
    return records


def _summary(cfg: DynamicsConfig, records: list[dict], geom: dict, wall_s: float) -> dict:
    """The run's summary: per-step records, the final slash-dominant head, the table and the judgement."""
    final = records[-1]["best"]
    rows = [[r["step"], r["loss"], r["accuracy"], f"{r['best']['layer']}.{r['best']['head']}", r["best"]["slash_in"],
             r["best"]["slash_random"], r["best"]["q_top1"], r["best"]["k_top1"],
             " / ".join(fmt(r["best"]["band_usage"][b]) for b in BANDS), r["best"]["predicted_peak"]]
            for r in records]
    summary = {
        "experiment": "slash-dynamics", "paper": "slash",
        "title": f"Training dynamics of a {cfg.layers}-layer RoPE transformer on the offset task (Δ = {cfg.delta})",
        "config": dataclasses.asdict(cfg), "geometry": geom, "steps": records,
        "final_sdh": {**final, "persists": final["slash_random"] >= cfg.kappa and final["slash_in"] >= cfg.kappa},
        "tables": [{"title": f"the most slash-dominant head at Δ = {cfg.delta} per training step (head = "
                             "layer.head, decoder layers from 0)",
                    "columns": ["step", "train loss", "task accuracy", "head", f"SlashScore({cfg.delta}) in-dist.",
                                f"SlashScore({cfg.delta}) random", "q σ1²/Σσ²", "k σ1²/Σσ²",
                                "band use high/med/low", "predicted peak Δ"], "rows": rows}],
        "layer_convention": LAYER_CONVENTION,
        "figures": [{"file": "dynamics.png", "caption": f"Over training: SlashScore({cfg.delta}) of the "
                     "best head on task prompts and on random tokens, rank-one-ness of its pre-RoPE q/k, and "
                     "its RoPE band usage."}] if cfg.figures else [],
        "wall_s": wall_s,
    }
    summary["judgement"] = judge_dynamics(summary)
    return summary


def _figure(records: list[dict], cfg: DynamicsConfig):
    steps = [r["step"] for r in records]
    fig, axes = new_figure(1, 3, figsize=(12, 3.3))
    axes[0].plot(steps, [r["best"]["slash_in"] for r in records], "o-", label="task prompts")
    axes[0].plot(steps, [r["best"]["slash_random"] for r in records], "s--", label="random tokens")
    axes[0].axhline(cfg.kappa, color="grey", lw=0.8, ls=":")
    axes[0].set_title(f"SlashScore({cfg.delta}) of the best head", fontsize=9)
    axes[0].legend(fontsize=7)
    axes[1].plot(steps, [r["best"]["q_top1"] for r in records], "o-", label="q")
    axes[1].plot(steps, [r["best"]["k_top1"] for r in records], "s-", label="k")
    axes[1].set_title("σ1²/Σσ² of pre-RoPE q/k", fontsize=9)
    axes[1].legend(fontsize=7)
    for b in BANDS:
        axes[2].plot(steps, [r["best"]["band_usage"][b] for r in records], "o-", label=b)
    axes[2].set_title("RoPE band usage (share of Σ A_l)", fontsize=9)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("training step")
    fig.tight_layout()
    return fig
