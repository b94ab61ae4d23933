"""Random-initialisation sweep of arXiv 2501.00073: does the adjacency pattern need small weights?

For every shape (layers x width) and every weight scale sigma, a NoPE model of poslens' NoPE
family (:func:`poslens.models.families.build_model` with ``pe="none"``: a Llama-style decoder with no
positional encoding) is initialised with every weight matrix and the embedding drawn from
N(0, sigma^2) (norm gains 1, no biases: what transformers' initialisation does with
``initializer_range = sigma``), and its per-layer APS is measured on i.i.d. random printable-ASCII
sequences, causal and with the bidirectional control.

Only sigma changes between the models of one shape: the weights are the same standard-normal
draw (seeded) times sigma, so differences along a row of the table are the effect of scale alone.
The paper's models are nanoGPT (LayerNorm, GELU, learned/none PE); poslens' NoPE family uses
RMSNorm and SwiGLU, so the numbers are the same experiment on a different, modern block.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import torch

from poslens.analysis.neighborhood import measure_neighborhood, use_poslens_attention
from poslens.data.tokens import random_tokens
from poslens.errors import OptionError, PoslensError
from poslens.fmt import fmt, fmt_pm
from poslens.models.families import build_model
from poslens.metrics.judge.commands import judge_sweep
from poslens.progress import task_progress
from poslens.rundir.figures import new_figure, save_figures
from poslens.rundir.outdir import prepare_out_dir
from poslens.rundir.staging import staged_dir
from poslens.rundir.io import versions, write_json, write_tensors
from poslens.rundir.summary import write_summary
from poslens.runtime import parse_device

PAPER_SIGMAS = (0.0002, 0.002, 0.02, 0.08, 0.2, 2.0)
#: how the per-layer lists of ``results`` (and the tensors' layer axis) count
LAYER_INDEX = "index 0 = the token embeddings, index k = decoder layer k - 1 (decoder layers counted from 0)"
DEFAULT_SHAPES = ("6x384", "2x384", "6x128")  # paper's 6 layers x d=384, then shallower, then narrower
ASCII_LO, ASCII_HI = 32, 127  # printable ASCII: the token ids of a character-level model


@dataclass
class SweepConfig:
    """Every option of ``poslens sweep``."""

    out: str
    sigmas: list[float] = field(default_factory=lambda: list(PAPER_SIGMAS))
    shapes: list[str] = field(default_factory=lambda: list(DEFAULT_SHAPES))
    seq_len: int = 64
    num_seqs: int = 16
    batch_size: int = 16
    seed: int = 0
    bidirectional: bool = True  # also measure the non-causal control
    figures: bool = True
    overwrite: bool = False
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda[:N]; resolved by poslens.runtime.parse_device


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"6x384"`` -> ``(layers, hidden, heads)`` with head dimension 64 (one head below width 128)."""
    try:
        a, b = text.lower().split("x")
        layers, hidden = int(a), int(b)
    except ValueError:
        raise PoslensError(f"--shapes {text!r}: expected LAYERSxWIDTH, e.g. 6x384.") from None
    if layers < 1 or hidden < 2 or hidden % 2:
        raise PoslensError(f"--shapes {text!r}: need >= 1 layer and an even width >= 2.")
    heads = max(1, hidden // 64)
    while hidden % heads or (hidden // heads) % 2:
        heads -= 1
    return layers, hidden, heads


def reinit_normal(model, sigma: float, seed: int = 0):
    """Redraw every weight matrix and embedding from N(0, sigma^2) in place (gains 1, biases 0).

    The standard-normal draw depends only on ``seed``, so models at different ``sigma`` are the
    same weights rescaled.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied embeddings are listed once
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * sigma)
            elif name.endswith("weight"):  # 1-D weights are norm gains
                p.fill_(1.0)
            else:
                p.zero_()
    return model


def build_sweep_model(shape: str, seq_len: int, vocab_size: int = 128, seed: int = 0):
    """An untrained NoPE model of ``shape`` (multi-head, MLP 8/3 x width) using the poslens attention."""
    layers, hidden, heads = parse_shape(shape)
    model = build_model("none", "small", vocab_size, seed=seed, layers=layers, hidden=hidden, heads=heads,
                        kv_heads=heads, max_positions=max(seq_len, 64)).eval()
    return use_poslens_attention(model)


def validate(cfg: SweepConfig) -> None:
    if not cfg.sigmas or any(not (s > 0 and math.isfinite(s)) for s in cfg.sigmas):
        raise PoslensError(f"--sigmas {cfg.sigmas}: every sigma must be a positive number.")
    if not cfg.shapes:
        raise PoslensError("--shapes: give at least one LAYERSxWIDTH shape.")
    for s in cfg.shapes:
        parse_shape(s)
    if cfg.seq_len < 3:
        raise PoslensError(f"--seq-len {cfg.seq_len}: the APS needs at least 3 positions.")
    for flag, v in (("--num-seqs", cfg.num_seqs), ("--batch-size", cfg.batch_size)):
        if v < 1:
            raise OptionError(flag, v, "must be a positive integer.")
    prepare_out_dir(cfg.out, must_be_new=not cfg.overwrite)


def measure_sweep(cfg: SweepConfig, progress: bool = True) -> dict[str, dict]:
    """``{shape: {"causal": {"aps": [S, K, N], "norm_score": [S, K, N]}, "bidirectional": ...}}``."""
    modes = ["causal"] + (["bidirectional"] if cfg.bidirectional else [])
    ids = random_tokens(0, cfg.num_seqs, cfg.seq_len, pool=range(ASCII_LO, ASCII_HI), seed=cfg.seed)  # printable ASCII
    total = len(cfg.shapes) * len(cfg.sigmas) * len(modes)
    out: dict[str, dict] = {}
    done = 0
    with task_progress("sweep", total=total, enabled=progress) as update:
        for shape in cfg.shapes:
            model = build_sweep_model(shape, cfg.seq_len, seed=cfg.seed).to(parse_device(cfg.device))
            per_mode = {m: {"aps": [], "norm_score": []} for m in modes}
            for sigma in cfg.sigmas:
                reinit_normal(model, sigma, seed=cfg.seed)
                for mode in modes:
                    r = measure_neighborhood(model, ids, bidirectional=mode == "bidirectional",
                                             batch_size=cfg.batch_size, families=("attn",))
                    per_mode[mode]["aps"].append(r["aps"])
                    per_mode[mode]["norm_score"].append(r["norm_score"])
                    done += 1
                    update(done, info=f"{shape} σ={sigma:g} {mode}")
            out[shape] = {m: {k: torch.stack(v).cpu() for k, v in d.items()} for m, d in per_mode.items()}
            del model
    return out


def _std(x: torch.Tensor) -> float:
    return float(x.std(unbiased=True)) if x.numel() > 1 else float("nan")


def build_summary(cfg: SweepConfig, res: dict[str, dict]) -> dict:
    results, rows = [], []
    for shape, by_mode in res.items():
        layers, hidden, heads = parse_shape(shape)
        for si, sigma in enumerate(cfg.sigmas):
            c = by_mode["causal"]["aps"][si]  # [K, N]
            ns = by_mode["causal"]["norm_score"][si]
            rec = {"shape": shape, "layers": layers, "hidden": hidden, "heads": heads, "sigma": sigma,
                   "aps_causal_mean": c.mean(1).tolist(),
                   "aps_causal_std": c.std(1).tolist() if c.shape[1] > 1 else None,
                   "norm_score_causal_mean": ns.mean(1).tolist()}
            row = [shape, sigma, fmt_pm(float(c[1].mean()), _std(c[1])), float(c[1:].mean()), float(c[-1].mean()),
                   float(ns[1].mean())]
            if "bidirectional" in by_mode:
                b = by_mode["bidirectional"]["aps"][si]
                rec["aps_bidirectional_mean"] = b.mean(1).tolist()
                rec["aps_bidirectional_std"] = b.std(1).tolist() if b.shape[1] > 1 else None
                row += [fmt_pm(float(b[1].mean()), _std(b[1])), float(b[1:].mean())]
            results.append(rec)
            rows.append(row)
    cols = ["shape (layers x width)", "σ", "APS layer 0 causal", "APS mean over layers, causal",
            "APS last layer, causal", "norm score layer 0, causal"]
    if cfg.bidirectional:
        cols += ["APS layer 0 bidirectional", "APS mean over layers, bidirectional"]
    summary = {
        "experiment": "sweep", "paper": "neighborhood",
        "title": "Random-init sweep: adjacency pattern (APS) of untrained NoPE models vs weight scale σ",
        "sigmas": list(cfg.sigmas), "shapes": list(cfg.shapes), "seq_len": cfg.seq_len, "num_seqs": cfg.num_seqs,
        "inputs": "i.i.d. uniform printable-ASCII character ids",
        "results": results,
        "bidirectional": bool(cfg.bidirectional), "layer_index": LAYER_INDEX,
        "tables": [{"title": "APS by weight scale σ and shape (head outputs; mean ± std over sequences; "
                             "0.5 = chance, 1 = perfect adjacency; decoder layers from 0, means over decoder layers)",
                    "columns": cols, "rows": rows, "note": LAYER_INDEX}],
    }
    summary["judgement"] = judge_sweep(summary)
    return summary


def sweep_figures(cfg: SweepConfig, res: dict[str, dict]) -> list[tuple[str, object, str]]:
    figs = []
    fig, axes = new_figure(1, 2, figsize=(9.5, 3.4))
    for n, (shape, by_mode) in enumerate(res.items()):
        color = f"C{n}"
        for mode, ls in (("causal", "-"), ("bidirectional", "--")):
            if mode not in by_mode:
                continue
            a = by_mode[mode]["aps"]  # [S, K, N]
            axes[0].errorbar(cfg.sigmas, a[:, 1].mean(-1).tolist(),
                             yerr=a[:, 1].std(-1).tolist() if a.shape[-1] > 1 else None, color=color, ls=ls,
                             marker="o", capsize=3, label=f"{shape} {mode}")
            axes[1].plot(cfg.sigmas, a[:, 1:].mean(dim=(1, 2)).tolist(), color=color, ls=ls, marker="o",
                         label=f"{shape} {mode}")
    for ax, t in zip(axes, ("decoder layer 0 (the first attention layer)", "mean over decoder layers")):
        ax.set_xscale("log")
        ax.axhline(0.5, color="gray", lw=0.8, ls=":")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("init σ")
        ax.set_ylabel("APS")
        ax.set_title(t, fontsize=9)
    axes[1].legend(fontsize=7)
    fig.suptitle("Random-init NoPE models: APS vs weight scale (solid causal, dashed bidirectional)", fontsize=10)
    fig.tight_layout()
    figs.append(("sweep_aps.png", fig, "APS of untrained NoPE models against the init σ (log scale), per shape; "
                                       "error bars = std over sequences."))
    shape = cfg.shapes[0]
    a = res[shape]["causal"]["aps"].mean(-1)  # [S, K]
    fig, ax = new_figure(figsize=(4.8, 3.4))
    im = ax.imshow(a.T.numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(cfg.sigmas)), [f"{s:g}" for s in cfg.sigmas], fontsize=7)
    ax.set_xlabel("init σ")
    ax.set_ylabel("decoder layer from 0 (bottom row: embeddings)")
    ax.set_yticks(range(a.shape[1]), ["emb."] + [str(k) for k in range(a.shape[1] - 1)], fontsize=7)
    for s in range(a.shape[0]):
        for k in range(a.shape[1]):
            v = float(a[s, k])
            ax.text(s, k, fmt(v), ha="center", va="center", fontsize=6, color="w" if v < 0.6 else "k")
    ax.figure.colorbar(im, ax=ax)
    ax.set_title(f"{shape}: causal APS by layer and σ", fontsize=9)
    fig.tight_layout()
    figs.append(("sweep_layers.png", fig, f"Causal APS of the embeddings and every decoder layer (from 0) of the "
                                          f"{shape} model at each σ."))
    return figs


def run_sweep(cfg: SweepConfig, progress: bool = True) -> dict:
    """Run the sweep and write ``config.json``, ``sweep.safetensors``, ``summary.json`` and figures."""
    t0 = time.time()
    validate(cfg)
    res = measure_sweep(cfg, progress=progress)
    summary = build_summary(cfg, res)
    with staged_dir(cfg.out) as stage:
        write_json(stage / "config.json", {"command": "sweep", **dataclasses.asdict(cfg), "versions": versions()})
        tensors = {f"{shape}.{mode}.{k}": v.to(torch.float32) for shape, by_mode in res.items()
                   for mode, d in by_mode.items() for k, v in d.items()}
        write_tensors(stage / "sweep.safetensors", tensors,
                      metadata={"layout": "[sigma, layer index (0 = embeddings, k = decoder layer k - 1), sequence]",
                                "sigmas": list(cfg.sigmas)})
        summary["figures"] = save_figures(stage, sweep_figures(cfg, res) if cfg.figures else [])
        summary["wall_s"] = time.time() - t0
        write_summary(stage, summary, command="sweep", layers_describe="per shape and σ under 'results': lists "
                      "over the embeddings and then decoder layers from 0 (head outputs)")
    return summary
