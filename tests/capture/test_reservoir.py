"""The q/k reservoir: a uniform, order-independent, mergeable sample of token slots."""

from __future__ import annotations

import pytest
import torch

from poslens.capture.statistics.reservoir import QKReservoir, slot_keys
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.rundir.io import read_tensors

L, H, HK, D, S = 2, 4, 2, 8, 12


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tests.capture.test_capture import save_tiny

    return save_tiny("llama", tmp_path_factory.mktemp("llama") / "m")


def _vectors(num_seqs):
    """Deterministic per-slot vectors: q [N, H, S, D], k [N, Hk, S, D] (float32)."""
    g = torch.Generator().manual_seed(7)
    return (torch.randn(L, num_seqs, H, S, D, generator=g), torch.randn(L, num_seqs, HK, S, D, generator=g))


def _feed(res, q, k, batches, first_seq=0):
    seq = first_seq
    for b in batches:
        res.begin_batch(seq, b)
        for li in range(L):
            res.observe(li, q[li, seq:seq + b], k[li, seq:seq + b])
        res.end_batch()
        seq += b
    return res


def _new(size, seed=3):
    return QKReservoir(size, L, H, HK, D, S, seed=seed)


def test_slot_keys_do_not_depend_on_batching():
    whole = slot_keys(5, 10, 4, S)
    parts = torch.cat([slot_keys(5, 10, 1, S), slot_keys(5, 11, 3, S)])
    assert torch.equal(whole, parts)
    assert not torch.equal(whole, slot_keys(6, 10, 4, S))


def test_reservoir_keeps_the_slots_with_the_smallest_keys():
    q, k = _vectors(9)
    res = _feed(_new(20), q, k, [4, 2, 3])
    keys = slot_keys(3, 0, 9, S)
    want = torch.sort(keys).indices[:20]
    assert torch.equal(res.keys, keys[want])
    assert torch.equal(res.tokens, torch.stack([want // S, want % S], 1))
    for li in range(L):  # the vectors are those of the kept slots
        assert torch.equal(res.q[li], q[li, want // S, :, want % S].transpose(0, 1))
        assert torch.equal(res.k[li], k[li, want // S, :, want % S].transpose(0, 1))


def test_batching_and_merging_give_identical_reservoirs():
    q, k = _vectors(9)
    a = _feed(_new(25), q, k, [9])
    b = _feed(_new(25), q, k, [1] * 9)
    c = _feed(_new(25), q, k, [2, 2], first_seq=0).merge(_feed(_new(25), q, k, [3, 2], first_seq=4))
    for other in (b, c):
        for name in ("keys", "tokens", "q", "k"):
            assert torch.equal(getattr(a, name), getattr(other, name)), name


def test_reservoir_larger_than_the_data_holds_every_slot():
    q, k = _vectors(3)
    res = _feed(_new(100), q, k, [2, 1])
    assert res.filled == 3 * S
    out = res.result()
    assert sorted(map(tuple, out["reservoir_tokens"].tolist())) == [(n, i) for n in range(3) for i in range(S)]
    gram = torch.einsum("hrd,hre->hde", out["q_reservoir"][1].double(), out["q_reservoir"][1].double())
    direct = torch.einsum("nhsd,nhse->hde", q[1].double(), q[1].double())
    assert torch.allclose(gram, direct, atol=1e-9)


def test_sample_is_uniform_over_positions():
    # 2,000 of 40,000 slots: the kept positions are spread evenly (chi-square, 9 d.o.f., p > 0.001)
    seq_len = 400
    keys = slot_keys(0, 0, 100, seq_len)
    kept = torch.sort(keys).indices[:2000] % seq_len
    counts = torch.bincount(kept // 40, minlength=10).double()
    chi2 = ((counts - 200) ** 2 / 200).sum().item()
    assert chi2 < 27.9, counts


def test_resume_with_other_reservoir_size_is_refused():
    a = _new(10)
    state = a.state_dict()
    b = _new(12)
    try:
        b.load_state_dict(state)
    except Exception as e:  # noqa: BLE001
        assert "--reservoir" in str(e)
    else:
        raise AssertionError("a checkpoint of another reservoir size was accepted")


def test_scan_reservoir_matches_exact_second_moments(llama_dir, tmp_path):
    """Reservoir larger than all slots: its q/k vectors reproduce the exact q/k second moments."""
    cfg = ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "r"), data="random", seq_len=10, num_seqs=5,
                     batch_size=2, figures=False, reservoir=64)
    summary = run_scan(cfg, progress=False)
    assert summary["reservoir_slots"] == 50
    m = read_tensors(tmp_path / "r" / "maps.safetensors")
    n_tokens = 5 * 10
    for name, gram in (("q_reservoir", "q_gram"), ("k_reservoir", "k_gram")):
        x = m[name].double()  # [L, H, R, D]
        got = torch.einsum("lhrd,lhre->lhde", x, x) / n_tokens  # the per-token second moment
        assert torch.allclose(got, m[gram].double(), rtol=1e-4, atol=1e-6), name
    # a smaller reservoir is a subset of the same slots (same keys), with the same vectors
    cfg2 = ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "s"), data="random", seq_len=10, num_seqs=5,
                      batch_size=1, figures=False, reservoir=16)
    run_scan(cfg2, progress=False)
    m2 = read_tensors(tmp_path / "s" / "maps.safetensors")
    assert m2["q_reservoir"].shape[2] == 16
    assert torch.equal(m2["reservoir_tokens"], m["reservoir_tokens"][:16])
    assert torch.allclose(m2["q_reservoir"], m["q_reservoir"][:, :, :16], atol=1e-5)
