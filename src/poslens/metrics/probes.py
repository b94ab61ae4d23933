"""Position probes (arXiv 2501.00073): which per-token quantity predicts position? Tensors in, numbers out.

Per layer three features of the vectors ``h [N, T, d]`` are probed (:func:`probe_features`):

- ``vector``: the vector ``h_i`` itself; target the absolute position ``i`` (0-indexed);
- ``cosine``: the scalar ``cos(h_i, h_T)`` with the last position T; target ``T - i``
  (the adjacency pattern makes it a position signal);
- ``norm``: the scalar ``||h_i||``; target ``T - i`` (the running-mean variance shrink of
  arXiv 2305.13571 makes it one).

Both scalar features use positions i < T only: ``cos(h_T, h_T) = 1`` would otherwise mark
``T - i = 0`` for any vectors at all (a probe on i.i.d. vectors then reaches r ≈ 0.3);
``skip_first`` leaves a BOS position out (its fixed identity marks position 0 in any model).

Each feature gets a linear probe (scikit-learn's ``Ridge``) and an MLP probe (scikit-learn's
``MLPRegressor``: in -> 64 -> 1, ReLU, Adam on the MSE, full batch, standardised targets), both on
centred inputs divided by one overall scale. The linear probe's ridge is chosen by fitting on one
set of sequences and scoring on another (:func:`select_ridge`: a predefined split searched with
``GridSearchCV``); without it, a probe on the high-dimensional vector extrapolates wildly to
unseen characters. Metrics on the test set: Pearson r between prediction and target, and MSE in
squared positions (``chance_mse`` = predicting the training mean).
"""

from __future__ import annotations

import math

import torch

from poslens.runtime import environ_kept


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
    with environ_kept():
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

    with environ_kept():
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

    with environ_kept():
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
                   ridge: float = 1e-6, test_seqs: int | None = None) -> dict:
    """Fit probe ``kind`` (linear | mlp) on the training set; test-set ``{"r", "mse", "chance_mse"}``,
    and with ``test_seqs`` (the test samples are that many sequences' rows, sequence by sequence)
    ``"seq_mse"``: each test sequence's own MSE, the unit a paired comparison of probes counts."""
    Xtr, Xte = _standardise(Xtr.to(torch.float64), Xte.to(torch.float64))
    ytr, yte = ytr.to(torch.float64), yte.to(torch.float64)
    if kind == "linear":
        pred = predict_linear(fit_linear(Xtr, ytr, ridge=ridge), Xte)
    elif kind == "mlp":
        pred = predict_mlp(fit_mlp(Xtr, ytr, steps=mlp_steps, seed=seed), Xte)
    else:
        raise ValueError(f"unknown probe {kind!r}; choose from {PROBES}")
    sq = (pred - yte) ** 2
    out = {"r": pearson_r(pred, yte), "mse": float(sq.mean()), "chance_mse": float(((ytr.mean() - yte) ** 2).mean())}
    if test_seqs:
        out["seq_mse"] = sq.reshape(test_seqs, -1).mean(1).tolist()
    return out


def probe_features(h: torch.Tensor, skip_first: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``h [B, T, d]`` -> feature name -> ``(X [n, f], y [n])`` (see module docstring).

    Targets are 0-indexed positions in the full sequence; ``skip_first`` positions (e.g. a BOS
    token, whose fixed identity would mark position 0 for any model) are left out of the samples.
    """
    B, T, d = h.shape
    h = h.to(torch.float64)
    pos = torch.arange(T, dtype=torch.float64, device=h.device).expand(B, T)
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
                res = evaluate_probe(kind, *ftr[feat], *fte[feat], mlp_steps=mlp_steps, seed=seed, ridge=ridge,
                                     test_seqs=te.shape[0])
                rows.append({"layer": "embeddings" if k == 0 else k - 1, "feature": feat, "probe": kind, **res,
                             **({"ridge": ridge} if kind == "linear" else {})})
        if update is not None:
            update()
    return rows


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
    out = {"cosine_best": bc, "norm_best": bn, "layers": len(layers), "cosine_lower_mse_layers": wins}
    if layers and all("seq_mse" in by_c[k] and "seq_mse" in by_n[k] for k in layers):
        # per test sequence (independent draws of characters): the two probes' squared errors summed over
        # the decoder layers, paired on the same sequence
        cos = torch.tensor([by_c[k]["seq_mse"] for k in layers], dtype=torch.float64, device="cpu").sum(0)
        norm = torch.tensor([by_n[k]["seq_mse"] for k in layers], dtype=torch.float64, device="cpu").sum(0)
        out["test_seqs"] = int(cos.numel())
        out["cosine_lower_mse_seqs"] = int((cos < norm).sum())
    return out
