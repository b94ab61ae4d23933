"""The scan's readings of its maps (finalize) against the way they were computed before they shared
one diagonal layout (``diagonal_reference``, the previous code kept verbatim): every reading equal to
float64 rounding on random maps of every kind a scan makes (causal, windowed, masked entries, a raised
sink column, constant, tied), and on SmolLM2 at 1,024 tokens (``real_model``): every number of the
summary's layers and every tensor written."""

from __future__ import annotations

import math

import diagonal_reference as ref
import pytest
import torch

from poslens.capture.scan import finalize as fin
from poslens.metrics import diagonal
from poslens.metrics.diagonal import causal_view, describe_map, map_numbers, window_view

#: how far apart two readings summed in another order may be (float64 rounding of sums of ~10^6 terms)
REL = 1e-11


def _close(got, want, path: str = "") -> None:
    """``got`` equal to ``want``: dicts key by key, floats to :data:`REL`, everything else exactly."""
    if isinstance(want, dict):
        assert set(got) == set(want), (path, set(got) ^ set(want))
        for k in want:
            _close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list) and want and isinstance(want[0], (dict, list, float)):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want)):
            _close(a, b, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert isinstance(got, float), (path, got, want)
        if math.isnan(want):
            assert math.isnan(got), (path, got, want)
        else:
            assert math.isclose(got, want, rel_tol=REL, abs_tol=1e-14), (path, got, want)
    else:
        assert got == want, (path, got, want)


def _maps(S: int, gen: torch.Generator):
    """Maps of every kind a scan's readings meet, ``(name, map)``."""
    i = torch.arange(S, dtype=torch.float64)
    noise = torch.randn(S, S, generator=gen, dtype=torch.float64)
    toeplitz = torch.cos(0.3 * (i[:, None] - i[None, :]))
    sink = toeplitz + 0.2 * noise
    sink[:, 0] += 6.0
    tied = torch.randint(0, 3, (S, S), generator=gen).to(torch.float64)
    tied[:, ::5] = -0.0
    const = torch.full((S, S), 0.1, dtype=torch.float64)
    const_sink = const.clone()
    const_sink[:, 0] = 2.0
    masked = sink.clone()
    masked[S // 2:, S // 3] = float("nan")
    out = [("noise", noise), ("toeplitz", toeplitz), ("sink", sink), ("tied", tied), ("const", const),
           ("const_sink", const_sink), ("masked", masked), ("big_mean", 1e3 + noise)]
    return [(name, causal_view(m)) for name, m in out] + [("window", window_view(causal_view(sink), max(1, S // 3)))]


@pytest.mark.parametrize("kernels", ["auto", "torch"])
@pytest.mark.parametrize("S", [1, 2, 3, 4, 9, 40, 130])
def test_map_numbers_equal_the_previous_functions(S, kernels, monkeypatch):
    from poslens import native

    monkeypatch.setenv(native.KERNEL_ENV, kernels)  # the C pass and the torch path alike
    gen = torch.Generator().manual_seed(70 + S)
    for name, m in _maps(S, gen):
        for diag in (False, True):
            for ex in ((), (0,), (0, 2), (S + 3,)):
                got = map_numbers(m, diag, ex, all_keys=True)
                want = {"relativity_index": ref.relativity_index(m, include_diagonal=diag, exclude_keys=ex),
                        "within_diag_rms": ref.within_diagonal_rms(m, diag, ex),
                        "diagonal_trend": ref.diagonal_trend(m, diag, ex),
                        "relativity_index_all_keys": ref.relativity_index(m, include_diagonal=diag),
                        "flat": ref.is_flat(m, include_diagonal=diag, exclude_keys=ex),
                        "flat_all_keys": ref.is_flat(m, include_diagonal=diag)}
                got.pop("n")
                _close(got, want, f"{name} S={S} diag={diag} exclude={ex}")


@pytest.mark.parametrize("S", [2, 5, 33, 300])
@pytest.mark.parametrize("G", [0, 3, 8])
def test_describe_map_and_score_map_numbers_equal_the_previous_ones(S, G):
    gen = torch.Generator().manual_seed(90 + S + G)
    for name, m in _maps(S, gen):
        grid = torch.arange(0, S, max(1, S // 24))
        groups = None
        if G:
            groups = m.nan_to_num(0.0)[grid][:, grid] + 0.3 * torch.randn(G, grid.numel(), grid.numel(),
                                                                         generator=gen, dtype=torch.float64)
        weights = torch.arange(1, G + 1, dtype=torch.float64) if G else None
        sub = m[::3, ::3]
        for diag, ex in ((False, (0,)), (True, ()), (False, (0, 1))):
            got = describe_map(m, exclude_keys=ex, include_diagonal=diag, locality_map=sub, locality_all_keys=True)
            got.pop("relativity_index_all_keys")
            want = ref.describe_map(m, exclude_keys=ex, include_diagonal=diag, locality_map=sub, locality_all_keys=True)
            _close(got, want, f"describe {name} S={S}")
        if G:
            g = causal_view(groups, include_diagonal=True)
            on_grid = causal_view(m.nan_to_num(0.0)[grid][:, grid])
            _close(describe_map(on_grid, g, weights, exclude_keys=(0,)),
                   ref.describe_map(on_grid, g, weights, exclude_keys=(0,)), f"groups {name} S={S}")
        for k in (8, 1000):
            _close(fin.score_map_numbers(m, groups, weights, grid, k),
                   ref.score_map_numbers(m, groups, weights, grid, k), f"score_map_numbers {name} S={S} k={k}")


def test_diagonal_trends_of_batches_equal_the_previous_ones():
    gen = torch.Generator().manual_seed(5)
    m = causal_view(torch.randn(4, 3, 70, 70, generator=gen, dtype=torch.float64))
    m[0, 1, :, 0] = float("nan")  # a dead leading key in one map only
    m[2, 0, :, :3] = float("nan")
    for diag in (False, True):
        assert torch.equal(diagonal.diagonal_trends(m, diag), ref.diagonal_trends(m, diag))


def test_merge_pair_counts_equal_the_sort_count():
    from poslens import native
    from poslens.metrics import neighborhood as nb

    if not native.available():
        pytest.skip("the C kernels are not built here")
    gen = torch.Generator().manual_seed(6)
    for T in (1, 2, 3, 8, 100, 513, 1024):
        for kind in ("normal", "tied", "suffix"):
            x = torch.randn(40, T, generator=gen, dtype=torch.float64)
            if kind == "tied":
                x = torch.randint(0, 4, (40, T), generator=gen).to(torch.float64)
                x[:, ::7] = -0.0
            if kind == "suffix":  # finite prefixes of every length, -inf after them
                n = torch.randint(0, T + 1, (40,), generator=gen)
                x[torch.arange(T)[None] >= n[:, None]] = float("-inf")
            gt, eq = native.merge_pair_counts(x)
            P = 1 << max(0, (T - 1).bit_length())
            padded = torch.cat([x, x.new_full((40, P - T), float("-inf"))], 1)
            if T >= 2:
                order, tied = nb._value_order(padded, count_ties=True)
                want = torch.from_numpy(nb._noninversions(order)), torch.from_numpy(tied)
            else:
                want = torch.zeros(40, dtype=torch.int64), torch.zeros(40, dtype=torch.int64)
            msg = f"T={T} {kind}"
            assert torch.equal(gt, want[0]) and torch.equal(eq, want[1]), msg


def test_mean_on_and_release_mean_equal_the_whole_mean():
    from poslens.capture.statistics.accumulators import (
        MeanAccumulator,
        symmetric_from_lower,
    )
    from poslens.metrics.neighborhood import aps_positions

    gen = torch.Generator().manual_seed(7)
    for lower in (False, True):
        acc = MeanAccumulator((3, 50, 50), lower=lower)
        acc.add(torch.randn(3, 50, 50, generator=gen, dtype=torch.float64), 7)
        idx = aps_positions(50, 16)
        for i in range(3):
            assert torch.equal(acc.mean_on(i, idx, True), acc.mean_at(i)[idx][:, idx])
            assert torch.equal(acc.mean_on(i, None, True), acc.mean_at(i))
        old = acc.sum.clone().div_(acc.count)
        if lower:
            old = symmetric_from_lower(old)
        assert torch.equal(acc.release_mean(torch.float32), old.to(torch.float32))
    vec = MeanAccumulator((2, 50))
    vec.add(torch.randn(2, 50, generator=gen, dtype=torch.float64), 3)
    assert torch.equal(vec.mean_on(1, aps_positions(50, 16), False), vec.mean_at(1)[aps_positions(50, 16)])


# ------------------------------------------------------------------------------------------------
# SmolLM2 at 1,024 tokens: each reading beside the previous code's, on the scan's own means
# ------------------------------------------------------------------------------------------------
@pytest.mark.real_model
def test_smollm2_readings_equal_the_previous_ones(tmp_path, monkeypatch):
    import json

    from real_models import real_model_file

    import poslens
    from poslens.capture.statistics import accumulators
    from poslens.metrics.slash import sink_weight
    from poslens.rundir.io import read_tensors

    gguf = real_model_file("smollm2")
    seen = {"layers": 0, "of_all": 0, "sink": 0, "means": 0}
    new_numbers, new_of_all, new_sink = fin.score_map_numbers, fin._Reader.of_all, fin._sink_weight

    def numbers(*a, **kw):
        got = new_numbers(*a, **kw)
        _close(got, ref.score_map_numbers(*a, **kw), f"layer {seen['layers']}")
        seen["layers"] += 1
        return got

    def of_all(self, name, n, fn):
        got = new_of_all(self, name, n, fn)
        if got is not None:  # the previous reading: the whole mean, then its APS positions
            want = fn(torch.stack([ref._subsample(self.mean(name, i), self.k) for i in range(n)])).tolist()
            assert got == want, name
            seen["of_all"] += 1
        return got

    def sink(r, li):
        got = new_sink(r, li)
        # the mean of the key-0 column summed contiguously instead of strided: to float64 rounding
        assert math.isclose(float(got), float(sink_weight(r.mean("probs", li))), rel_tol=REL), li
        seen["sink"] += 1
        return got

    written = {}
    release = accumulators.MeanAccumulator.release_mean

    def release_mean(self, dtype=torch.float32):
        want = None
        if self.count:  # the previous release: divided in float64, mirrored, then rounded
            want = self.sum.clone().div_(self.count)
            want = accumulators.symmetric_from_lower(want) if self.lower else want
            want = want.to(dtype)
        got = release(self, dtype)
        if want is not None:
            assert torch.equal(got, want)
            written[seen["means"]] = True
            seen["means"] += 1
        return got

    monkeypatch.setattr(fin, "score_map_numbers", numbers)
    monkeypatch.setattr(fin._Reader, "of_all", of_all)
    monkeypatch.setattr(fin, "_sink_weight", sink)
    monkeypatch.setattr(accumulators.MeanAccumulator, "release_mean", release_mean)
    out = tmp_path / "run"
    poslens.scan(str(gguf), data="random", seq_len=1024, num_seqs=2, batch_size=2, progress=False, out=str(out))
    summary = json.loads((out / "summary.json").read_text())
    assert seen["layers"] == len(summary["layers"]) == 30
    assert seen["of_all"] == 3 and seen["sink"] == 30 and seen["means"] >= 10
    tensors = read_tensors(out / "maps.safetensors")
    assert "scores" in tensors and tensors["scores"].shape[-1] == 1024
