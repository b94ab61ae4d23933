"""A scan's Result: ``plot("slash")`` saved with a plain ``savefig`` keeps its legend in the image, and
``tables()`` gives the scan's tables (its layers and heads) rather than ``{}``."""

from __future__ import annotations

import pytest
import torch

import poslens


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hints") / "tiny"
    cfg = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=12,
                      num_key_value_heads=4, max_position_embeddings=64)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    return poslens.scan(str(path), data="random", seq_len=32, num_seqs=2, progress=False, threads=1)


@pytest.mark.parametrize("head", [None, 3])
def test_the_slash_legend_is_inside_the_saved_image(scanned, tmp_path, head):
    import matplotlib.pyplot as plt

    fig = scanned.plot("slash", head=head)
    fig.savefig(tmp_path / "slash.png")  # no bbox_inches: the figure's own layout
    legend = fig.axes[0].get_legend()
    box, page = legend.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (box, page)
    plt.close(fig)


def test_a_given_axes_keeps_its_figures_layout(scanned):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    scanned.plot("slash", ax=ax)
    assert fig.get_layout_engine() is None
    plt.close(fig)


def test_tables_of_a_scan_are_its_layers_and_heads(scanned):
    t = scanned.tables()
    assert set(t) == {"layers", "heads"}
    assert len(t["layers"]) == 2 and len(t["heads"]) == 2 * 12
    assert t["layers"].equals(scanned.layers())
