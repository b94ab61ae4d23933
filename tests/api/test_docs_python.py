"""Every code block of docs/python.md runs, in order, in one namespace; the example notebook
executes from top to bottom. Both on a small random Llama with a byte-level BPE tokenizer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A 2-layer Llama with its own tokenizer (trained on a few standard-library sources)."""
    import transformers as tf

    from poslens.data.corpus import iter_texts
    from poslens.data.tokenizer import train_bpe_tokenizer

    d = tmp_path_factory.mktemp("docmodel")
    texts = [t for _, t in zip(range(20), iter_texts("stdlib"))]
    tok = train_bpe_tokenizer(texts, vocab_size=300, model_max_length=256)
    tok.save_pretrained(d)
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    return str(d)


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_docs_python_blocks_run(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what the blocks write (runs/, explore.html) stays out of the checkout
    blocks = python_blocks(ROOT / "docs" / "python.md")
    assert len(blocks) >= 6
    ns = {"MODEL_DIR": model_dir}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"docs/python.md block {i + 1}", "exec"), ns)
        except Exception as e:  # name the block in the failure
            raise AssertionError(f"docs/python.md block {i + 1} failed: {type(e).__name__}: {e}\n{code}") from e
    import matplotlib.pyplot as plt

    plt.close("all")


def test_quickstart_notebook_runs(model_dir, tmp_path):
    """The notebook runs as a reader runs it: no ``%matplotlib`` magic, no ipywidgets. Every figure
    cell shows a PNG, the result shows its HTML view, and no cell writes a warning."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
    # the notebook's first code cell names the model; point it at the small one
    nb.cells.insert(0, nbformat.v4.new_code_cell(f"MODEL_DIR = {model_dir!r}"))
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    cells = [c for c in nb.cells if c.cell_type == "code"]
    plots = [c for c in cells if ".plot(" in c.source]
    assert len(plots) >= 2
    for c in plots:
        assert any("image/png" in o.get("data", {}) for o in c.outputs), c.source
    outputs = [o for c in cells for o in c.get("outputs", [])]
    assert any("poslens.Result" in str(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert any("sink" in str(o.get("data", {}).get("text/html", "")) for o in outputs)
    streams = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "Warning" not in streams and "warn" not in streams.lower(), streams
