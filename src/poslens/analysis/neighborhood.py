"""Neighbourhood analysis of arXiv 2501.00073: self-cosine maps, APS and norm score per layer.

For every sequence and every layer the vectors ``h_1 .. h_T`` give a self-cosine matrix
``S[i, j] = cos(h_i, h_j)``; the adjacency probability score (APS,
:func:`poslens.metrics.adjacency_probability_score`) counts how often row i is more similar to a
nearer earlier key than to a farther one (1 = perfect adjacency, 0.5 = chance), and the norm
score applies the same count to ``-||h_i||`` (1 = norms shrink monotonically with position).
Both are reported as mean +- std over sequences, per layer, as in the paper.

Which vectors. Following the paper's code, the token embeddings (the input of decoder layer 0)
come first, then, for each decoder layer (counted from 0, as everywhere in poslens), the
concatenated head outputs before the output projection (``attn``: the adapter's ``attn_z`` capture point). The residual stream after each decoder layer (``resid``) is
measured too, because it is what later layers read.

Controls. The model runs through poslens' registered attention function
(:mod:`poslens.capture.engine.attention`); the bidirectional intervention
(:func:`poslens.capture.engine.intervene.bidirectional_control`) drops the causal mask there in every
layer (the paper's non-causal control) without touching the weights or the modules.

Per-sequence maps are needed (the APS of a mean map is not the mean APS), so this module keeps
``batch x T x d`` vectors per layer for one batch at a time and reduces them immediately; memory is
bounded by one batch, never by the number of sequences.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from poslens.capture.model.adapters import get_adapter
from poslens.capture.engine.attention import ATTN_NAME, register
from poslens.capture.engine.intervene import bidirectional_control
from poslens.capture.engine.loop import forward, hooked
from poslens.capture.model.source import source_record
from poslens.capture.model.load import load_model, load_tokenizer, open_model_config
from poslens.metrics.diagonal import causal_view
from poslens.data.sources import make_source
from poslens.data.tokenizer import char_ids
from poslens.data.tokens import random_tokens
from poslens.conventions import LAYER_CONVENTION
from poslens.errors import PoslensError, require_positive
from poslens.fmt import fmt_pm
from poslens.metrics.judge.commands import judge_neighborhood
from poslens.metrics.neighborhood import adjacency_probability_score, norm_score, self_cosine, theory_gap
from poslens.models.families import pe_of
from poslens.progress import task_progress
from poslens.rundir.figures import new_figure, save_figures
from poslens.rundir.outdir import prepare_out_dir
from poslens.rundir.staging import staged_dir
from poslens.rundir.io import versions, write_json, write_tensors
from poslens.rundir.summary import write_summary
from poslens.runtime import no_hf_progress_bars, parse_device

#: families of vectors measured per layer
FAMILIES = ("attn", "resid")


# --------------------------------------------------------------------------------------------
# running a model and collecting per-layer vectors
# --------------------------------------------------------------------------------------------
def use_poslens_attention(model):
    """Switch ``model`` (in place) to poslens' registered attention function; returns it.

    Outputs are those of the ``sdpa`` implementation; the switch is what makes the
    bidirectional control possible without editing the model.
    """
    register()
    if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        model.set_attn_implementation(ATTN_NAME)
    return model


@torch.no_grad()
def collect_vectors(model, input_ids: torch.Tensor, *, bidirectional: bool = False, adapter=None
                    ) -> dict[str, torch.Tensor]:
    """Per-layer vectors of one batch: ``{"attn": L+1 tensors [B, T, .], "resid": [L+1, B, T, d]}``.

    Index 0 of both is the token embeddings (decoder layer 0's input). ``attn[k]`` (k >= 1) is the
    concatenated head outputs of decoder layer k − 1 (layers count from 0) before the output
    projection; ``resid[k]`` the residual stream after decoder layer k − 1. ``attn`` is a list because its widths may differ
    (embedding width vs heads x head_dim). The model must already use the
    poslens attention (:func:`use_poslens_attention`) when ``bidirectional`` is set.
    """
    adapter = adapter or get_adapter(model.config)
    L = len(adapter.decoder_layers(model))
    attn: list[torch.Tensor | None] = [None] * (L + 1)
    resid: list[torch.Tensor | None] = [None] * (L + 1)

    def keep(store, i):
        def fn(x):
            store[i] = x.detach().float()
        return fn

    points = {("resid_pre", 0): keep(resid, 0)}
    for l in range(L):
        points[("attn_z", l)] = keep(attn, l + 1)
        points[("resid_post", l)] = keep(resid, l + 1)
    if bidirectional and getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        raise PoslensError("the bidirectional control needs the poslens attention; call use_poslens_attention(model).")
    control = bidirectional_control(adapter.attention_module(model, l) for l in range(L)) if bidirectional else None
    with hooked(model, adapter, points), control.active() if control is not None else contextlib.nullcontext():
        forward(model, input_ids)
    attn[0] = resid[0]
    return {"attn": attn, "resid": torch.stack(resid)}


# --------------------------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def measure_neighborhood(model, ids: torch.Tensor, *, bidirectional: bool = False, batch_size: int = 8,
                         adapter=None, update: Callable[[int], None] | None = None,
                         families: tuple[str, ...] = FAMILIES) -> dict[str, torch.Tensor]:
    """Per-sequence APS and norm score and mean maps for every layer over ``ids [N, T]``.

    Returns float64 tensors over ``K = L + 1`` indices (0 = embeddings, k = decoder layer k − 1), for each family
    ``f`` in ``attn``/``resid`` (keys prefixed ``resid_`` for the residual stream):
    ``aps [K, N]``, ``norm_score [K, N]``, ``cosine [K, T, T]`` (mean over sequences),
    ``norms [K, T]`` (mean norm by position). ``families`` limits the work to some of them.
    """
    bad = [f for f in families if f not in FAMILIES]
    if bad:
        raise ValueError(f"unknown vector families {bad}; choose from {FAMILIES}")
    device = next(model.parameters()).device
    N, T = ids.shape
    if T < 3:
        raise PoslensError(f"--seq-len {T}: the APS counts position triples; use at least 3 tokens.")
    acc: dict[str, list] = {}
    cos_sum: dict[str, torch.Tensor] = {}
    norm_sum: dict[str, torch.Tensor] = {}

    for s in range(0, N, batch_size):
        batch = ids[s: s + batch_size].to(device)
        vecs = collect_vectors(model, batch, bidirectional=bidirectional, adapter=adapter)
        for fam in families:
            pre = "" if fam == "attn" else "resid_"
            per_layer_aps, per_layer_ns = [], []
            for k, x in enumerate(vecs[fam]):
                cos = self_cosine(x)  # [B, T, T]
                nrm = x.to(torch.float64).norm(dim=-1)  # [B, T]
                per_layer_aps.append(adjacency_probability_score(cos))
                per_layer_ns.append(norm_score(nrm))
                key = f"{pre}{k}"
                cos_sum[key] = cos_sum.get(key, 0) + cos.sum(0)
                norm_sum[key] = norm_sum.get(key, 0) + nrm.sum(0)
            acc.setdefault(f"{pre}aps", []).append(torch.stack(per_layer_aps))
            acc.setdefault(f"{pre}norm_score", []).append(torch.stack(per_layer_ns))
        if update is not None:
            update(min(N, s + batch_size))
    out = {k: torch.cat(v, dim=1) for k, v in acc.items()}
    K = len(vecs["resid"])
    for fam in families:
        pre = "" if fam == "attn" else "resid_"
        out[f"{pre}cosine"] = torch.stack([cos_sum[f"{pre}{k}"] / N for k in range(K)])
        out[f"{pre}norms"] = torch.stack([norm_sum[f"{pre}{k}"] / N for k in range(K)])
    return out


def layer_rows(measured: dict[str, torch.Tensor], prefix: str = "") -> list[dict]:
    """Per tensor index ``{"layer", "aps_mean", "aps_std", "norm_score_mean", "norm_score_std"}``
    (``layer``: the tensor index, 0 = embeddings; the summary names them with :func:`layer_name`)."""
    aps, ns = measured[f"{prefix}aps"], measured[f"{prefix}norm_score"]
    n = aps.shape[1]

    def std(x):
        return float(x.std(unbiased=True)) if n > 1 else float("nan")
    return [{"layer": k, "aps_mean": float(aps[k].mean()), "aps_std": std(aps[k]),
             "norm_score_mean": float(ns[k].mean()), "norm_score_std": std(ns[k])} for k in range(aps.shape[0])]


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------
@dataclass
class NeighborhoodConfig:
    """Every option of ``poslens neighborhood`` (the CLI maps its flags one to one)."""

    model_dir: str
    out: str
    data: str = "random"
    seq_len: int = 64
    num_seqs: int = 32
    batch_size: int = 8
    seed: int = 0
    bidirectional: bool = False  # also run the bidirectional control, side by side
    chars: str | None = None  # random sequences over these characters (after BOS) instead of --data
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda[:N]; resolved by poslens.runtime.parse_device
    figures: bool = True
    overwrite: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False


def _plan(cfg: NeighborhoodConfig, model=None, given_tokenizer=None):
    """Validate every input and build the sequence source; writes nothing. ``model``: a loaded causal LM
    (its config, device and tokenizer are used instead of the directory's)."""
    require_positive(("--num-seqs", cfg.num_seqs), ("--batch-size", cfg.batch_size))
    if cfg.seq_len < 3:
        raise PoslensError(f"--seq-len {cfg.seq_len}: the APS counts position triples; use at least 3 tokens.")
    if model is not None:
        from poslens.capture.model.borrow import model_device
        from poslens.capture.scan.plan import loaded_model_config, loaded_model_tokenizer

        config, adapter = loaded_model_config(model, seq_len=cfg.seq_len)
        device = model_device(model)
        tokenizer = given_tokenizer if given_tokenizer is not None else loaded_model_tokenizer(model)
    else:
        config, adapter = open_model_config(cfg.model_dir, seq_len=cfg.seq_len, allow_pickle=cfg.allow_pickle,
                                            trust_remote_code=cfg.trust_remote_code)
        device = parse_device(cfg.device)
        tokenizer = None

    def _tokenizer():
        return tokenizer if model is not None else load_tokenizer(cfg.model_dir, cfg.trust_remote_code)

    prepare_out_dir(cfg.out, must_be_new=not cfg.overwrite)
    if cfg.chars is not None:
        if cfg.data != "random":
            raise PoslensError("--chars and --data both choose the sequences; pass only one of them.")
        tok = _tokenizer()
        if tok is None:
            raise PoslensError(f"--chars needs the model's tokenizer, and {cfg.model_dir} has none; use --data.")
        source = CharSource(tok, cfg.chars, cfg.seq_len, cfg.num_seqs, cfg.seed)
    else:
        tok = None if cfg.data == "random" else _tokenizer()
        source = make_source(cfg.data, seq_len=cfg.seq_len, num_seqs=cfg.num_seqs, seed=cfg.seed, tokenizer=tok,
                             vocab_size=getattr(config, "vocab_size", None))
    return config, adapter, source, device


class CharSource:
    """I.i.d. uniform sequences over ``chars`` (one token each), after BOS when the tokenizer has one."""

    def __init__(self, tokenizer, chars: str, seq_len: int, num_seqs: int, seed: int):
        self.chars, self.seed, self.seq_len = chars, seed, seq_len
        self.bos = getattr(tokenizer, "bos_token_id", None)
        self.num_seqs = num_seqs
        self.pool = char_ids(tokenizer, chars, "--chars")

    def batch(self, start: int, stop: int) -> torch.Tensor:
        return random_tokens(start, stop, self.seq_len, pool=self.pool, seed=self.seed, bos=self.bos)

    def describe(self) -> dict:
        return {"kind": "chars", "chars": self.chars, "bos": self.bos, "seq_len": self.seq_len,
                "num_seqs": self.num_seqs, "seed": self.seed}


def run_neighborhood(cfg: NeighborhoodConfig, progress: bool = True, *, model=None, tokenizer=None) -> dict:
    """Measure APS / norm score per layer (causal, and with ``bidirectional`` the control) into ``cfg.out``.
    ``model`` / ``tokenizer``: a loaded causal LM and its text tokenizer (default: the one saved beside it).

    Writes ``config.json``, ``neighborhood.safetensors``, ``summary.json`` and figures through a
    staging directory (nothing is half-written); returns the summary.
    """
    t0 = time.time()
    config, adapter, source, device = _plan(cfg, model, tokenizer)
    if model is not None:  # a loaded model: poslens attention and eval mode for the call, restored after
        from poslens.capture.model.borrow import borrowed

        with borrowed(model):
            return _run_neighborhood(cfg, progress, model, config, adapter, source, t0)
    with no_hf_progress_bars(not progress):  # --quiet: no weight-loading bars either
        model = load_model(cfg.model_dir, dtype=torch.float32, device=device, allow_pickle=cfg.allow_pickle,
                           trust_remote_code=cfg.trust_remote_code)
    return _run_neighborhood(cfg, progress, model, config, adapter, source, t0)


def _run_neighborhood(cfg: NeighborhoodConfig, progress: bool, model, config, adapter, source, t0: float) -> dict:
    ids = source.batch(0, source.num_seqs)
    modes = ["causal"] + (["bidirectional"] if cfg.bidirectional else [])
    results = {}
    N = ids.shape[0]
    with task_progress("neighbourhood", total=N * len(modes), enabled=progress) as update:
        for m, mode in enumerate(modes):
            results[mode] = measure_neighborhood(
                model, ids, bidirectional=mode == "bidirectional", batch_size=cfg.batch_size, adapter=adapter,
                update=lambda d, m=m, mode=mode: update(m * N + d, info=mode))
            # the summary and the files are made on the CPU (a GPU run's tensors would meet CPU tables)
            results[mode] = {k: v.cpu() if torch.is_tensor(v) else v for k, v in results[mode].items()}
    summary = build_summary(results, cfg=cfg, pe=pe_of(config), model_type=adapter.model_type, num_seqs=N,
                            source=source.describe())
    with staged_dir(cfg.out) as stage:
        write_json(stage / "config.json", {"command": "neighborhood", **dataclasses.asdict(cfg),
                                           "model_source": source_record(cfg.model_dir)
                                           if not cfg.model_dir.startswith("<in-memory") else
                                           {"kind": "in-memory", "class": type(model).__name__},
                                           "source": source.describe(), "versions": versions()})
        tensors = {f"{mode}.{k}": v.to(torch.float32) for mode, r in results.items() for k, v in r.items()}
        write_tensors(stage / "neighborhood.safetensors", tensors,
                      metadata={"layer_index": "tensor index 0 = token embeddings, k = decoder layer k - 1 (decoder "
                                               "layers count from 0; attn: head outputs before the output "
                                               "projection; resid_: residual stream after the layer)",
                                "modes": modes})
        summary["figures"] = save_figures(stage, neighborhood_figures(results, title=Path(cfg.model_dir).name)
                                          if cfg.figures else [])
        summary["wall_s"] = time.time() - t0
        write_summary(stage, summary, command="neighborhood",
                      layers_describe="per decoder layer: head outputs before the output projection (aps_*, "
                                      "norm_score_*) and the residual stream after the layer (resid_*); "
                                      "'embeddings': the token embeddings",
                      convention=LAYER_CONVENTION)
    return summary


def layer_name(k: int):
    """The summary's name of tensor index ``k`` (0 = the embeddings, k = decoder layer k − 1)."""
    return "embeddings" if k == 0 else k - 1


def layer_title(k: int) -> str:
    """``"embeddings"`` or ``"layer N"`` (decoder layers from 0) for tensor index ``k``."""
    return "embeddings" if k == 0 else f"layer {k - 1}"


#: how the layers of a neighbourhood summary count (tensors keep index 0 = embeddings, k = layer k − 1)


def _model_name(cfg, fallback: str) -> str:
    """The model's name as the fingerprint gives it (the directory's name, the ``.gguf`` file's stem),
    else ``fallback`` (its model_type)."""
    from poslens.capture.model.source import model_names

    return model_names([str(cfg.model_dir)])[0] if cfg is not None and cfg.model_dir else str(fallback)


def build_summary(results: dict[str, dict], *, cfg=None, pe: str = "?", model_type: str = "?", num_seqs: int = 0,
                  source: dict | None = None) -> dict:
    """Tables, the judgement (:func:`poslens.metrics.judge.commands.judge_neighborhood`, from the
    numbers) and per-layer values of a neighbourhood run. ``layers`` holds the embeddings
    (``"layer": "embeddings"``) and then decoder layers from 0."""
    causal = results["causal"]
    bid = results.get("bidirectional")
    rows_c = layer_rows(causal)
    rows_rc = layer_rows(causal, "resid_")
    rows_b = layer_rows(bid) if bid is not None else None
    K = len(rows_c)
    layers = []
    for k in range(K):
        d = {"layer": layer_name(k), "vectors": "token embeddings" if k == 0 else
             "head outputs (before the output projection); resid_*: residual stream after the layer",
             **{key: rows_c[k][key] for key in ("aps_mean", "aps_std", "norm_score_mean", "norm_score_std")},
             "resid_aps_mean": rows_rc[k]["aps_mean"], "resid_aps_std": rows_rc[k]["aps_std"],
             "resid_norm_score_mean": rows_rc[k]["norm_score_mean"]}
        if rows_b is not None:
            d.update(bidirectional_aps_mean=rows_b[k]["aps_mean"], bidirectional_aps_std=rows_b[k]["aps_std"],
                     bidirectional_norm_score_mean=rows_b[k]["norm_score_mean"])
        layers.append(d)
    cols = ["layer", "APS causal (mean ± std)", "norm score causal", "resid APS causal"]
    if rows_b is not None:
        cols += ["APS bidirectional", "norm score bidirectional"]
    rows = []
    for k in range(K):
        r = [layer_name(k), fmt_pm(rows_c[k]["aps_mean"], rows_c[k]["aps_std"]),
             fmt_pm(rows_c[k]["norm_score_mean"], rows_c[k]["norm_score_std"]),
             fmt_pm(rows_rc[k]["aps_mean"], rows_rc[k]["aps_std"])]
        if rows_b is not None:
            r += [fmt_pm(rows_b[k]["aps_mean"], rows_b[k]["aps_std"]),
                  fmt_pm(rows_b[k]["norm_score_mean"], rows_b[k]["norm_score_std"])]
        rows.append(r)
    gap0 = theory_gap(causal["cosine"][1]) if K > 1 else float("nan")
    T = causal["cosine"].shape[-1]
    summary = {
        "experiment": "neighborhood", "paper": "neighborhood",
        "title": f"Adjacency of nearby embeddings ({pe} PE, {_model_name(cfg, model_type)}): APS per layer",
        "model_dir": str(cfg.model_dir) if cfg else None, "pe": pe, "model_type": model_type,
        "num_seqs": num_seqs, "seq_len": T, "source": source,
        "modes": list(results), "layers": layers, "layer_convention": LAYER_CONVENTION,
        "theory_gap_layer0": gap0,
        "tables": [{"title": "APS and norm score per layer (mean ± std over sequences; embeddings, then decoder "
                             "layers from 0)", "columns": cols, "rows": rows, "note": LAYER_CONVENTION}],
    }
    summary["judgement"] = judge_neighborhood(summary)
    return summary


def _pick_layers(K: int, max_panels: int = 7) -> list[int]:
    if K <= max_panels:
        return list(range(K))
    return sorted(set(torch.linspace(0, K - 1, max_panels).round().long().tolist()))


def neighborhood_figures(results: dict[str, dict], title: str = "") -> list[tuple[str, object, str]]:
    """``(file, figure, caption)`` for the cosine maps (per mode) and APS / norm score by layer."""
    from poslens.figures import layer_grid

    figs = []
    for mode, r in results.items():
        K = r["cosine"].shape[0]
        sel = _pick_layers(K)
        maps = [causal_view(r["cosine"][k]) for k in sel]
        titles = [layer_title(k) for k in sel]
        fig = layer_grid(maps, titles=titles, suptitle=f"{title} mean self-cosine similarity ({mode})", cmap="rocket")
        name = "cosine_maps.png" if mode == "causal" else f"cosine_maps_{mode}.png"
        figs.append((name, fig, f"Mean over sequences of cos(h_i, h_j) per layer, {mode} attention "
                                f"(the embeddings, then the head outputs of decoder layers from 0; upper triangle blank)."))
    fig, axes = new_figure(1, 2, figsize=(9, 3.2))
    for mode, r in results.items():
        K = r["aps"].shape[0]
        x = list(range(-1, K - 1))  # −1: the embeddings, then decoder layers from 0
        ls = "-" if mode == "causal" else "--"
        axes[0].errorbar(x, r["aps"].mean(1).tolist(), yerr=r["aps"].std(1).tolist() if r["aps"].shape[1] > 1 else None,
                         ls=ls, marker="o", capsize=3, label=f"head outputs, {mode}")
        axes[0].plot(x, r["resid_aps"].mean(1).tolist(), ls=ls, marker="x", alpha=0.6, label=f"residual, {mode}")
        axes[1].plot(x, r["norm_score"].mean(1).tolist(), ls=ls, marker="o", label=f"head outputs, {mode}")
    for ax, name in zip(axes, ("APS", "norm score")):
        ax.axhline(0.5, color="gray", lw=0.8, ls=":")
        ax.set_xlabel("decoder layer from 0 (−1: embeddings)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel(name)
        ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title} adjacency probability and norm scores (mean ± std over sequences)", fontsize=10)
    fig.tight_layout()
    figs.append(("aps_by_layer.png", fig, "APS (left) and norm score (right) per layer (decoder layers from 0; "
                                          "−1 = the embeddings); 0.5 = chance, error bars = std over sequences."))
    return figs
