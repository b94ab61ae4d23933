"""Position probes of arXiv 2501.00073: which per-token quantity predicts position?

Per layer (the token embeddings, named ``"embeddings"``, then the concatenated head outputs of
each decoder layer counted from 0, as in :mod:`poslens.analysis.neighborhood`) three features are
probed:

- ``vector``: the vector ``h_i`` itself; target the absolute position ``i`` (0-indexed);
- ``cosine``: the scalar ``cos(h_i, h_T)`` with the last position T; target ``T - i``
  (the adjacency pattern makes it a position signal);
- ``norm``: the scalar ``||h_i||``; target ``T - i`` (the running-mean variance shrink of
  arXiv 2305.13571 makes it one).

Both scalar features use positions i < T only: ``cos(h_T, h_T) = 1`` would otherwise mark
``T - i = 0`` for any vectors at all (a probe on i.i.d. vectors then reaches r ≈ 0.3). When the
tokenizer has a BOS token it starts every sequence (as in training) but its position is left
out of every feature, since its fixed identity marks position 0 in any model.

Each feature gets a linear probe (scikit-learn's ``Ridge``) and an MLP probe (scikit-learn's
``MLPRegressor``: in -> 64 -> 1, ReLU, Adam on the MSE, full batch, standardised targets), both on
centred inputs divided by one overall scale. The
linear probe's ridge is chosen per layer and feature by fitting on sequences over one half of the
training characters and scoring on the other half (never on the test characters; a predefined
split searched with ``GridSearchCV``): without it, a
probe on the high-dimensional vector extrapolates wildly to unseen characters. Probes are fit on random
sequences over one character set and tested on sequences over a *disjoint* character set, so a
probe cannot succeed by memorising tokens. Metrics on the test set: Pearson r between
prediction and target, and MSE in squared positions (``chance_mse`` = predicting the training
mean). Each model can be compared with a random-init copy of its own architecture.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poslens.data.tokenizer import char_ids
from poslens.data.tokens import random_tokens
from poslens.errors import PoslensError
from poslens.report.readings import probes_readings
from poslens.rundir import LAYER_CONVENTION
from poslens.runtime import no_hf_progress_bars

FEATURES = ("vector", "cosine", "norm")
PROBES = ("linear", "mlp")


# --------------------------------------------------------------------------------------------
# probes: arrays in, numbers out
# --------------------------------------------------------------------------------------------
def pearson_r(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Pearson correlation; NaN when either side is constant."""
    p = pred.to(torch.float64).flatten()
    t = target.to(torch.float64).flatten()
    p, t = p - p.mean(), t - t.mean()
    den = float(p.norm() * t.norm())
    return float(p @ t) / den if den > 0 else float("nan")


def _standardise(Xtr: torch.Tensor, Xte: torch.Tensor):
    """Centre per feature and divide by one scale (the training features' overall std).

    One scale rather than one per dimension: a dimension that is nearly constant on the training
    characters but moves on the test characters would otherwise be blown up by a tiny std and
    make the probe extrapolate wildly. For a scalar feature the two are the same.
    """
    mu = Xtr.mean(0, keepdim=True)
    sd = (Xtr - mu).pow(2).mean().sqrt().clamp_min(1e-30)
    return (Xtr - mu) / sd, (Xte - mu) / sd


def _np(x):
    return x.detach().to(torch.float64).cpu().numpy() if isinstance(x, torch.Tensor) else x


def _ridge_alpha(X, ridge: float) -> float:
    """sklearn's ``alpha`` for a ridge given relative to the mean diagonal of the centred ``XᵀX``
    (so one ``ridge`` means the same shrinkage whatever the number of samples and the feature scale)."""
    Xc = X - X.mean(0, keepdims=True)
    return float(ridge * max((Xc * Xc).sum(0).mean(), 1e-300))


def fit_linear(X: torch.Tensor, y: torch.Tensor, ridge: float = 1e-6):
    """A fitted :class:`sklearn.linear_model.Ridge` of ``y ~ X w + b`` (the bias is not shrunk); the
    ridge is relative to the mean diagonal of the centred ``XᵀX`` (a tiny one keeps it stable)."""
    from sklearn.linear_model import Ridge

    X, y = _np(X), _np(y)
    return Ridge(alpha=_ridge_alpha(X, ridge), fit_intercept=True, solver="cholesky").fit(X, y)


