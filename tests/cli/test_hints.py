"""Hints that work: the interrupt message's command is the command as given, ready to paste."""

from __future__ import annotations

import shlex

import pytest

from poslens.capture.scan.checkpoint import CHECKPOINT


@pytest.fixture
def interrupted_scan(monkeypatch):
    """``run_scan`` that leaves a checkpoint in --out and is then stopped by Ctrl-C."""
    import poslens.capture.scan.run as R

    def stopped(cfg, **kw):
        from pathlib import Path

        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        (Path(cfg.out) / CHECKPOINT).write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "run_scan", stopped)


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_the_resume_command_is_the_command_as_given(cli, interrupted_scan, tmp_path, extra):
    out = tmp_path / "my run"
    args = ["scan", str(tmp_path / "model dir"), "--out", str(out), "--data", "random", "--seq-len", "16",
            "--num-seqs", "3", "--layers", "0,1", "--quiet", *extra]
    code, _, err = cli(*args)
    assert code == 130, err
    msg = err.strip().splitlines()[-1]
    assert msg.startswith("poslens: interrupted: ") and "..." not in msg, msg
    command = msg.split("continue with: ", 1)[1]
    assert shlex.split(command) == ["poslens", *[a for a in args if a != "--overwrite"], "--resume"]


@pytest.fixture
def tiny_dir(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hints") / "tiny"
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    return path


SMALL = ["--data", "random", "--seq-len", "8", "--num-seqs", "2", "--threads", "1", "--no-figures"]


def test_the_loading_bar_is_hidden_unless_verbose(cli, tiny_dir, tmp_path):
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    code, _, err = cli("scan", tiny_dir, "--out", tmp_path / "a", *SMALL)
    assert code == 0 and "Loading weights" not in err, err
    code, _, err = cli("--verbose", "scan", tiny_dir, "--out", tmp_path / "b", *SMALL)
    assert code == 0 and "Loading weights" in err, err
    assert hf_logging.is_progress_bar_enabled() == was  # the process's setting is left as it was


def test_python_hides_the_loading_bar_without_progress(tiny_dir, capfd):
    from transformers.utils import logging as hf_logging

    import poslens

    was = hf_logging.is_progress_bar_enabled()
    poslens.scan(str(tiny_dir), data="random", seq_len=8, num_seqs=2, progress=False, threads=1)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled() == was


def test_a_stopped_training_prints_the_command_that_continues_it(cli, tmp_path, monkeypatch):
    import poslens.models.train as T

    monkeypatch.setattr(T, "train_model", lambda cfg: {"stopped_at_step": 3, "steps": 10, "out": cfg.out})
    args = ["train", "--out", str(tmp_path / "m"), "--task", "copy", "--preset", "micro", "--steps", "10"]
    code, out, err = cli(*args)
    assert code == 0, err
    command = out.strip().splitlines()[-1].split("continue with: ", 1)[1]
    assert shlex.split(command) == ["poslens", *args, "--resume"]
