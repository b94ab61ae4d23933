"""Direct tests of the statistics objects in ``poslens.stats`` against numpy / scipy on the same samples."""

import os
import socket

import numpy as np
import pytest
import scipy.stats
import torch

from poslens.stats import AccumulatorSet, MeanAccumulator


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
