"""GGUF models: a damaged dequantised cache is rebuilt (it is never the user's to "download again"),
errors name the .gguf the user passed, and a fingerprint checks a truncated .gguf before it scans
any model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from faultkit import SCAN, one_error

pytest.importorskip("gguf")


def _gguf_helpers():
    path = Path(__file__).resolve().parents[1] / "capture" / "test_gguf.py"
    spec = importlib.util.spec_from_file_location("poslens_test_gguf_helpers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    helpers = _gguf_helpers()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    helpers.write_gguf(helpers.tiny_llama(), path)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_truncated_dequantised_cache_is_rebuilt(cli, gguf_file, cache, tmp_path):
    """Cause 16: a cut-short model.safetensors in the cache said "download or save it again", but
    the cache was never rebuilt; it is dequantised again and the scan gives the same maps."""
    import torch
    from safetensors.torch import load_file

    code, _, err = cli("scan", gguf_file, "--out", tmp_path / "a", *SCAN)
    assert code == 0, err
    weights = next((cache / "gguf").glob("*/model.safetensors"))
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    code, _, err = cli("scan", gguf_file, "--out", tmp_path / "b", *SCAN)
    assert code == 0, err
    assert weights.read_bytes() == whole
    a, b = (load_file(str(tmp_path / r / "maps.safetensors")) for r in "ab")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, equal_nan=True, msg=k)


def test_the_context_error_names_the_gguf_file(cli, gguf_file, cache, tmp_path):
    """Cause 16: --seq-len beyond the context named the cache folder, not the .gguf."""
    code, _, err = cli("scan", gguf_file, "--out", tmp_path / "o", *SCAN, "--seq-len", 500)
    one_error(code, err, str(gguf_file), "--seq-len 500")
    assert str(cache) not in err and not (tmp_path / "o").exists()


def test_fingerprint_refuses_a_truncated_gguf_before_scanning(cli, tiny, gguf_file, cache, tmp_path):
    """Cause 6: a truncated .gguf second in the list is refused before the first model is scanned."""
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(gguf_file.read_bytes()[:5000])
    code, _, err = cli("fingerprint", tiny, bad, "--out", tmp_path / "o2", "--seq-len", 8, "--num-seqs", 2,
                       "--quiet", "--threads", 1, "--no-figures", "--data", "random")
    one_error(code, err, "trunc.gguf")
    assert not (tmp_path / "o2").exists()
