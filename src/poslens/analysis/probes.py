"""``poslens probes`` (arXiv 2501.00073): do the cosine to the last token or the vector norm predict position?

:func:`run_probes` draws random sequences over one character set (training) and over a *disjoint*
set (test), so a probe cannot succeed by memorising tokens, collects per-layer vectors (the token
embeddings, named ``"embeddings"``, then the concatenated head outputs of each decoder layer counted
from 0, as in :mod:`poslens.analysis.neighborhood`), fits the probes of :mod:`poslens.metrics.probes`
and writes a run directory. The linear probe's ridge is chosen per layer and feature on sequences
over one half of the training characters, scored on the other half (never on the test
characters). When the tokenizer has a BOS token it starts every sequence (as in training) but its
position is left out of every feature. Each model can be compared with a random-init copy of its
own architecture.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poslens.analysis.neighborhood import collect_vectors, use_poslens_attention
from poslens.capture.model.source import source_record
from poslens.capture.model.load import load_model, load_tokenizer, open_model_config
from poslens.data.tokenizer import char_ids
from poslens.data.tokens import random_tokens
from poslens.errors import PoslensError, require_positive
from poslens.fmt import fmt
from poslens.metrics.judge.commands import judge_probes
from poslens.metrics.probes import FEATURES, PROBES, compare_cosine_norm, probe_layers
from poslens.models.families import pe_of
from poslens.progress import task_progress
from poslens.rundir.figures import new_figure, save_figures
from poslens.conventions import LAYER_CONVENTION
from poslens.rundir.summary import write_summary
from poslens.rundir.outdir import prepare_out_dir
from poslens.rundir.staging import staged_dir
from poslens.rundir.io import versions, write_json
from poslens.runtime import no_hf_progress_bars, parse_device


# --------------------------------------------------------------------------------------------
# data: random sequences over two disjoint character sets
# --------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------
@dataclass
class ProbesConfig:
    """Every option of ``poslens probes``."""

    model_dirs: list[str]
    out: str
    train_chars: str = "01234"
    test_chars: str = "56789"
    seq_len: int = 64
    num_train: int = 64
    num_test: int = 32
    batch_size: int = 16
    mlp_steps: int = 300
    random_init: bool = True  # also probe a random-init copy of every model's architecture
    vectors: str = "attn"  # attn (head outputs, the paper's) | resid (residual stream)
    seed: int = 0
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda[:N]; resolved by poslens.runtime.parse_device
    figures: bool = True
    overwrite: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    labels: list[str] = field(default_factory=list)  # display names (default: directory names)


def _validate(cfg: ProbesConfig):
    if not cfg.model_dirs:
        raise PoslensError("give at least one MODEL_DIR.")
    if cfg.labels and len(cfg.labels) != len(cfg.model_dirs):
        raise PoslensError(f"--labels: {len(cfg.labels)} labels for {len(cfg.model_dirs)} model directories.")
    if cfg.vectors not in ("attn", "resid"):
        raise PoslensError(f"--vectors {cfg.vectors!r}: choose attn (head outputs) or resid (residual stream).")
    if set(cfg.train_chars) & set(cfg.test_chars):
        raise PoslensError(f"--train-chars {cfg.train_chars!r} and --test-chars {cfg.test_chars!r} share "
                           f"{''.join(sorted(set(cfg.train_chars) & set(cfg.test_chars)))!r}; they must be disjoint.")
    require_positive(("--num-train-seqs", cfg.num_train, "num_train"), ("--num-test-seqs", cfg.num_test, "num_test"),
                     ("--batch-size", cfg.batch_size), ("--mlp-steps", cfg.mlp_steps))
    if cfg.seq_len < 3:
        raise PoslensError(f"--seq-len {cfg.seq_len}: need at least 3 positions.")
    plans = []
    for d in cfg.model_dirs:
        config, adapter = open_model_config(d, seq_len=cfg.seq_len, allow_pickle=cfg.allow_pickle,
                                            trust_remote_code=cfg.trust_remote_code)
        tok = load_tokenizer(d, cfg.trust_remote_code)
        if tok is None:
            raise PoslensError(f"{d} has no tokenizer, so --train-chars/--test-chars cannot be encoded; "
                               "save the tokenizer with the model.")
        tr, te = char_ids(tok, cfg.train_chars, "--train-chars"), char_ids(tok, cfg.test_chars, "--test-chars")
        plans.append((d, config, adapter, tr, te, getattr(tok, "bos_token_id", None)))
    prepare_out_dir(cfg.out, must_be_new=not cfg.overwrite)
    return plans


def _vectors(model, ids, cfg: ProbesConfig, adapter) -> list[torch.Tensor]:
    parts = []
    for s in range(0, ids.shape[0], cfg.batch_size):
        v = collect_vectors(model, ids[s: s + cfg.batch_size], adapter=adapter)
        parts.append(list(v[cfg.vectors]))
    return [torch.cat([p[k] for p in parts]).cpu() for k in range(len(parts[0]))]


def run_probes(cfg: ProbesConfig, progress: bool = True) -> dict:
    """Probe every model (and its random-init copy) layer by layer; writes the run directory."""
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    plans = _validate(cfg)
    device = parse_device(cfg.device)
    states = ["trained"] + (["random init"] if cfg.random_init else [])
    total = sum((getattr(c, "num_hidden_layers", None) or c.n_layer) + 1 for _, c, *_ in plans) * len(states)
    records, done = [], 0
    with task_progress("probes", total=total, enabled=progress) as update:
        for n, (d, config, adapter, tr_ids, te_ids, bos) in enumerate(plans):
            label = cfg.labels[n] if cfg.labels else Path(d).name
            xtr = random_tokens(0, cfg.num_train, cfg.seq_len, pool=tr_ids, seed=cfg.seed, bos=bos)
            xte = random_tokens(0, cfg.num_test, cfg.seq_len, pool=te_ids, seed=cfg.seed + 1, bos=bos)
            half = len(tr_ids) // 2  # ridge selection: fit on one half of the training characters, score on the other
            nv = max(2, cfg.num_train // 2)
            xva = (random_tokens(0, nv, cfg.seq_len, pool=tr_ids[:half], seed=cfg.seed + 2, bos=bos),
                   random_tokens(0, nv, cfg.seq_len, pool=tr_ids[half:], seed=cfg.seed + 3, bos=bos))
            for state in states:
                if state == "trained":
                    with no_hf_progress_bars(not progress):  # --quiet: no weight-loading bars either
                        model = load_model(d, dtype=torch.float32, device=device, allow_pickle=cfg.allow_pickle,
                                           trust_remote_code=cfg.trust_remote_code)
                else:
                    with torch.random.fork_rng(devices=[]):  # seeded weights; the global RNG is left as it was
                        torch.manual_seed(cfg.seed)
                        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
                    model = model.to(device).eval()
                    use_poslens_attention(model)
                with torch.no_grad():
                    vtr = _vectors(model, xtr.to(device), cfg, adapter)
                    vte = _vectors(model, xte.to(device), cfg, adapter)
                    vva = tuple(_vectors(model, x.to(device), cfg, adapter) for x in xva)
                del model

                def tick(state=state, label=label):
                    nonlocal done
                    done += 1
                    update(done, info=f"{label} ({state})")
                for row in probe_layers(vtr, vte, mlp_steps=cfg.mlp_steps, seed=cfg.seed,
                                        skip_first=int(bos is not None), val_vecs=vva, update=tick):
                    records.append({"model": label, "model_dir": d, "pe": pe_of(config), "state": state, **row})
    summary = build_summary(cfg, records)
    with staged_dir(cfg.out) as stage:
        write_json(stage / "config.json", {"command": "probes", **dataclasses.asdict(cfg),
                                           "model_sources": [source_record(d) for d in cfg.model_dirs],
                                           "versions": versions()})
        write_json(stage / "probes.json", records)
        summary["figures"] = save_figures(stage, [probe_figure(records)] if cfg.figures else [])
        summary["wall_s"] = time.time() - t0
        write_summary(stage, summary, command="probes", layers_describe="per model, state, layer, feature and "
                      "probe under 'records': layer 'embeddings' or a decoder layer from 0 (head outputs)")
    return summary


def _groups(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    g: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        g.setdefault((r["model"], r["state"]), []).append(r)
    return g


def build_summary(cfg: ProbesConfig, records: list[dict]) -> dict:
    groups = _groups(records)
    cols = ["model", "PE", "state", "layer"] + [f"{f} {p} r / MSE" for f in FEATURES for p in PROBES]
    rows = []
    for (model, state), rs in groups.items():
        layers = ["embeddings"] * any(r["layer"] == "embeddings" for r in rs) + sorted(
            {r["layer"] for r in rs if isinstance(r["layer"], int)})
        for k in layers:
            cells = []
            for f in FEATURES:
                for p in PROBES:
                    r = next(x for x in rs if x["layer"] == k and x["feature"] == f and x["probe"] == p)
                    cells.append(f"{fmt(r['r'])} / {fmt(r['mse'])}")
            rows.append([model, rs[0]["pe"], state, k] + cells)
    vcols = ["model", "PE", "state", "best cosine r (layer)", "best norm r (layer)",
             "layers where cosine MSE < norm MSE", "cosine beats norm?"]
    vrows, verdicts = [], []
    for (model, state), rs in groups.items():
        c = compare_cosine_norm(rs)
        if c["cosine_best"] is None or c["norm_best"] is None:
            continue
        cr, nr = c["cosine_best"]["r"], c["norm_best"]["r"]
        beats = cr > nr and c["cosine_lower_mse_layers"] * 2 > c["layers"]
        mixed = (cr > nr) != (c["cosine_lower_mse_layers"] * 2 > c["layers"])
        verdict = "yes" if beats else "mixed" if mixed else "no"
        vrows.append([model, rs[0]["pe"], state, f"{fmt(cr)} ({c['cosine_best']['layer']})",
                      f"{fmt(nr)} ({c['norm_best']['layer']})", f"{c['cosine_lower_mse_layers']} of {c['layers']}",
                      verdict])
        verdicts.append({"model": model, "pe": rs[0]["pe"], "state": state, "cosine_best_r": cr,
                         "cosine_best_layer": c["cosine_best"]["layer"], "norm_best_r": nr,
                         "norm_best_layer": c["norm_best"]["layer"],
                         "cosine_lower_mse_layers": c["cosine_lower_mse_layers"],
                         "layers": c["layers"], "cosine_beats_norm": verdict,
                         "test_seqs": c.get("test_seqs"), "cosine_lower_mse_seqs": c.get("cosine_lower_mse_seqs")})
    T = cfg.seq_len
    summary = {
        "experiment": "probes", "paper": "neighborhood", "layer_convention": LAYER_CONVENTION,
        "title": "Position probes: vector, cos(h_i, h_T) and ‖h_i‖ as predictors of position",
        "seq_len": T, "train_chars": cfg.train_chars, "test_chars": cfg.test_chars,
        "chance_mse_uniform": (T * T - 1) / 12, "verdicts": verdicts, "records": records,
        "tables": [
            {"title": "Does cos(h_i, h_T) beat ‖h_i‖ as a predictor of T − i? (MLP probes, decoder layers from 0, "
                      "test set over held-out characters)", "columns": vcols, "rows": vrows},
            {"title": f"Test Pearson r / MSE (squared positions; chance ≈ {fmt((T * T - 1) / 12)}) per layer; "
                      f"probes fit on characters {cfg.train_chars!r}, tested on {cfg.test_chars!r}",
             "columns": cols, "rows": rows, "note": LAYER_CONVENTION},
        ],
    }
    summary["judgement"] = judge_probes(summary)
    return summary


def _x(r: dict) -> int:
    """A record's position on a layer axis: −1 for the embeddings, else its decoder layer."""
    return -1 if r["layer"] == "embeddings" else int(r["layer"])


