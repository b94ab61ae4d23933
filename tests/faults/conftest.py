"""Fixtures of the fault tests: a tiny Llama model directory, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def tiny_model(path: Path, seed: int = 0, **config) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, **config)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("faults") / "tiny")
