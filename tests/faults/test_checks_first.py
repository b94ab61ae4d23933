"""Checks before writing: every model a command takes is validated before anything is written
(a fingerprint checks all its models first), values out of range are one error line, and the
Python API raises a PoslensError naming the keyword."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from poslens.errors import PoslensError

from faultkit import SCAN, one_error

FP = ["--seq-len", "8", "--num-seqs", "2", "--quiet", "--threads", "1", "--no-figures", "--data", "random"]


def _damaged(tiny, tmp_path, kind):
    from safetensors.torch import load_file, save_file

    d = shutil.copytree(tiny, tmp_path / kind)
    w = d / "model.safetensors"
    if kind == "truncated":
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    elif kind == "mismatch":
        t = load_file(str(w))
        t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(16, 32)
        save_file(t, str(w), metadata={"format": "pt"})
    elif kind == "rope_theta":
        cfg = json.loads((d / "config.json").read_text())
        cfg["rope_theta"] = -5.0
        (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("kind,expect", [("truncated", "truncated"), ("mismatch", "q_proj"),
                                         ("rope_theta", "rope_theta")])
def test_fingerprint_checks_every_model_before_scanning(cli, tiny, tmp_path, kind, expect):
    """Cause 6: the good model is not scanned first; nothing is written."""
    bad = _damaged(tiny, tmp_path, kind)
    code, _, err = cli("fingerprint", tiny, bad, "--out", tmp_path / "o2", *FP)
    one_error(code, err, expect)
    assert not (tmp_path / "o2").exists()


def test_fingerprint_checks_the_context_length_first(cli, tiny, tmp_path):
    """Cause 6: --seq-len beyond a model's positions is refused before any scan."""
    code, _, err = cli("fingerprint", tiny, tiny, "--out", tmp_path / "o2", *FP, "--seq-len", 100)
    one_error(code, err, "--seq-len 100")
    assert not (tmp_path / "o2").exists()


def _temp_dirs() -> set:
    import glob
    import tempfile

    return set(glob.glob(f"{tempfile.gettempdir()}/poslens-*"))


@pytest.mark.parametrize("kw,name", [({"seq_len": "32"}, "seq_len="), ({"seq_len": 16.5}, "seq_len="),
                                     ({"num_seqs": "2"}, "num_seqs="), ({"data": None}, "data=None")])
def test_api_keywords_of_the_wrong_type_are_one_error(tiny, kw, name):
    """Cause 15: a TypeError or ValueError from deep inside, and a poslens-* temporary folder left
    behind, became a PoslensError naming the keyword, with nothing left."""
    import poslens

    before = _temp_dirs()
    args = {"data": "random", "seq_len": 8, "num_seqs": 2, **kw}
    with pytest.raises(PoslensError, match=name):
        poslens.scan(str(tiny), progress=False, **args)
    assert _temp_dirs() == before


def test_api_model_on_the_meta_device_is_one_error(tiny):
    """Cause 15: a model with no weights (meta device) gave a RuntimeError."""
    import poslens
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(tiny)))
    before = _temp_dirs()
    with pytest.raises(PoslensError, match="meta"):
        poslens.scan(model, data="random", seq_len=8, num_seqs=2, progress=False)
    assert _temp_dirs() == before


def test_token_ids_beyond_int64_are_one_error(cli, tiny, tmp_path):
    """Cause 9: JSONL input_ids, Python data and --seed beyond a 64-bit integer gave 'Overflow when
    unpacking long long' tracebacks and left config.json behind."""
    import poslens

    data = tmp_path / "ids.jsonl"
    data.write_text(json.dumps({"input_ids": [10**30] + [5] * 20}) + "\n")
    out = tmp_path / "o"
    code, _, err = cli("scan", tiny, "--out", out, *SCAN[2:], "--data", data)
    one_error(code, err, str(10**30))
    assert not out.exists()
    with pytest.raises(PoslensError, match=str(10**30)):
        poslens.scan(str(tiny), data=[[10**30] + [5] * 20], progress=False)
    code, _, err = cli("scan", tiny, "--out", out, *SCAN, "--seed", 2**70)
    one_error(code, err, "--seed")
    assert not out.exists()
    code, _, err = cli("simulate", "--out", out, "--samples", 4, "--seq-len", 4, "--dim", 4, "--num-layers", 1,
                       "--quiet", "--seed", 2**70)
    one_error(code, err, "--seed")
    assert not out.exists()


def test_a_nan_weight_is_one_error(cli, tiny, tmp_path):
    """Cause 14: a NaN in an MLP weight gave exit 0 with APS shown as '–' and no warning."""
    from safetensors.torch import load_file, save_file

    d = shutil.copytree(tiny, tmp_path / "nan")
    t = load_file(str(d / "model.safetensors"))
    t["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    code, _, err = cli("scan", d, "--out", tmp_path / "o", *SCAN)
    one_error(code, err, "mlp.down_proj.weight")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_weight_check_finds_every_non_finite_value_and_no_overflow(dtype):
    """The weight check decides by one sum: NaN and either infinity make it non-finite; a sum that
    overflows on finite weights (as large as the dtype holds) is checked entry by entry and passes."""
    from poslens.capture.scan.run import _all_finite

    w = torch.randn(64, 33).to(dtype)
    assert _all_finite(w)
    for bad in (float("nan"), float("inf"), -float("inf")):
        v = w.clone()
        v[17, 4] = bad
        assert not _all_finite(v)
    huge = torch.full((4, 4), torch.finfo(dtype).max / 2, dtype=dtype)
    assert not bool(torch.isfinite(huge.sum(dtype=torch.float64 if dtype == torch.float64 else torch.float32)))
    assert _all_finite(huge)