def probe_figure(records: list[dict]):
    groups = _groups(records)
    n = len(groups)
    cols = min(n, 4)
    nrows = (n + cols - 1) // cols
    fig, axes = new_figure(nrows, cols, figsize=(3.3 * cols, 2.9 * nrows), squeeze=False)
    for ax, ((model, state), rs) in zip(axes.flat, groups.items()):
        for c, feat in enumerate(FEATURES):
            for probe, ls in (("mlp", "-"), ("linear", "--")):
                sel = sorted((r for r in rs if r["feature"] == feat and r["probe"] == probe), key=_x)
                ax.plot([_x(r) for r in sel], [r["r"] if r["r"] is not None else float("nan") for r in sel],
                        ls=ls, marker="o", color=f"C{c}", label=f"{feat} {probe}")
        ax.set_title(f"{model} ({state})", fontsize=8)
        ax.set_ylim(-1.05, 1.05)
        ax.axhline(0, color="gray", lw=0.6, ls=":")
        ax.set_xlabel("decoder layer from 0 (−1: embeddings)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("test Pearson r")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle("Position probes on held-out characters (solid MLP, dashed linear)", fontsize=10)
    fig.tight_layout()
    return "probes_r.png", fig, ("Test Pearson r per layer (decoder layers from 0; −1 = the embeddings) of probes "
                                 "predicting position from the vector h_i (target i), cos(h_i, h_T) and ‖h_i‖ "
                                 "(target T − i).")
