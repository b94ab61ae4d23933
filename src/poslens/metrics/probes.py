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

Each feature gets a linear probe (closed-form ridge regression) and an MLP probe (in -> 64 -> 1,
ReLU, Adam on the MSE, full batch), both on centred inputs divided by one overall scale. The
linear probe's ridge is chosen by fitting on one set of sequences and scoring on another
(:func:`select_ridge`); without it, a probe on the high-dimensional vector extrapolates wildly to
unseen characters. Metrics on the test set: Pearson r between prediction and target, and MSE in
squared positions (``chance_mse`` = predicting the training mean).
"""

from __future__ import annotations

import math

import torch


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


def fit_linear(X: torch.Tensor, y: torch.Tensor, ridge: float = 1e-6) -> torch.Tensor:
    """Least-squares weights ``[f + 1]`` (last = bias) of ``y ~ X w + b``; a tiny ridge keeps it stable."""
    X = X.to(torch.float64)
    A = torch.cat([X, torch.ones(X.shape[0], 1, dtype=torch.float64)], 1)
    G = A.T @ A
    reg = ridge * (float(G.diagonal()[:-1].mean()) if X.shape[1] else 1.0)
    eye = torch.eye(G.shape[0], dtype=torch.float64)
    eye[-1, -1] = 0  # the bias is not shrunk
    return torch.linalg.solve(G + reg * eye, A.T @ y.to(torch.float64))


def predict_linear(w: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    return X.to(torch.float64) @ w[:-1] + w[-1]


def fit_mlp(X: torch.Tensor, y: torch.Tensor, *, hidden: int = 64, steps: int = 300, lr: float = 1e-2,
            seed: int = 0) -> torch.nn.Module:
    """An ``in -> hidden -> 1`` ReLU MLP trained full-batch with Adam on the MSE (targets standardised)."""
    g = torch.Generator().manual_seed(seed)
    X = X.to(torch.float32)
    ym, ys = float(y.mean()), float(y.std()) or 1.0
    yt = ((y.to(torch.float32) - ym) / ys)[:, None]
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    with torch.no_grad():
        for p in net.parameters():  # seeded init independent of the global RNG
            bound = 1 / math.sqrt(p.shape[-1] if p.dim() > 1 else hidden)
            p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(net(X), yt)
            loss.backward()
            opt.step()
    net.eval()
    net.target_mean, net.target_std = ym, ys
    return net


def predict_mlp(net, X: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return (net(X.to(torch.float32))[:, 0].to(torch.float64) * net.target_std + net.target_mean)


#: ridge strengths (relative to the mean diagonal of X^T X) tried by :func:`select_ridge`
RIDGES = (1e-6, 1e-4, 1e-2, 1e-1, 1.0, 10.0)


def select_ridge(Xa, ya, Xb, yb, ridges=RIDGES) -> float:
    """The ridge whose linear probe, fit on ``(Xa, ya)``, has the lowest MSE on ``(Xb, yb)``.

    Called with two disjoint halves of the *training* characters, so the choice is made under the
    same kind of character shift as the test, without looking at the test characters.
    """
    A, B = _standardise(Xa.to(torch.float64), Xb.to(torch.float64))
    ya, yb = ya.to(torch.float64), yb.to(torch.float64)
    mses = [float(((predict_linear(fit_linear(A, ya, ridge=lam), B) - yb) ** 2).mean()) for lam in ridges]
    return float(ridges[min(range(len(ridges)), key=mses.__getitem__)])


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
