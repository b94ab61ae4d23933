"""poslens.runtime: device and dtype parsing, and process-wide switches restored after use."""

import pytest
import torch

from poslens.errors import PoslensError
from poslens.runtime import no_hf_progress_bars, parse_device, resolve_dtype, torch_threads


def test_parse_device():
    assert parse_device("cpu") == "cpu"
    assert parse_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(PoslensError, match="--device 'tpu'"):
        parse_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(PoslensError, match="no CUDA GPU"):
            parse_device("cuda")


def test_resolve_dtype():
    assert resolve_dtype("bf16", "cpu", None) is torch.bfloat16
    assert resolve_dtype("auto", "cpu", None) is torch.float32

    class Cfg:
        dtype = "float16"

    assert resolve_dtype("auto", "cuda", Cfg()) is torch.float16
    with pytest.raises(PoslensError, match="--dtype 'int8'"):
        resolve_dtype("int8", "cpu", None)


def test_torch_threads_restored_even_after_an_error():
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    with torch_threads(want):
        assert torch.get_num_threads() == want
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with torch_threads(want):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_hf_progress_bars_switch_restored():
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    try:
        hf_logging.enable_progress_bar()
        with no_hf_progress_bars():
            assert not hf_logging.is_progress_bar_enabled()
        assert hf_logging.is_progress_bar_enabled()
        with no_hf_progress_bars(False):
            assert hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        with no_hf_progress_bars():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # a caller's own "off" stays off
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def test_build_model_leaves_the_global_rng_alone():
    from poslens.models.families import build_model

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = build_model("none", "micro", 32, seed=5)
    assert torch.equal(torch.rand(3), expected)
    b = build_model("none", "micro", 32, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
