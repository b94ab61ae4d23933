"""Trainer: each family trains, saves, reloads with plain transformers, resumes bit-exactly;
bad input is refused before anything is written."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from poslens.errors import PoslensError
from poslens.models.train import TrainConfig, load_trained, lr_factor, train_model

FAST = dict(preset="micro", batch_size=8, eval_examples=32, eval_every=0, progress=False, threads=1)


def _cfg(out, **kw):
    args = dict(FAST, task="copy", max_len=4, steps=6, lr=3e-3)
    args.update(kw)
    return TrainConfig(out=str(out), **args)


def _losses(out):
    return [r["loss"] for r in map(json.loads, Path(out, "train_log.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


def _tree_digest(path):
    h = hashlib.sha256()
    for p in sorted(Path(path).rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("pe", ["none", "rope", "learned"])
def test_train_save_reload_and_exact_resume(pe, tmp_path):
    full = train_model(_cfg(tmp_path / "full", pe=pe, checkpoint_every=2))
    for key in ("initial_loss", "final_loss", "eval_accuracy", "eval_accuracy_long", "tokens_per_second"):
        assert full[key] is not None, key
    assert json.loads((tmp_path / "full" / "summary.json").read_text())["final_loss"] == full["final_loss"]

    # plain transformers loads it; the reloaded model reproduces the saved evaluation
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "full")
    tok = AutoTokenizer.from_pretrained(tmp_path / "full")
    assert tok("12|12", add_special_tokens=False).input_ids and model.config.vocab_size == len(tok)
    from poslens.data.tasks import evaluate_task

    again = evaluate_task(model, "copy", max_len=4, count=32, seed=0)
    assert again["eval_accuracy"] == full["eval_accuracy"]
    assert again["accuracy_by_length"] == {int(k): v for k, v in full["accuracy_by_length"].items()}
    assert sorted(again["accuracy_by_length"]) == list(range(1, 9))
    assert abs(again["eval_loss"] - full["eval_loss"]) < 1e-5

    # interrupted after step 3 (checkpoints at 2 and 3), then resumed: identical trajectory and weights
    part = train_model(_cfg(tmp_path / "part", pe=pe, checkpoint_every=2, stop_after=3))
    assert part["stopped_at_step"] == 3
    assert not (tmp_path / "part" / "summary.json").exists()
    assert len(_losses(tmp_path / "part")) == 3
    resumed = train_model(_cfg(tmp_path / "part", pe=pe, checkpoint_every=2, resume=True))
    assert _losses(tmp_path / "part") == _losses(tmp_path / "full")  # exact float equality
    assert len(_losses(tmp_path / "full")) == 6
    assert resumed["final_loss"] == full["final_loss"]
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "part").state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, a[k]), k
    assert not list((tmp_path / "part").glob("checkpoint-*"))  # cleaned up once complete


def test_deterministic_for_a_seed(tmp_path):
    train_model(_cfg(tmp_path / "a", pe="rope", steps=4))
    train_model(_cfg(tmp_path / "b", pe="rope", steps=4))
    train_model(_cfg(tmp_path / "c", pe="rope", steps=4, seed=1))
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b") != _losses(tmp_path / "c")


def test_loss_decreases_on_copy(tmp_path):
    s = train_model(_cfg(tmp_path / "m", pe="rope", steps=60, batch_size=32, lr=1e-2))
    assert s["final_loss"] < 0.8 * s["initial_loss"]


def test_steps_zero_saves_the_initial_model(tmp_path):
    from poslens.models.families import build_model

    s = train_model(_cfg(tmp_path / "r", pe="none", steps=0, init_std=0.002))
    assert s["initial_loss"] == s["final_loss"] and s["steps"] == 0
    model, tok, summary = load_trained(tmp_path / "r")
    ref = build_model("none", "micro", len(tok), seed=0, init_std=0.002, pad_token_id=tok.pad_token_id,
                      max_positions=model.config.max_position_embeddings)
    for k, v in ref.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    assert summary["initial_loss"] == s["initial_loss"]


def _small_corpus(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"def f{i}(x):\n    return x * {i} + {i % 7}\n"}) for i in range(400)]
    corpus.write_text("\n".join(lines))
    return corpus


def test_corpus_language_model(tmp_path):
    corpus = _small_corpus(tmp_path)
    s = train_model(TrainConfig(out=str(tmp_path / "lm"), pe="none", data=str(corpus), vocab_size=300, seq_len=32,
                                steps=5, **{**FAST, "eval_examples": 8}))
    assert s["eval_accuracy"] is None and s["eval_loss"] is not None
    tok = AutoTokenizer.from_pretrained(tmp_path / "lm")
    text = "def f3(x):\n    return x"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "lm").config.no_rope_layers == [0, 0]


def test_cli_steps_zero_is_a_quick_random_init_control(cli, tmp_path):
    """``--steps 0`` on a preset: the initial weights, a position limit set by --max-positions, and
    one batch of evaluation (not 500 windows) whose loss is that of an untrained model, ~ln(V)."""
    import math

    from poslens.models.families import build_model

    out = tmp_path / "r"
    code, stdout, err = cli("train", "--out", out, "--preset", "tiny", "--steps", "0", "--data", _small_corpus(tmp_path),
                            "--vocab-size", "300", "--seq-len", "32", "--batch-size", "4", "--max-positions", "1024",
                            "--threads", "1", "--quiet", "--json")
    assert code == 0, err
    s = json.loads(stdout)
    assert s["steps"] == 0 and s["eval_examples"] == 4 and s["tokens_seen"] == 0
    records = [json.loads(r) for r in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["train", "eval"] and records[0]["step"] == records[1]["step"] == 0
    model, tok, _ = load_trained(out)
    assert model.config.max_position_embeddings == 1024 and model.config.num_hidden_layers == 3
    ref = build_model("rope", "tiny", len(tok), seed=0, max_positions=1024, pad_token_id=tok.pad_token_id)
    for k, v in ref.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    # std-0.02 weights give near-uniform predictions: cross-entropy close to ln(vocabulary)
    for key in ("initial_loss", "eval_loss"):
        assert abs(s[key] - math.log(len(tok))) < 0.3, (key, s[key], len(tok))

    # without --max-positions the limit is the preset's (tiny: 512), raised to the training length
    code, stdout, err = cli("train", "--out", tmp_path / "r2", "--preset", "tiny", "--steps", "0", "--data",
                            _small_corpus(tmp_path), "--vocab-size", "300", "--seq-len", "600", "--batch-size", "1",
                            "--threads", "1", "--quiet")
    assert code == 0, err
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "r2").config.max_position_embeddings == 600


def test_stdlib_default_corpus(tmp_path):
    s = train_model(TrainConfig(out=str(tmp_path / "std"), pe="rope", corpus_files=3, vocab_size=300, seq_len=32,
                                steps=2, **{**FAST, "eval_examples": 4}))
    assert s["data"] == "stdlib" and s["initial_loss"] > 0


def test_lr_schedule():
    assert lr_factor(0, 100, 10, 0.1) == pytest.approx(0.1)
    assert lr_factor(9, 100, 10, 0.1) == pytest.approx(1.0)
    assert lr_factor(10, 100, 10, 0.1) == pytest.approx(1.0)
    assert lr_factor(99, 100, 10, 0.1) == pytest.approx(0.1, abs=1e-3)


# ---- bad input: clear error, exit code 2, nothing written or damaged ----

@pytest.mark.parametrize("args,msg", [
    (["--task", "sort"], "--task"),
    (["--preset", "huge"], "--preset"),
    (["--steps", "-1"], "--steps"),
    (["--pe", "alibi"], "--pe"),
    (["--data", "/nonexistent/corpus.txt"], "does not exist"),
    (["--task", "copy", "--max-len", "0"], "--max-len"),
    (["--max-positions", "0"], "--max-positions"),
    (["--seq-len", "64", "--max-positions", "32"], "--max-positions 32 is below the 64 positions"),
])
def test_cli_bad_input(cli, tmp_path, args, msg):
    out = tmp_path / "out"
    code, _, err = cli("train", "--out", out, "--steps", "2", "--quiet", *args)
    assert code == 2 and msg in err
    assert not out.exists()


def test_cli_empty_corpus(cli, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    code, _, err = cli("train", "--out", tmp_path / "o", "--data", empty, "--quiet")
    assert code == 2 and "no text" in err and not (tmp_path / "o").exists()


def test_existing_model_is_never_damaged(cli, tmp_path):
    other = tmp_path / "other"
    build = __import__("poslens.models.families", fromlist=["build_model"]).build_model
    build("rope", "micro", 40).save_pretrained(other)
    before = _tree_digest(other)
    for extra in ([], ["--resume"], ["--task", "nope"], ["--resume", "--overwrite"]):
        code, _, err = cli("train", "--out", other, "--task", "copy", "--steps", "2", "--quiet", *extra)
        assert code == 2, extra
    assert _tree_digest(other) == before

    run = tmp_path / "run"
    assert cli("train", "--out", run, "--task", "copy", "--max-len", "4", "--steps", "2", "--batch-size", "4",
               "--eval-examples", "8", "--quiet")[0] == 0
    before = _tree_digest(run)
    code, _, err = cli("train", "--out", run, "--task", "copy", "--steps", "2", "--quiet")
    assert code == 2 and "--overwrite" in err
    code, _, err = cli("train", "--out", run, "--task", "reverse", "--steps", "2", "--quiet", "--resume")
    assert code == 2 and "task" in err
    assert _tree_digest(run) == before
    # a finished run resumed with the same options is a no-op
    code, out, _ = cli("train", "--out", run, "--task", "copy", "--max-len", "4", "--steps", "2", "--batch-size", "4",
                       "--eval-examples", "8", "--quiet", "--resume", "--json")
    assert code == 0 and _tree_digest(run) == before
    # --overwrite would delete a file poslens did not write: refused, naming it; nothing changes
    (run / "notes.txt").write_text("keep me")
    before = _tree_digest(run)
    again = ("train", "--out", run, "--task", "reverse", "--max-len", "3", "--steps", "1", "--batch-size", "4",
             "--eval-examples", "8", "--quiet", "--overwrite", "--json")
    code, _, err = cli(*again)
    assert code == 2 and "notes.txt" in err
    assert _tree_digest(run) == before
    # a file poslens did not write is refused whatever its suffix; nothing changes
    (run / "notes.txt").unlink()
    (run / "stale.json").write_text("{}")
    before = _tree_digest(run)
    code, _, err = cli(*again)
    assert code == 2 and "stale.json" in err
    assert _tree_digest(run) == before
    # without it, --overwrite replaces the run whole: every file left is one the new run recorded
    (run / "stale.json").unlink()
    code, out, _ = cli(*again)
    assert code == 0 and json.loads(out)["task"] == "reverse"
    recorded = set(json.loads((run / ".poslens-files.json").read_text())["files"])
    left = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()} - {".poslens-files.json"}
    assert left and all(f in recorded or f.split("/")[0] + "/" in recorded for f in left), left - recorded


def test_zoo_micro(cli, tmp_path):
    code, out, _ = cli("zoo", "--out", tmp_path / "zoo", "--scale", "micro", "--only", "nope-copy,rope-random",
                       "--quiet", "--threads", "1")
    assert code == 0
    index = json.loads((tmp_path / "zoo" / "zoo.json").read_text())
    assert set(index["entries"]) == {"nope-copy", "rope-random"}
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "zoo" / "nope-copy").config.no_rope_layers[0] == 0
    code, _, err = cli("zoo", "--out", tmp_path / "zoo", "--scale", "micro", "--only", "bogus")
    assert code == 2 and "unknown" in err
