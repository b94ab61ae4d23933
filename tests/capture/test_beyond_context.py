"""``--beyond-context``: a scan past the model's trained context (max_position_embeddings) is refused
without the flag, runs with it on a RoPE model (the summary records the trained context and that the
run is past it), and is refused even with it on a model with learned absolute positions (GPT-2)."""

from __future__ import annotations

import json

import pytest

import poslens
from poslens.capture.model.load import check_seq_len, trained_context
from poslens.capture.model.adapters import get_adapter
from poslens.errors import PoslensError
from poslens.reporting.readings.notes import beyond_context_note
from tests.archs import save_tiny, tiny_config

POSITIONS, PAST = 32, 48
ARGS = ("--data", "random", "--seq-len", PAST, "--num-seqs", 2, "--batch-size", 2, "--no-figures", "--quiet")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("llama") / "m", layers=2, hidden=32, heads=2, kv=1,
                     positions=POSITIONS)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_tiny("gpt2", tmp_path_factory.mktemp("gpt2") / "m", layers=2, hidden=32, heads=2, positions=POSITIONS)


def test_past_the_context_is_refused_without_the_flag(cli, llama_dir, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = cli("scan", llama_dir, "--out", out, *ARGS)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("poslens: error:")
    assert f"--seq-len {POSITIONS}" in err and "--beyond-context" in err
    assert not out.exists()


def test_the_flag_runs_past_the_context(cli, llama_dir, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("scan", llama_dir, "--out", out, *ARGS, "--beyond-context")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert (s["seq_len"], s["trained_context"], s["beyond_context"]) == (PAST, POSITIONS, True)
    assert len(s["layers"]) == 2 and all("beyond_context" not in l and "trained_context" not in l
                                         for l in s["layers"])
    assert beyond_context_note(s) is not None
    code, _, err = cli("scan", llama_dir, "--out", tmp_path / "within", *ARGS[:2], "--seq-len", POSITIONS,
                       *ARGS[4:], "--beyond-context")
    assert code == 0, err
    s = json.loads((tmp_path / "within" / "summary.json").read_text())
    assert (s["trained_context"], s["beyond_context"]) == (POSITIONS, False)
    assert beyond_context_note(s) is None


def test_the_python_keyword(llama_dir):
    from transformers import AutoModelForCausalLM

    with pytest.raises(PoslensError, match="beyond"):
        poslens.scan(llama_dir, data="random", seq_len=PAST, num_seqs=2)
    r = poslens.scan(llama_dir, data="random", seq_len=PAST, num_seqs=2, beyond_context=True)
    assert (r.summary["trained_context"], r.summary["beyond_context"]) == (POSITIONS, True)
    assert len(r.readings()) > 0 and r.readings()[0] == beyond_context_note(r.summary)
    model = AutoModelForCausalLM.from_pretrained(str(llama_dir))  # a loaded model: Python's spelling
    with pytest.raises(PoslensError, match="beyond_context=True"):
        poslens.scan(model, data="random", seq_len=PAST, num_seqs=2)
    r = poslens.scan(model, data="random", seq_len=PAST, num_seqs=2, beyond_context=True)
    assert r.summary["beyond_context"] is True


def test_learned_positions_are_refused_even_with_the_flag(cli, gpt2_dir, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("scan", gpt2_dir, "--out", out, *ARGS, "--beyond-context")
    assert code == 2
    assert len(err.splitlines()) == 1 and "'gpt2'" in err and f"{POSITIONS} rows" in err
    assert not out.exists()
    # within its table it runs, with the flag or without
    code, _, err = cli("scan", gpt2_dir, "--out", out, *ARGS[:2], "--seq-len", POSITIONS, *ARGS[4:],
                       "--beyond-context")
    assert code == 0, err


def test_check_seq_len_spellings():
    config = tiny_config("llama", layers=2, hidden=32, heads=2, kv=1, positions=POSITIONS)
    adapter = get_adapter(config)
    assert trained_context(adapter, config) == POSITIONS
    check_seq_len(adapter, config, POSITIONS, "m")  # at the limit: nothing to refuse
    check_seq_len(adapter, config, PAST, "m", beyond_context=True)
    with pytest.raises(PoslensError) as e:  # a command without the option: its fix is not offered
        check_seq_len(adapter, config, PAST, "m")
    assert "beyond" not in str(e.value)
    with pytest.raises(PoslensError) as e:
        check_seq_len(adapter, config, PAST, "m", "seq_len", beyond_context=False)
    assert "seq_len=32" in str(e.value) and "beyond_context=True" in str(e.value)
