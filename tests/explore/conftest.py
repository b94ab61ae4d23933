"""Fixtures of the explorer's tests: a tiny random Llama, built once per module."""

from __future__ import annotations

from pathlib import Path

import pytest


def tiny_llama(path: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("explore_tiny") / "tiny")
