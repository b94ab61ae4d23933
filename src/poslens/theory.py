"""Closed forms the simulations and scans are checked against.

arXiv 2509.21042, parameter-free layer ``f(X) = Softmax(Causal(Y Y^T)) Y + X``
with ``Y = L2Norm(X)`` and unit-norm inputs whose pairwise inner products all equal alpha:

- layer-1 output ``x1_i = ((2e + (i-1)e^a) x_i + sum_{k<i} e^a x_k) / (e + (i-1)e^a)`` (1-indexed);
- ``<x1_i, x1_j> = g(i)`` for i > j, ``||x1_i|| = h(i)``;
- layer-2 pre-softmax score ``<y2_i, y2_j> = g(i) / (h(i) h(j))``.

Everything is computed through the coefficient matrix C (x1 = C x) and the input Gram matrix
``G = alpha 11^T + (1 - alpha) I``: ``M = C G C^T``, score = ``M_ij / sqrt(M_ii M_jj)``.

The same bookkeeping continues exactly to any depth when the input Gram is exactly G (the
d -> infinity limit of the simulator), which :func:`kim_mean_field` uses.

arXiv 2501.00073: with uniform causal attention the output is a running
mean, and ``cos(y_i, y_j) ~ sqrt(min(i, j) / max(i, j))`` for i.i.d. inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from poslens.errors import PoslensError


def _check(alpha: float, seq_len: int) -> None:
    if not (0.0 <= alpha < 1.0) or not math.isfinite(alpha):
        raise PoslensError(f"--alpha {alpha}: must lie in [0, 1) (mean pairwise inner product of the inputs).")
    if seq_len < 1:
        raise PoslensError(f"--seq-len {seq_len}: must be a positive integer.")


def input_gram(alpha: float, seq_len: int) -> torch.Tensor:
    """``G = alpha 11^T + (1 - alpha) I``: unit norms, pairwise inner products alpha."""
    return alpha * torch.ones(seq_len, seq_len, dtype=torch.float64) + (1 - alpha) * torch.eye(seq_len, dtype=torch.float64)


def kim_layer1_coefficients(alpha: float, seq_len: int) -> torch.Tensor:
    """C with ``x1 = C x`` for the L2 parameter-free layer (paper's closed form, 0-indexed rows)."""
    _check(alpha, seq_len)
    e, ea = math.e, math.exp(alpha)
    i1 = torch.arange(1, seq_len + 1, dtype=torch.float64)  # 1-indexed position
    denom = e + (i1 - 1) * ea
    C = torch.tril(torch.full((seq_len, seq_len), ea, dtype=torch.float64), diagonal=-1)
    C += torch.diag(2 * e + (i1 - 1) * ea)
    return C / denom[:, None]


def kim_g(alpha: float, seq_len: int) -> torch.Tensor:
    """``g(i) = 2(2 alpha e + e^alpha (1 + alpha(2i - 3))) / (e + (i-1) e^alpha)`` for i = 1..N."""
    _check(alpha, seq_len)
    e, ea = math.e, math.exp(alpha)
    i1 = torch.arange(1, seq_len + 1, dtype=torch.float64)
    return 2 * (2 * alpha * e + ea * (1 + alpha * (2 * i1 - 3))) / (e + (i1 - 1) * ea)


def _normalised(M: torch.Tensor) -> torch.Tensor:
    d = M.diagonal().sqrt()
    return M / (d[:, None] * d[None, :])


def _causal(S: torch.Tensor) -> torch.Tensor:
    n = S.shape[-1]
    return S.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("nan"))


@dataclass
class KimTheory:
    """Layer-2 closed form: ``scores`` [N, N] (NaN above the diagonal), ``g`` [N], ``h`` [N]."""

    alpha: float
    seq_len: int
    coefficients: torch.Tensor
    gram: torch.Tensor
    g: torch.Tensor
    h: torch.Tensor
    scores: torch.Tensor

    def to_json(self) -> dict:
        def rows(m):
            return [[None if not math.isfinite(v) else v for v in r] for r in m.tolist()]

        return {
            "alpha": self.alpha,
            "seq_len": self.seq_len,
            "scores": rows(self.scores),
            "g": self.g.tolist(),
            "h": self.h.tolist(),
        }


def kim_theory(alpha: float, seq_len: int) -> KimTheory:
    """The paper's layer-1/layer-2 closed form for the L2-normalised model."""
    C = kim_layer1_coefficients(alpha, seq_len)
    M = C @ input_gram(alpha, seq_len) @ C.T
    h = M.diagonal().sqrt()
    return KimTheory(alpha, seq_len, C, M, kim_g(alpha, seq_len), h, _causal(_normalised(M)))


def kim_mean_field(alpha: float, seq_len: int, layers: int, causal: bool = True) -> torch.Tensor:
    """Pre-softmax scores ``[layers, N, N]`` of the L2 model when the input Gram is exactly G.

    Layer 1's scores are the normalised input Gram, layer 2's equal :func:`kim_theory`'s, and
    deeper layers follow the same exact recursion (X_{l+1} = A_l Y_l + X_l in coefficient space).
    This is the limit the simulator converges to as ``--dim`` grows.
    """
    _check(alpha, seq_len)
    if layers < 1:
        raise PoslensError(f"--num-layers {layers}: must be a positive integer.")
    G = input_gram(alpha, seq_len)
    C = torch.eye(seq_len, dtype=torch.float64)  # X_l = C_l X_0
    out = []
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    for _ in range(layers):
        M = C @ G @ C.T
        scores = _normalised(M)
        out.append(_causal(scores) if causal else scores)
        logits = scores.masked_fill(mask, float("-inf")) if causal else scores
        A = torch.softmax(logits, dim=-1)
        Ycoef = C / M.diagonal().sqrt()[:, None]
        C = A @ Ycoef + C
    return torch.stack(out)


def running_mean_cosine(seq_len: int) -> torch.Tensor:
    """``sqrt(min(i, j) / max(i, j))`` (1-indexed): cosine of running means of i.i.d. vectors."""
    i = torch.arange(1, seq_len + 1, dtype=torch.float64)
    return (torch.minimum(i[:, None], i[None, :]) / torch.maximum(i[:, None], i[None, :])).sqrt()
