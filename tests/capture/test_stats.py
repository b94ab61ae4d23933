"""Direct tests of the statistics objects in ``poslens.capture.statistics.accumulators`` against numpy / scipy on the same samples."""

import os
import socket

import numpy as np
import pytest
import scipy.stats
import torch

from poslens.capture.statistics.accumulators import AccumulatorSet, MeanAccumulator


def _samples(n, shape=(3, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    # an offset far from zero: the one-pass sum-of-squares variance must still be exact to ~1e-9
    return 5.0 + torch.randn((n,) + shape, generator=g, dtype=torch.float64)


def test_mean_var_stderr_match_numpy_and_scipy():
    x = _samples(37)
    acc = MeanAccumulator((3, 4), with_var=True)
    acc.add_samples(x[:10])
    acc.add_samples(x[10:])  # two batches of different sizes
    xn = x.numpy()
    assert acc.count == 37
    np.testing.assert_allclose(acc.mean.numpy(), xn.mean(0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(acc.var.numpy(), xn.var(0, ddof=1), rtol=1e-9, atol=0)
    np.testing.assert_allclose(acc.stderr.numpy(), scipy.stats.sem(xn, axis=0), rtol=1e-9, atol=0)


def test_add_takes_pre_reduced_sums():
    x = _samples(8)
    a, b = MeanAccumulator((3, 4), with_var=True), MeanAccumulator((3, 4), with_var=True)
    a.add_samples(x)
    b.add(x.sum(0), 8, (x * x).sum(0))
    assert torch.equal(a.sum, b.sum) and torch.equal(a.sumsq, b.sumsq) and a.count == b.count == 8
    with pytest.raises(ValueError, match="batch_sumsq"):
        b.add(x.sum(0), 8)  # a variance accumulator needs the sum of squares


def test_float32_input_is_summed_in_float64():
    # 1e8 + 1 is not representable in float32; a float32 running sum would lose the ones
    acc = MeanAccumulator((1,))
    acc.add_samples(torch.full((1, 1), 1e8, dtype=torch.float32))
    for _ in range(10):
        acc.add_samples(torch.ones(1, 1, dtype=torch.float32))
    assert acc.sum.dtype == torch.float64 and float(acc.sum) == 1e8 + 10


def test_merge_equals_one_pass_and_checks_kind():
    x = _samples(30)
    whole, a, b = (MeanAccumulator((3, 4), with_var=True) for _ in range(3))
    whole.add_samples(x)
    a.add_samples(x[:7])
    b.add_samples(x[7:])
    assert a.merge(b) is a
    assert a.count == 30
    torch.testing.assert_close(a.mean, whole.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.var, whole.var, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="different shape"):
        a.merge(MeanAccumulator((4, 3), with_var=True))
    with pytest.raises(ValueError, match="different shape or kind"):
        a.merge(MeanAccumulator((3, 4), with_var=False))


def test_state_dict_round_trip_through_safetensors(tmp_path):
    from safetensors.torch import load_file, save_file

    x = _samples(11)
    accs = AccumulatorSet(m=MeanAccumulator((3, 4), with_var=True), c=MeanAccumulator((2,)))
    accs["m"].add_samples(x)
    accs["c"].add_samples(torch.arange(6.0).reshape(3, 2))
    save_file(accs.state_dict(), tmp_path / "s.safetensors")
    back = AccumulatorSet(m=MeanAccumulator((3, 4), with_var=True), c=MeanAccumulator((2,)))
    state = load_file(tmp_path / "s.safetensors")
    back.load_state_dict(state)
    assert back["m"].count == 11 and back["c"].count == 3
    assert torch.equal(back["m"].sum, accs["m"].sum) and torch.equal(back["m"].sumsq, accs["m"].sumsq)
    np.testing.assert_allclose(back["c"].mean.numpy(), [2.0, 3.0])
    # copy=True (default): the loaded accumulator does not alias the state it was given
    back["c"].add_samples(torch.ones(1, 2))
    assert torch.equal(state["c.sum"], torch.tensor([6.0, 9.0], dtype=torch.float64))
    # a state of another shape is refused
    with pytest.raises(ValueError, match="saved shape"):
        MeanAccumulator((4, 3), with_var=True).load_state_dict(state, prefix="m.")


def test_load_state_dict_copies_unless_told_to_adopt():
    state = {"sum": torch.tensor([1.0, 2.0], dtype=torch.float64), "count": torch.tensor([2])}
    copied = MeanAccumulator((2,))
    copied.load_state_dict(state)  # default: a copy
    copied.add_samples(torch.ones(1, 2))
    assert state["sum"].tolist() == [1.0, 2.0] and copied.sum.tolist() == [2.0, 3.0]
    adopted = MeanAccumulator((2,))
    adopted.load_state_dict(state, copy=False)  # a state freshly read from a file: no second copy
    assert adopted.sum.data_ptr() == state["sum"].data_ptr() and adopted.count == 2
    converted = MeanAccumulator((2,))
    converted.load_state_dict({"sum": torch.tensor([1.0, 2.0]), "count": torch.tensor([2])}, copy=False)
    assert converted.sum.dtype == torch.float64  # float32 input is converted whatever ``copy`` says


def test_too_few_samples_give_nan_not_a_number():
    """With n < 2 there is no variance: NaN (never 0, which would claim an exact mean)."""
    empty = MeanAccumulator((2,), with_var=True)
    assert torch.isnan(empty.mean).all() and torch.isnan(empty.var).all() and torch.isnan(empty.stderr).all()
    one = MeanAccumulator((2,), with_var=True)
    one.add_samples(torch.tensor([[1.0, 2.0]]))
    assert one.mean.tolist() == [1.0, 2.0]
    assert torch.isnan(one.var).all() and torch.isnan(one.stderr).all()
    two = MeanAccumulator((2,), with_var=True)
    two.add_samples(torch.tensor([[1.0, 2.0], [3.0, 2.0]]))
    assert two.var.tolist() == [2.0, 0.0] and two.stderr.tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="does not track variance"):
        MeanAccumulator((2,)).var


def test_lower_accumulator_reads_the_mirror_of_its_lower_triangle():
    """A ``lower`` accumulator counts the lower triangle of each matrix only: adding full symmetric
    sums, lower triangles with a zero upper, or lower triangles with junk above the diagonal all read
    back as the same symmetric mean, through sum_at, mean_at, mean, merge and release_mean."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 2, 5, 5, generator=g, dtype=torch.float64)
    sym = x + x.transpose(-1, -2)  # six symmetric samples of a [2, 5, 5] tensor
    want = sym.mean(0)
    full, low, junk = (MeanAccumulator((2, 5, 5), lower=True) for _ in range(3))
    full.add(sym.sum(0), 6)
    low.add(sym.sum(0).tril(), 6)
    junk.add(sym.sum(0).tril() + torch.randn(2, 5, 5, generator=g, dtype=torch.float64).triu(1) * 100, 6)
    for acc in (full, low, junk):
        assert torch.allclose(acc.mean, want, atol=1e-12)
        assert torch.allclose(acc.mean_at(1), want[1], atol=1e-12)
        assert torch.allclose(acc.sum_at(slice(0, 1)), sym.sum(0)[:1], atol=1e-12)
    both = MeanAccumulator((2, 5, 5), lower=True).merge(low).merge(junk)  # 12 samples, the same mean
    assert both.count == 12 and torch.allclose(both.mean, want, atol=1e-12)
    released = junk.release_mean(torch.float64)
    assert torch.allclose(released, want, atol=1e-12) and torch.equal(released, released.transpose(-1, -2))
    assert junk.count == 0 and junk.sum.numel() == 0
    plain = MeanAccumulator((2, 5, 5))
    plain.add(sym.sum(0).tril(), 6)  # without the flag the zero upper triangle is read as it is
    assert not torch.allclose(plain.mean, want)
    with pytest.raises(ValueError):
        MeanAccumulator((2, 5, 5), lower=True).merge(plain)
    with pytest.raises(ValueError):
        MeanAccumulator((5,), lower=True)


def test_shape_errors():
    acc = MeanAccumulator((3,))
    with pytest.raises(RuntimeError):
        acc.add_samples(torch.zeros(2, 4))  # wrong trailing shape cannot be added


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_all_reduce_on_a_one_process_gloo_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.fail("a process group is already initialised in the test process")
    store = dist.TCPStore("127.0.0.1", _free_port(), 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        x = _samples(5)
        accs = AccumulatorSet(m=MeanAccumulator((3, 4), with_var=True))
        accs["m"].add_samples(x)
        before = {k: v.clone() for k, v in accs.state_dict().items()}
        accs.all_reduce()
        # one rank: the sum over ranks is the rank's own state, count kept as an int
        assert accs["m"].count == 5 and isinstance(accs["m"].count, int)
        for k, v in accs.state_dict().items():
            assert torch.equal(v, before[k]), k
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# group sums, sign-flip test, cross-group mean squares, jackknife
# --------------------------------------------------------------------------------------------
def test_group_accumulator_add_merge_state_dict():
    from poslens.capture.statistics.accumulators import GroupAccumulator

    x = _samples(12, (2, 2))
    a, b = GroupAccumulator(3, (2, 2)), GroupAccumulator(3, (2, 2))
    for i in range(12):
        (a if i < 6 else b).add(i % 3, x[i], 1)
    a.merge(b)
    assert a.count == 12 and a.counts.tolist() == [4, 4, 4]
    torch.testing.assert_close(a.mean, x.mean(0), rtol=0, atol=1e-12)
    means, counts = a.group_means()
    torch.testing.assert_close(means[1], x[1::3].mean(0), rtol=0, atol=1e-12)
    assert counts.tolist() == [4.0, 4.0, 4.0]
    c = GroupAccumulator(3, (2, 2))
    c.load_state_dict(a.state_dict())
    assert torch.equal(c.sum, a.sum) and torch.equal(c.counts, a.counts)
    with pytest.raises(ValueError, match="saved shape"):
        GroupAccumulator(4, (2, 2)).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="different shape or group count"):
        a.merge(GroupAccumulator(2, (2, 2)))
    empty = GroupAccumulator(4, (2,))
    empty.add(2, torch.ones(2), 1)
    m, cnt = empty.group_means()
    assert m.shape == (1, 2) and cnt.tolist() == [1.0]  # empty groups are left out
    assert torch.isnan(GroupAccumulator(2, (2,)).mean).all()


def _brute_signflip(a, w):
    """Every sign pattern (both signs of the first group, which give the same statistic)."""
    import itertools

    a = np.asarray(a, dtype=float).reshape(len(a), -1)
    w = np.asarray(w, dtype=float) / np.sum(w)
    obs = np.sum((w[:, None] * a).sum(0) ** 2)
    stats = [np.sum(((np.array(e) * w)[:, None] * a).sum(0) ** 2) for e in itertools.product([1, -1], repeat=len(a))]
    return float(np.mean(np.array(stats) >= obs * (1 - 1e-12)))


@pytest.mark.parametrize("shift", [0.0, 0.4, 3.0])
def test_signflip_pvalue_matches_enumeration(shift):
    from poslens.metrics.noise import min_pvalue, signflip_pvalue

    g = torch.Generator().manual_seed(3)
    a = torch.randn(7, 5, generator=g, dtype=torch.float64) + shift
    w = torch.arange(1.0, 8.0, dtype=torch.float64)
    p = signflip_pvalue(a, w)
    assert p == pytest.approx(_brute_signflip(a.numpy(), w.numpy()), abs=1e-15)
    if shift == 3.0:  # every group on the same side: only the identity pattern reaches it
        assert p == min_pvalue(7) == 1 / 64
    assert signflip_pvalue(a[:1], w[:1]) is None


def test_decisive_needs_eight_groups():
    from poslens.conventions import NOISE_P
    from poslens.metrics.noise import decisive, min_pvalue

    assert min_pvalue(1) == 1.0 and min_pvalue(8) == 1 / 128 and min_pvalue(7) == 1 / 64
    assert not decisive(7) and decisive(8) and min_pvalue(7) > NOISE_P > min_pvalue(8)


def test_cross_mean_square_against_definition():
    from poslens.metrics.noise import cross_mean_square

    g = torch.Generator().manual_seed(4)
    a = torch.randn(5, 6, generator=g, dtype=torch.float64) + 1.0
    w = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0], dtype=torch.float64)
    sig, noise = cross_mean_square(a, w)
    an, wn = a.numpy(), (w / w.sum()).numpy()
    num = sum(wn[i] * wn[j] * an[i] @ an[j] for i in range(5) for j in range(5) if i != j) / 6
    den = sum(wn[i] * wn[j] for i in range(5) for j in range(5) if i != j)
    observed = np.mean((wn[:, None] * an).sum(0) ** 2)
    assert sig == pytest.approx(num / den, rel=1e-12)
    assert sig + noise == pytest.approx(observed, rel=1e-12)
    # a known mean: with many groups of small noise the signal estimates mean(E[a]^2) = 1
    b = 1.0 + 0.01 * torch.randn(64, 200, generator=g, dtype=torch.float64)
    s2, n2 = cross_mean_square(b, torch.ones(64, dtype=torch.float64))
    assert s2 == pytest.approx(1.0, abs=1e-3) and n2 == pytest.approx(1e-4 / 64, rel=0.2)


def test_jackknife_se_of_the_mean_is_the_standard_error():
    """For the mean of equal-sized groups the delete-one jackknife SE equals the usual SE of the group means."""
    from poslens.metrics.noise import jackknife_se

    g = torch.Generator().manual_seed(5)
    gm = torch.randn(9, generator=g, dtype=torch.float64)
    counts = torch.full((9,), 4, dtype=torch.int64)
    se = jackknife_se(lambda m: float(m), gm * 4, counts)
    assert se == pytest.approx(float(scipy.stats.sem(gm.numpy())), rel=1e-12)
    assert jackknife_se(lambda m: float(m), gm[:1] * 4, counts[:1]) is None
    assert jackknife_se(lambda m: None, gm * 4, counts) is None


def test_min_pvalue_edges_and_sampled_flips_above_sixteen_groups():
    from poslens.metrics.noise import min_pvalue, signflip_pvalue

    assert min_pvalue(2) == 0.5 and min_pvalue(16) == 2.0**-15 and min_pvalue(17) == 1 / (2**15 + 1)
    g = torch.Generator().manual_seed(6)
    a = torch.randn(17, 3, generator=g, dtype=torch.float64)
    w = torch.ones(17, dtype=torch.float64)
    # every group on one side: only the identity among 2^15 random patterns reaches the statistic
    assert signflip_pvalue(a.abs() + 5.0, w) == min_pvalue(17)
    assert signflip_pvalue(a[:16].abs() + 5.0, w[:16]) == min_pvalue(16)  # 16 groups: all 2^15 patterns
    # a null sample: the sampled p-value agrees with all 2^17 patterns to Monte Carlo precision
    signs = 1.0 - 2.0 * ((np.arange(2**17)[:, None] >> np.arange(17)) & 1)
    an = a.numpy()
    stats = ((signs @ an) ** 2).sum(1)
    exact = float(np.mean(stats >= stats[0] * (1 - 1e-12)))
    assert signflip_pvalue(a, w) == pytest.approx(exact, abs=0.01)


def test_two_groups_are_enough_for_an_estimate_one_is_not():
    from poslens.metrics.noise import cross_mean_square, jackknife_se, signflip_pvalue

    a = torch.tensor([[1.0, 2.0], [3.0, 5.0]], dtype=torch.float64)
    w = torch.ones(2, dtype=torch.float64)
    assert signflip_pvalue(a, w) == 0.5  # same signs: the identity of 2 patterns
    sig, noise = cross_mean_square(a, w)
    assert sig == pytest.approx((1 * 3 + 2 * 5) / 2) and sig + noise == pytest.approx((2.0**2 + 3.5**2) / 2)
    assert jackknife_se(lambda m: float(m.sum()), a, torch.tensor([1, 1])) == pytest.approx(
        float(scipy.stats.sem([3.0, 8.0])))
    assert cross_mean_square(a[:1], w[:1]) is None and cross_mean_square(a[:, :0], w) is None
