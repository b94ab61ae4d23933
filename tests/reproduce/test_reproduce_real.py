"""``poslens reproduce real``: registration, presence rule, and its noise-floor statistic."""

from __future__ import annotations

import torch

from poslens.reproduce import EXPERIMENTS
from poslens.reproduce.real import residual_agreement


def test_residual_agreement_known_cases():
    S = 40
    i = torch.arange(S, dtype=torch.float64)
    toeplitz = torch.cos(0.3 * (i[:, None] - i[None, :]))  # purely relative: no residual at all
    pattern = 0.1 * i[None, :].expand(S, S) / S  # a non-relative pattern (columns rise to the right)
    g = torch.Generator().manual_seed(0)
    a = toeplitz + pattern + 0.001 * torch.randn(S, S, generator=g, dtype=torch.float64)
    b = 2.0 * toeplitz + pattern + 0.001 * torch.randn(S, S, generator=g, dtype=torch.float64)
    assert residual_agreement(a, b) > 0.95  # the shared non-relative part, whatever the relative part
    n1, n2 = (toeplitz + torch.randn(S, S, generator=g, dtype=torch.float64) for _ in range(2))
    assert abs(residual_agreement(n1, n2)) < 0.15  # independent noise: about 0
    assert residual_agreement(toeplitz, toeplitz) is None  # no residual to correlate


def test_real_is_registered_and_all_runs_it_only_when_models_are_present(monkeypatch, tmp_path):
    import poslens.reproduce as R

    exp = EXPERIMENTS["real"]
    assert exp.available is not None
    monkeypatch.setattr(exp, "available", lambda: False)
    ran = []
    for name, e in list(EXPERIMENTS.items()):
        monkeypatch.setitem(EXPERIMENTS, name, R.Experiment(e.name, e.paper, e.claim,
                                                            lambda ctx, out, n=name: ran.append(n) or
                                                            {"measured": "", "reproduced": True},
                                                            e.available))
    monkeypatch.setattr(R, "_write_index", lambda *a, **k: None)
    R.run_reproduction("all", tmp_path / "out", R.ReproContext(samples=1))
    assert "real" not in ran and "kim-fig1" in ran
