"""``poslens compare`` from the command line: a run directory that loads back as a CompareResult and
renders as a report; each bad input one ``poslens: error:`` line, exit 2, nothing written."""

from __future__ import annotations

import pytest
import torch

import poslens
from tests.capture.test_scan import _byte_tokenizer, save_tokenized_tiny


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("cmp")
    a = save_tokenized_tiny(root / "a")
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(root / "deeper"))
    _byte_tokenizer(root / "deeper")
    return a, root / "deeper"


def test_compare_cli_writes_a_run_that_loads_and_reports(cli, models, tmp_path):
    a, _ = models
    out = tmp_path / "run"
    code, stdout, err = cli("compare", a, "--variant", "rope-scaling=yarn:2", "--seq-len", "24,48", "--num-seqs", "8",
                            "--out", out, "--threads", "1")
    assert code == 0, err
    r = poslens.load(out)
    assert type(r).__name__ == "CompareResult" and set(r.changes().seq_len) == {24, 48}
    assert r.summary["variants"] == ["rope-scaling=yarn:2"] and (out / "compare.safetensors").is_file()
    assert any(str(f.get("file", "")).startswith("compare_change_") for f in r.summary["figures"])
    code, _, err = cli("report", out, "--out", tmp_path / "report.html")
    assert code == 0, err
    assert (tmp_path / "report.html").stat().st_size > 10_000


@pytest.mark.parametrize("args,words", [
    (["--variant", "rope-scale=yarn:4"], "unknown variant"),
    (["--variant", "rope-scaling=yarn:0"], "yarn"),
    (["--seq-len", "96"], "--beyond-context"),
    (["--seq-len", "0"], "--seq-len"),
    (["--variant", "window=500"], "window"),
    (["DEEPER"], "layers"),
])
def test_compare_cli_bad_input(cli, models, tmp_path, args, words):
    a, deeper = models
    out = tmp_path / "o"
    args = [str(deeper) if x == "DEEPER" else x for x in args]
    pos = [x for x in args if x == str(deeper)]
    flags = [x for x in args if x != str(deeper)]
    code, stdout, err = cli("compare", a, *pos, *flags, "--num-seqs", "4", "--out", out, "--threads", "1")
    assert code == 2, (code, err)
    assert err.startswith("poslens: error:") and "\n" not in err and words in err, err
    assert not out.exists()
