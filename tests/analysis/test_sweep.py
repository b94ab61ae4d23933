"""Random-init sweep (arXiv 2501.00073): small weights give adjacency, large weights do not."""

import json

import pytest
import torch

from poslens.analysis.sweep import SweepConfig, build_sweep_model, measure_sweep, parse_shape, reinit_normal
from poslens.errors import PoslensError


def test_reinit_rescales_one_draw():
    m = build_sweep_model("1x64", 16)
    w = dict(m.named_parameters())
    name = next(n for n, p in w.items() if p.dim() == 2 and "embed" not in n)
    reinit_normal(m, 0.1, seed=3)
    a = w[name].detach().clone()
    reinit_normal(m, 2.0, seed=3)
    b = w[name].detach().clone()
    assert torch.allclose(b, a * 20, rtol=1e-5)
    assert abs(float(b.std()) - 2.0) < 0.1
    assert all(float(p.detach().float().sub(1).abs().max()) == 0 for n, p in w.items() if p.dim() == 1)


def test_small_sigma_adjacency_large_sigma_chance():
    cfg = SweepConfig(out="unused", sigmas=[0.0002, 2.0], shapes=["1x128"], seq_len=16, num_seqs=8, batch_size=8)
    res = measure_sweep(cfg, progress=False)["1x128"]
    c, b = res["causal"]["aps"], res["bidirectional"]["aps"]  # [sigma, layer, seq]
    assert c.shape == (2, 2, 8)
    assert float(c[0, 1].mean()) > 0.95  # near-zero init: running mean, APS ≈ 1
    assert abs(float(c[1, 1].mean()) - 0.5) < 0.1  # σ = 2: peaked random attention, chance
    assert abs(float(b[0, 1].mean()) - 0.5) < 0.08  # no mask: chance even with small weights


def test_parse_shape():
    assert parse_shape("6x384") == (6, 384, 6)
    assert parse_shape("2x96")[2] >= 1
    with pytest.raises(PoslensError, match="LAYERSxWIDTH"):
        parse_shape("six")


def test_cli_sweep_run_dir(cli, tmp_path):
    out = tmp_path / "sw"
    code, _, err = cli("sweep", "--out", out, "--sigmas", "0.002,2", "--shapes", "1x64,2x64", "--seq-len", 10,
                       "--num-seqs", 3, "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert json.loads((out / "config.json").read_text())["command"] == "sweep"
    assert s["paper"] == "neighborhood" and len(s["tables"][0]["rows"]) == 4 and s["readings"] == []
    assert sorted(r["shape"] for r in s["judgement"]["shapes"]) == sorted(s["shapes"])
    assert all((out / f["file"]).exists() for f in s["figures"])
    code, _, err = cli("sweep", "--out", tmp_path / "bad", "--sigmas", "0,1", "--quiet")
    assert code == 2 and "--sigmas" in err and not (tmp_path / "bad").exists()
