"""theory's closed forms against the parameter-free layer run on real vectors.

arXiv 2509.21042's layer ``f(X) = Softmax(Causal(Y Y^T)) Y + X`` with ``Y = L2Norm(X)`` is run
here directly on explicit unit vectors whose Gram matrix is exactly
``alpha 11^T + (1 - alpha) I`` (a Cholesky factor), with plain loops for the softmax, so nothing of
poslens.theory's coefficient bookkeeping is reused.
"""

import math

import pytest
import torch

from poslens import theory
from poslens.errors import PoslensError


def unit_vectors(alpha, n):
    """Rows with unit norm and pairwise inner product alpha (exactly, up to rounding)."""
    G = [[1.0 if i == j else alpha for j in range(n)] for i in range(n)]
    return torch.linalg.cholesky(torch.tensor(G, dtype=torch.float64))


def layer(X, causal=True):
    """One parameter-free layer on rows of X, softmax written out per row."""
    n = X.shape[0]
    Y = X / X.norm(dim=1, keepdim=True)
    S = Y @ Y.T
    out = torch.zeros_like(X)
    for i in range(n):
        keys = range(i + 1) if causal else range(n)
        w = [math.exp(float(S[i, k])) for k in keys]
        z = sum(w)
        out[i] = sum(wk / z * Y[k] for wk, k in zip(w, keys)) + X[i]
    return out, S


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8])
def test_layer1_coefficients_entry_by_entry(alpha):
    n = 6
    C = theory.kim_layer1_coefficients(alpha, n)
    e, ea = math.e, math.exp(alpha)
    for i in range(n):  # 0-indexed row i has i earlier keys
        den = e + i * ea
        for k in range(n):
            want = (2 * e + i * ea) / den if k == i else (ea / den if k < i else 0.0)
            assert float(C[i, k]) == pytest.approx(want, rel=1e-13, abs=1e-15)
    X = unit_vectors(alpha, n)
    x1, _ = layer(X)
    torch.testing.assert_close(C @ X, x1, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.7])
def test_g_h_and_scores_from_real_vectors(alpha):
    n = 7
    X = unit_vectors(alpha, n)
    x1, _ = layer(X)
    th = theory.kim_theory(alpha, n)
    M = x1 @ x1.T
    for i in range(n):
        assert float(th.h[i]) == pytest.approx(math.sqrt(float(M[i, i])), rel=1e-12)
        for j in range(i):
            assert float(th.g[i]) == pytest.approx(float(M[i, j]), rel=1e-12)
    _, S2 = layer(x1)  # layer 2's pre-softmax scores
    for i in range(n):
        for j in range(n):
            if j > i:
                assert math.isnan(float(th.scores[i, j]))
            else:
                assert float(th.scores[i, j]) == pytest.approx(float(S2[i, j]), rel=1e-12)
    torch.testing.assert_close(th.coefficients, theory.kim_layer1_coefficients(alpha, n))
    torch.testing.assert_close(th.gram, M, rtol=1e-12, atol=1e-12)
    assert (th.alpha, th.seq_len) == (alpha, n)


def test_kim_g_is_the_papers_formula_one_indexed():
    alpha, n = 0.4, 5
    e, ea = math.e, math.exp(alpha)
    g = theory.kim_g(alpha, n)
    assert g.shape == (n,)
    for i in range(1, n + 1):
        want = 2 * (2 * alpha * e + ea * (1 + alpha * (2 * i - 3))) / (e + (i - 1) * ea)
        assert float(g[i - 1]) == pytest.approx(want, rel=1e-14)


def test_to_json_keeps_numbers_and_nulls_the_mask():
    th = theory.kim_theory(0.5, 3)
    js = th.to_json()
    assert js["alpha"] == 0.5 and js["seq_len"] == 3
    assert js["scores"][0][1] is None and js["scores"][0][2] is None and js["scores"][1][2] is None
    assert js["scores"][2][1] == pytest.approx(float(th.scores[2, 1]))
    assert js["scores"][1][1] == pytest.approx(1.0)
    assert js["g"] == th.g.tolist() and js["h"] == th.h.tolist()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_mean_field_is_the_layer_run_on_real_vectors(alpha, causal):
    n, L = 5, 4
    got = theory.kim_mean_field(alpha, n, L, causal=causal)
    assert got.shape == (L, n, n)
    X = unit_vectors(alpha, n)
    for ell in range(L):
        X_next, S = layer(X, causal=causal)
        for i in range(n):
            for j in range(n):
                if causal and j > i:
                    assert math.isnan(float(got[ell, i, j]))
                else:
                    assert float(got[ell, i, j]) == pytest.approx(float(S[i, j]), rel=1e-10, abs=1e-12)
        X = X_next


def test_running_mean_cosine_loop():
    n = 6
    got = theory.running_mean_cosine(n)
    for i in range(1, n + 1):
        for j in range(1, n + 1):
            assert float(got[i - 1, j - 1]) == pytest.approx(math.sqrt(min(i, j) / max(i, j)), rel=1e-14)


def test_input_gram():
    G = theory.input_gram(0.3, 4)
    assert G.dtype == torch.float64
    for i in range(4):
        for j in range(4):
            assert float(G[i, j]) == pytest.approx(1.0 if i == j else 0.3, rel=1e-15)


@pytest.mark.parametrize("alpha,n", [(1.0, 3), (-0.01, 3), (float("nan"), 3), (float("inf"), 3), (0.5, 0)])
def test_bad_inputs_are_errors(alpha, n):
    for f in (theory.kim_layer1_coefficients, theory.kim_g, theory.kim_theory):
        with pytest.raises(PoslensError):
            f(alpha, n)
    with pytest.raises(PoslensError):
        theory.kim_mean_field(alpha, n, 2)


def test_edges_that_are_valid():
    assert theory.kim_theory(0.0, 1).scores.tolist() == [[1.0]]
    assert theory.kim_mean_field(0.99, 1, 1).shape == (1, 1, 1)
    with pytest.raises(PoslensError, match="layers 0"):
        theory.kim_mean_field(0.5, 3, 0)
