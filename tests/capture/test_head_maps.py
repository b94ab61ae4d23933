"""``--heads all``: every head's mean attention-weight map as block means (``head_maps [L, H, m, m]``),
against an independent brute-force reference (transformers' eager attention weights, block-meaned by
hand over the visible entries) on the C kernels and the torch pass, exact up to 128 tokens and on
blocks of 2 and 3 positions (a narrower last block) past them; consistent with ``probs``; resumed bit
for bit; ``all`` recorded as given and refused beside pairs."""

from __future__ import annotations

import json

import archs
import pytest
import torch

import poslens
from poslens import native
from poslens.capture.backends import choice as backends
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.errors import PoslensError
from poslens.rundir.io import read_tensors

B = 4

BACKENDS = [
    pytest.param("torch", backends.TORCH, id="torch"),
    pytest.param("auto", backends.NATIVE, id="native",
                 marks=pytest.mark.skipif(not native.available(), reason="the C kernels are not built here")),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return archs.save_tiny("llama", tmp_path_factory.mktemp("headmaps") / "m", positions=512)


def _ids(S: int, n: int = B, seed: int = 5) -> torch.Tensor:
    return torch.randint(3, archs.V, (n, S), generator=torch.Generator().manual_seed(seed))


def _eager_weights(model_dir, ids) -> torch.Tensor:
    """Each layer's attention weights from transformers' eager attention, mean over the sequences:
    ``[L, H, S, S]`` float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        att = model(input_ids=ids, output_attentions=True).attentions
    return torch.stack([a.double().mean(0) for a in att])


def _block_means(w: torch.Tensor, f: int) -> torch.Tensor:
    """Block means ``[..., n, n]`` of causal maps ``w [..., S, S]`` over the visible entries (``j <= i``)
    of blocks of ``f`` positions (the last one narrower), 0 where a block sees none: indicator
    matrices of the blocks, products by hand."""
    S = w.shape[-1]
    n = -(-S // f)
    member = torch.zeros(n, S, dtype=torch.float64)
    for i in range(S):
        member[i // f, i] = 1.0
    visible = torch.ones(S, S, dtype=torch.float64).tril()
    sums = member @ (w * visible) @ member.T
    counts = member @ visible @ member.T
    return torch.where(counts > 0, sums / counts.clamp_min(1), 0.0)


@pytest.mark.parametrize("S,f", [(40, 1), (200, 2), (257, 3)], ids=["exact", "f2", "f3-ragged"])
@pytest.mark.parametrize("kernel,expect", BACKENDS)
def test_head_maps_equal_block_means_of_eager_weights(model_dir, monkeypatch, S, f, kernel, expect):
    monkeypatch.setenv(native.KERNEL_ENV, kernel)
    ids = _ids(S)
    r = poslens.scan(str(model_dir), data=ids, heads="all", stats="scores", reservoir=0, progress=False)
    got = r.maps["head_maps"]
    n = -(-S // f)
    assert got.dtype == torch.float32 and got.shape == (2, 4, n, n)
    assert r.summary["head_map_block"] == f and r.summary["head_map_size"] == n
    assert r.summary["capture_backends"] == {expect: {"layers": [0, 1], "reason": r.summary["capture_backends"][
        expect]["reason"]}}  # every layer on the backend asked for
    want = _block_means(_eager_weights(model_dir, ids), f)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)
    if S % f:  # the narrower last block: its two (or one) positions, averaged over what they see
        assert got[..., -1, -1].double().sub(want[..., -1, -1]).abs().max() < 2e-6


@pytest.mark.parametrize("S,map_size", [(40, 0), (200, 100)], ids=["exact", "blocks"])
def test_the_mean_over_heads_is_the_probs_map(model_dir, S, map_size):
    """Where ``probs`` has the same grid (``--map-size`` giving the same blocks), the head maps' mean over
    heads is its map."""
    r = poslens.scan(str(model_dir), data=_ids(S), heads="all", stats="probs", map_size=map_size, reservoir=0,
                     progress=False)
    hm, probs = r.maps["head_maps"], r.maps["probs"]
    assert hm.shape[-2:] == probs.shape[-2:]
    torch.testing.assert_close(hm.double().mean(1), probs.double(), rtol=0, atol=1e-6)


def test_map_size_sets_the_grid_and_the_files_record_it(model_dir, tmp_path):
    cfg = ScanConfig(model_dir=str(model_dir), out=str(tmp_path / "r"), data="random", seq_len=60, num_seqs=2,
                     batch_size=2, figures=False, heads="all", map_size=16, stats=["slash"], reservoir=0)
    run_scan(cfg, progress=False)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "r" / "maps.safetensors"), "pt") as fh:
        meta = fh.metadata()
        shape = fh.get_slice("head_maps").get_shape()
    assert shape == [2, 4, 15, 15] and json.loads(meta["head_map_block"]) == 4  # ceil(60 / 16) = 4 positions
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["head_map_block"] == 4 and summary["head_map_size"] == 15
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["options"]["heads"] == "all"
    assert summary["capture_backends"].keys() == {backends.NATIVE if native.available() else backends.TORCH}


def test_without_all_there_are_no_head_maps(model_dir):
    r = poslens.scan(str(model_dir), data=_ids(16, 2), heads=[(1, 2)], stats="probs", reservoir=0, progress=False)
    assert "head_maps" not in r.maps and "head_probs" in r.maps and r.summary["head_map_block"] is None


def test_resume_is_bit_identical(model_dir, tmp_path):
    base = {"model_dir": str(model_dir), "data": "random", "seq_len": 150, "num_seqs": 5, "batch_size": 2,
            "figures": False, "checkpoint_every": 1, "keep_checkpoint": True, "heads": "all", "stats": ["probs"],
            "reservoir": 0}
    run_scan(ScanConfig(out=str(tmp_path / "a"), **base), progress=False)
    partial = run_scan(ScanConfig(out=str(tmp_path / "b"), **base), progress=False, stop_after_batches=1)
    assert partial == {"stopped_at": 2}
    run_scan(ScanConfig(out=str(tmp_path / "b"), resume=True, **base), progress=False)
    a = read_tensors(tmp_path / "a" / "maps.safetensors")
    b = read_tensors(tmp_path / "b" / "maps.safetensors")
    assert a["head_maps"].shape == (2, 4, 75, 75)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ca = read_tensors(tmp_path / "a" / "checkpoint.safetensors")
    cb = read_tensors(tmp_path / "b" / "checkpoint.safetensors")
    assert "head_maps.sum" in ca
    for k in ca:
        assert torch.equal(ca[k], cb[k]), k  # the float64 sums themselves


def test_all_beside_pairs_is_refused_in_one_line(cli, model_dir, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("scan", model_dir, "--out", out, "--data", "random", "--seq-len", 8, "--num-seqs", 2,
                       "--heads", "1.2,all")
    msg = err
    assert code == 2 and "\n" not in msg and "--heads" in msg and "all" in msg and "pairs" in msg
    assert not out.exists()
    with pytest.raises(PoslensError) as e:
        poslens.scan(str(model_dir), data=_ids(8, 2), heads=[(1, 2), "all"], progress=False)
    msg = str(e.value)
    assert "heads" in msg and "all" in msg and "\n" not in msg


def test_all_on_the_cli_keeps_every_head(cli, model_dir, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("scan", model_dir, "--out", out, "--data", "random", "--seq-len", 12, "--num-seqs", 2,
                       "--heads", "all", "--stats", "slash", "--no-figures", "--quiet")
    assert code == 0, err
    assert read_tensors(out / "maps.safetensors")["head_maps"].shape == (2, 4, 12, 12)
    assert json.loads((out / "config.json").read_text())["options"]["heads"] == "all"


def test_the_triton_choice_is_honest():
    """The Triton kernels form no per-head weight map: a layer that needs one takes the torch pass there."""
    q, k = torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16)
    why = backends._triton_refusal(q, k, frozenset({"head_weight_sums", "weight_sum"}), None, None)
    assert why is not None and "head_weight_sums" in why
    assert "head_weight_sums" not in backends.PROVIDES[backends.TRITON]
    assert "head_weight_sums" in backends.PROVIDES[backends.NATIVE]
