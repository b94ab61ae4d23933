"""A model card says what the model is: a micro model ``poslens train`` made is not called "smollm3
architecture" (it only borrows SmolLM3's layout)."""

from __future__ import annotations

from poslens.reporting.cards import model_subtitle


def test_a_trained_micro_model_says_what_it_is():
    title = model_subtitle({"pe": "none", "preset": "micro", "task": "copy"}, {"model_type": "smollm3"})
    assert title.startswith("a micro model trained by poslens train") and "NoPE" in title and "copy" in title
    assert "smollm3 architecture" not in title
    title = model_subtitle({"pe": "rope", "data": "stdlib"}, {"model_type": "smollm3"})
    assert "language modelling" in title and "RoPE" in title


def test_any_other_model_directory_names_its_architecture():
    title = model_subtitle({}, {"model_type": "llama"})
    assert title == "a llama model directory"
