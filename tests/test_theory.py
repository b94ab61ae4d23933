import math

import pytest
import torch

from poslens import theory


def test_figure1_values():
    # arXiv 2509.21042, Figure 1: alpha = 0, length 3.
    s = theory.kim_theory(0.0, 3).scores
    # The paper prints three decimals, truncated (0.1508 appears as 0.150).
    for (i, j), want in {(1, 0): 0.154, (2, 0): 0.132, (2, 1): 0.150}.items():
        assert abs(float(s[i, j]) - want) < 1e-3
    assert torch.isnan(s[0, 1]) and torch.isnan(s[1, 2])


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 0.8])
def test_g_and_h_match_coefficient_form(alpha):
    N = 12
    t = theory.kim_theory(alpha, N)
    M = t.gram
    # <x1_i, x1_j> = g(i) for every i > j: depends on the query only.
    for i in range(1, N):
        for j in range(i):
            assert math.isclose(float(M[i, j]), float(t.g[i]), rel_tol=1e-12)
    # layer-2 score = g(i) / (h(i) h(j)), h strictly decreasing => rises as the key approaches.
    assert torch.all(t.h[1:] < t.h[:-1])
    for i in range(2, N):
        row = t.scores[i, :i]
        assert torch.all(row[1:] > row[:-1])


def test_mean_field_layer2_equals_closed_form():
    for alpha in (0.0, 0.3):
        mf = theory.kim_mean_field(alpha, 20, 3)
        torch.testing.assert_close(mf[1], theory.kim_theory(alpha, 20).scores, equal_nan=True)
        # layer 1 is the input Gram: alpha off the diagonal
        lower = mf[0][torch.ones(20, 20, dtype=torch.bool).tril(-1)]
        assert torch.allclose(lower, torch.full_like(lower, alpha))


def test_running_mean_cosine_is_exact_for_orthonormal_inputs():
    N = 9
    x = torch.eye(N, dtype=torch.float64)
    run = torch.cumsum(x, 0) / torch.arange(1, N + 1, dtype=torch.float64)[:, None]
    cos = torch.nn.functional.normalize(run, dim=1) @ torch.nn.functional.normalize(run, dim=1).T
    torch.testing.assert_close(cos, theory.running_mean_cosine(N))


def test_bad_alpha():
    from poslens.errors import PoslensError

    with pytest.raises(PoslensError):
        theory.kim_theory(1.0, 3)