def predict_linear(model, X: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(model.predict(_np(X)), dtype=torch.float64)


def fit_mlp(X: torch.Tensor, y: torch.Tensor, *, hidden: int = 64, steps: int = 300, lr: float = 1e-2,
            seed: int = 0):
    """An ``in -> hidden -> 1`` ReLU MLP (:class:`sklearn.neural_network.MLPRegressor`) trained full
    batch with Adam on the MSE for ``steps`` steps, on standardised targets
    (:class:`sklearn.compose.TransformedTargetRegressor`); seeded, independent of global RNGs."""
    import warnings

    from sklearn.compose import TransformedTargetRegressor
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor
    from sklearn.preprocessing import StandardScaler

    X, y = _np(X), _np(y)
    mlp = MLPRegressor(hidden_layer_sizes=(hidden,), activation="relu", solver="adam", learning_rate_init=lr,
                       batch_size=X.shape[0], max_iter=steps, shuffle=False, alpha=0.0, tol=0.0,
                       n_iter_no_change=steps + 1, random_state=seed)
    model = TransformedTargetRegressor(regressor=mlp, transformer=StandardScaler())
    with warnings.catch_warnings():  # a fixed number of steps is the design, not a failure to converge
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, y)


def predict_mlp(model, X: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(model.predict(_np(X)), dtype=torch.float64).reshape(-1)


#: ridge strengths (relative to the mean diagonal of the centred XᵀX) tried by :func:`select_ridge`
RIDGES = (1e-6, 1e-4, 1e-2, 1e-1, 1.0, 10.0)


def select_ridge(Xa, ya, Xb, yb, ridges=RIDGES) -> float:
    """The ridge whose linear probe, fit on ``(Xa, ya)``, has the lowest MSE on ``(Xb, yb)``.

    Called with two disjoint halves of the *training* characters, so the choice is made under the
    same kind of character shift as the test, without looking at the test characters: one
    predefined split (:class:`sklearn.model_selection.PredefinedSplit`) searched by
    :class:`sklearn.model_selection.GridSearchCV`.
    """
    import numpy as np
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import GridSearchCV, PredefinedSplit

    A, B = _standardise(Xa.to(torch.float64), Xb.to(torch.float64))
    A, B = _np(A), _np(B)
    X = np.concatenate([A, B])
    y = np.concatenate([_np(ya.to(torch.float64)), _np(yb.to(torch.float64))])
    fold = np.r_[np.full(len(A), -1), np.zeros(len(B), dtype=int)]  # fit on A only, score on B only
    scale = _ridge_alpha(A, 1.0)
    search = GridSearchCV(Ridge(fit_intercept=True, solver="cholesky"), {"alpha": [lam * scale for lam in ridges]},
                          cv=PredefinedSplit(fold), scoring="neg_mean_squared_error", refit=False)
    search.fit(X, y)
    return float(ridges[int(search.best_index_)])


def evaluate_probe(kind: str, Xtr, ytr, Xte, yte, *, mlp_steps: int = 300, seed: int = 0,
                   ridge: float = 1e-6) -> dict:
    """Fit probe ``kind`` (linear | mlp) on the training set; test-set ``{"r", "mse", "chance_mse"}``."""
    Xtr, Xte = _standardise(Xtr.to(torch.float64), Xte.to(torch.float64))
    ytr, yte = ytr.to(torch.float64), yte.to(torch.float64)
    if kind == "linear":
        pred = predict_linear(fit_linear(Xtr, ytr, ridge=ridge), Xte)
    elif kind == "mlp":
        pred = predict_mlp(fit_mlp(Xtr, ytr, steps=mlp_steps, seed=seed), Xte)
    else:
        raise ValueError(f"unknown probe {kind!r}; choose from {PROBES}")
    return {"r": pearson_r(pred, yte), "mse": float(((pred - yte) ** 2).mean()),
            "chance_mse": float(((ytr.mean() - yte) ** 2).mean())}


def probe_features(h: torch.Tensor, skip_first: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``h [B, T, d]`` -> feature name -> ``(X [n, f], y [n])`` (see module docstring).

    Targets are 0-indexed positions in the full sequence; ``skip_first`` positions (e.g. a BOS
    token, whose fixed identity would mark position 0 for any model) are left out of the samples.
    """
    B, T, d = h.shape
    h = h.to(torch.float64)
    pos = torch.arange(T, dtype=torch.float64).expand(B, T)
    to_end = (T - 1) - pos
    hn = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    # The scalar features leave out i = T itself: cos(h_T, h_T) = 1 flags T - i = 0 whatever the
    # vectors are, which would credit the cosine with position information it does not carry.
    cos_last = (hn * hn[:, -1:, :]).sum(-1)  # [B, T]
    s = slice(skip_first, T - 1)
    return {"vector": (h[:, skip_first:].reshape(-1, d), pos[:, skip_first:].reshape(-1)),
            "cosine": (cos_last[:, s].reshape(-1, 1), to_end[:, s].reshape(-1)),
            "norm": (h[:, s].norm(dim=-1).reshape(-1, 1), to_end[:, s].reshape(-1))}


def probe_layers(train_vecs: list[torch.Tensor], test_vecs: list[torch.Tensor], *, mlp_steps: int = 300,
                 seed: int = 0, skip_first: int = 0, val_vecs: tuple[list, list] | None = None,
                 update=None) -> list[dict]:
    """Every feature x probe for every layer: ``[{"layer", "feature", "probe", "r", "mse", "chance_mse"}]``
    (``layer``: ``"embeddings"`` for index 0 of the vector lists, then decoder layers from 0).

    ``val_vecs = (vectors over training characters A1, vectors over A2)`` selects the linear
    probe's ridge per layer and feature (:func:`select_ridge`); without it the ridge is 1e-6.
    """
    rows = []
    for k, (tr, te) in enumerate(zip(train_vecs, test_vecs)):
        ftr, fte = probe_features(tr, skip_first), probe_features(te, skip_first)
        fva = None
        if val_vecs:
            fva = (probe_features(val_vecs[0][k], skip_first), probe_features(val_vecs[1][k], skip_first))
        for feat in FEATURES:
            ridge = select_ridge(*fva[0][feat], *fva[1][feat]) if fva else 1e-6
            for kind in PROBES:
                res = evaluate_probe(kind, *ftr[feat], *fte[feat], mlp_steps=mlp_steps, seed=seed, ridge=ridge)
                rows.append({"layer": "embeddings" if k == 0 else k - 1, "feature": feat, "probe": kind, **res,
                             **({"ridge": ridge} if kind == "linear" else {})})
        if update is not None:
            update()
    return rows


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
    device: str = "cpu"
    figures: bool = True
    overwrite: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    labels: list[str] = field(default_factory=list)  # display names (default: directory names)


def _validate(cfg: ProbesConfig):
    from poslens.capture.scan import load_tokenizer, open_model_config
    from poslens.rundir import prepare_out_dir

    if not cfg.model_dirs:
        raise PoslensError("give at least one MODEL_DIR.")
    if cfg.labels and len(cfg.labels) != len(cfg.model_dirs):
        raise PoslensError(f"--labels: {len(cfg.labels)} labels for {len(cfg.model_dirs)} model directories.")
    if cfg.vectors not in ("attn", "resid"):
        raise PoslensError(f"--vectors {cfg.vectors!r}: choose attn (head outputs) or resid (residual stream).")
    if set(cfg.train_chars) & set(cfg.test_chars):
        raise PoslensError(f"--train-chars {cfg.train_chars!r} and --test-chars {cfg.test_chars!r} share "
                           f"{''.join(sorted(set(cfg.train_chars) & set(cfg.test_chars)))!r}; they must be disjoint.")
    for flag, v in (("--num-train-seqs", cfg.num_train), ("--num-test-seqs", cfg.num_test), ("--batch-size", cfg.batch_size),
                    ("--mlp-steps", cfg.mlp_steps)):
        if v < 1:
            raise PoslensError(f"{flag} {v}: must be a positive integer.")
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
    from poslens.analysis.neighborhood import collect_vectors

    parts = []
    for s in range(0, ids.shape[0], cfg.batch_size):
        v = collect_vectors(model, ids[s: s + cfg.batch_size], adapter=adapter)
        parts.append(list(v[cfg.vectors]))
    return [torch.cat([p[k] for p in parts]).cpu() for k in range(len(parts[0]))]


def run_probes(cfg: ProbesConfig, progress: bool = True) -> dict:
    """Probe every model (and its random-init copy) layer by layer; writes the run directory."""
    from transformers import AutoModelForCausalLM

    from poslens.analysis.neighborhood import use_poslens_attention
    from poslens.capture.model_source import source_record
    from poslens.capture.scan import load_model
    from poslens.runtime import parse_device
    from poslens.models.families import pe_of
    from poslens.progress import task_progress
    from poslens.rundir import save_figures, staged_dir, versions, write_json, write_summary

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


def _f(v: float, nd: int = 3) -> str:
    from poslens.fmt import fmt  # the one number format of tables and the report (``nd`` is not used)

    return fmt(v)


def _groups(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    g: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        g.setdefault((r["model"], r["state"]), []).append(r)
    return g


def compare_cosine_norm(rows: list[dict], probe: str = "mlp") -> dict:
    """Over decoder layers (not the embeddings): best test r and lowest MSE of the cosine and norm features."""
    def pick(feat):
        rs = [r for r in rows if r["feature"] == feat and r["probe"] == probe and isinstance(r["layer"], int)]
        rs_ok = [r for r in rs if r["r"] is not None and math.isfinite(r["r"])]
        best = max(rs_ok, key=lambda r: r["r"]) if rs_ok else None
        return best, {r["layer"]: r for r in rs}
    bc, by_c = pick("cosine")
    bn, by_n = pick("norm")
    layers = sorted(set(by_c) & set(by_n))
    wins = sum(1 for k in layers if by_c[k]["mse"] < by_n[k]["mse"])
    return {"cosine_best": bc, "norm_best": bn, "layers": len(layers), "cosine_lower_mse_layers": wins}


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
                    cells.append(f"{_f(r['r'])} / {_f(r['mse'], 1)}")
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
        vrows.append([model, rs[0]["pe"], state, f"{_f(cr)} ({c['cosine_best']['layer']})",
                      f"{_f(nr)} ({c['norm_best']['layer']})", f"{c['cosine_lower_mse_layers']} of {c['layers']}",
                      verdict])
        verdicts.append({"model": model, "pe": rs[0]["pe"], "state": state, "cosine_best_r": cr,
                         "cosine_best_layer": c["cosine_best"]["layer"], "norm_best_r": nr,
                         "norm_best_layer": c["norm_best"]["layer"],
                         "cosine_lower_mse_layers": c["cosine_lower_mse_layers"],
                         "layers": c["layers"], "cosine_beats_norm": verdict})
    T = cfg.seq_len
    summary = {
        "experiment": "probes", "paper": "neighborhood", "layer_convention": LAYER_CONVENTION,
        "title": "Position probes: vector, cos(h_i, h_T) and ‖h_i‖ as predictors of position",
        "seq_len": T, "train_chars": cfg.train_chars, "test_chars": cfg.test_chars,
        "chance_mse_uniform": (T * T - 1) / 12, "verdicts": verdicts, "records": records,
        "tables": [
            {"title": "Does cos(h_i, h_T) beat ‖h_i‖ as a predictor of T − i? (MLP probes, decoder layers from 0, "
                      "test set over held-out characters)", "columns": vcols, "rows": vrows},
            {"title": f"Test Pearson r / MSE (squared positions; chance ≈ {(T * T - 1) / 12:.0f}) per layer; "
                      f"probes fit on characters {cfg.train_chars!r}, tested on {cfg.test_chars!r}",
             "columns": cols, "rows": rows, "note": LAYER_CONVENTION},
        ],
    }
    summary["readings"] = probes_readings(summary)
    return summary


def _x(r: dict) -> int:
    """A record's position on a layer axis: −1 for the embeddings, else its decoder layer."""
    return -1 if r["layer"] == "embeddings" else int(r["layer"])


def probe_figure(records: list[dict]):
    import matplotlib.pyplot as plt

    groups = _groups(records)
    n = len(groups)
    cols = min(n, 4)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(3.3 * cols, 2.9 * nrows), squeeze=False)
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
