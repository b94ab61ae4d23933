"""``poslens scan`` end to end: outputs, data sources, resume (bit-identical), safety and bad input."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.rundir.io import read_tensors
from tests.capture.test_capture import V, save_tiny

NAMES = ["scores", "probs", "slash", "cosine", "norms", "attn_cosine", "attn_norms", "q_gram", "k_gram", "dim_logit"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("llama") / "m")


def _scan(cli, model, out, *extra):
    return cli("scan", model, "--out", out, "--quiet", *extra)


def test_scan_writes_run_directory(cli, llama_dir, tmp_path):
    out = tmp_path / "run"
    code, _, err = _scan(cli, llama_dir, out, "--data", "random", "--seq-len", 16, "--num-seqs", 5, "--batch-size", 2,
                         "--heads", "1.2")
    assert code == 0, err
    for f in ("config.json", "maps.safetensors", "summary.json", "scores_raw.png", "scores_diagnorm.png"):
        assert (out / f).exists(), f
    maps = read_tensors(out / "maps.safetensors")
    assert set(NAMES) <= set(maps) and "head_probs" in maps
    assert maps["scores"].shape == (3, 16, 16) and maps["slash"].shape == (3, 4, 16)
    assert maps["cosine"].shape == (4, 16, 16) and maps["norms"].shape == (4, 16)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_seqs"] == 5 and len(summary["layers"]) == 3
    for row in summary["layers"]:
        for key in ("relativity_index", "relativity_index_with_sink", "locality", "locality_with_sink",
                    "diagonal_trend", "within_diag_rms", "within_diag_rms_noise", "nonrelative_p", "sink_weight",
                    "aps_mean", "aps_std", "mean_map_aps", "top_slash_heads"):
            assert key in row
    assert summary["slash_top_heads"][0]["score"] >= summary["slash_top_heads"][-1]["score"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["options"]["num_seqs"] == 5 and "torch" in cfg["versions"]


def test_scan_maps_equal_eager_reference(llama_dir, tmp_path):
    """The whole pipeline (from_pretrained, data, batches, float32 on disk) against eager attentions."""
    from transformers import AutoModelForCausalLM

    from poslens.data.sources import make_source

    cfg = ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "r"), data="random", seq_len=12, num_seqs=5,
                     batch_size=2, figures=False, seed=3)
    run_scan(cfg, progress=False)
    maps = read_tensors(tmp_path / "r" / "maps.safetensors")
    ids = make_source("random", seq_len=12, num_seqs=5, seed=3, vocab_size=V).batch(0, 5)
    eager = AutoModelForCausalLM.from_pretrained(str(llama_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        att = eager(input_ids=ids, output_attentions=True).attentions
    for l, a in enumerate(att):
        assert torch.allclose(maps["probs"][l].double(), a.double().mean((0, 1)), atol=1e-5)


def test_layers_subset(cli, llama_dir, tmp_path):
    out = tmp_path / "run"
    code, _, err = _scan(cli, llama_dir, out, "--data", "random", "--seq-len", 8, "--num-seqs", 2, "--layers", "1-2",
                         "--no-figures")
    assert code == 0, err
    assert read_tensors(out / "maps.safetensors")["scores"].shape[0] == 2
    assert [r["layer"] for r in json.loads((out / "summary.json").read_text())["layers"]] == [1, 2]
    assert not (out / "scores_raw.png").exists()


def test_resume_is_bit_identical(llama_dir, tmp_path):
    base = dict(model_dir=str(llama_dir), data="random", seq_len=10, num_seqs=7, batch_size=2, figures=False,
                checkpoint_every=1, keep_checkpoint=True)
    run_scan(ScanConfig(out=str(tmp_path / "a"), **base), progress=False)
    partial = run_scan(ScanConfig(out=str(tmp_path / "b"), **base), progress=False, stop_after_batches=2)
    assert partial == {"stopped_at": 4} and not (tmp_path / "b" / "maps.safetensors").exists()
    run_scan(ScanConfig(out=str(tmp_path / "b"), resume=True, **base), progress=False)
    a = read_tensors(tmp_path / "a" / "maps.safetensors")
    b = read_tensors(tmp_path / "b" / "maps.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ca = read_tensors(tmp_path / "a" / "checkpoint.safetensors")
    cb = read_tensors(tmp_path / "b" / "checkpoint.safetensors")
    for k in ca:
        assert torch.equal(ca[k], cb[k]), k  # the float64 sums themselves


@pytest.mark.parametrize("every, keep, written", [(10, False, []), (2, False, [2]), (1, False, [1, 2, 3]),
                                                   (10, True, [4]), (2, True, [2, 4])])
def test_the_checkpoint_after_the_last_batch_is_written_only_when_kept(llama_dir, tmp_path, monkeypatch, every, keep,
                                                                        written):
    """Every ``checkpoint_every`` batches, but not after the last one unless --keep-checkpoint: finalize
    reads the sums from memory, and the file (as large as the float64 sums) would be removed again."""
    from poslens.capture.scan import run as run_module

    seen = []  # batches done (of 2 sequences) at each checkpoint written
    real = run_module.save_checkpoint

    def counted(out, capture, seqs, *a, **k):
        seen.append(seqs // 2)
        return real(out, capture, seqs, *a, **k)

    monkeypatch.setattr(run_module, "save_checkpoint", counted)
    out = tmp_path / "run"
    run_scan(ScanConfig(model_dir=str(llama_dir), out=str(out), data="random", seq_len=10, num_seqs=8, batch_size=2,
                        figures=False, checkpoint_every=every, keep_checkpoint=keep), progress=False)
    assert seen == written
    assert (out / "checkpoint.safetensors").exists() == keep and (out / "maps.safetensors").exists()


def test_killed_process_resumes_identically(llama_dir, tmp_path):
    """SIGKILL a real `poslens scan` process after its first checkpoint, then --resume."""
    args = ["--data", "random", "--seq-len", "24", "--num-seqs", "40", "--batch-size", "2", "--checkpoint-every", "1",
            "--no-figures", "--quiet"]
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "poslens", "scan", str(llama_dir), "--out", str(out), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    while not (out / "checkpoint.safetensors").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    cfg = dict(model_dir=str(llama_dir), data="random", seq_len=24, num_seqs=40, batch_size=2, checkpoint_every=1,
               figures=False)
    run_scan(ScanConfig(out=str(out), resume=True, **cfg), progress=False)
    run_scan(ScanConfig(out=str(tmp_path / "clean"), **cfg), progress=False)
    a = read_tensors(out / "maps.safetensors")
    b = read_tensors(tmp_path / "clean" / "maps.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_with_other_options_is_refused(cli, llama_dir, tmp_path):
    out = tmp_path / "run"
    assert _scan(cli, llama_dir, out, "--data", "random", "--seq-len", 8, "--num-seqs", 2, "--no-figures")[0] == 0
    code, _, err = _scan(cli, llama_dir, out, "--data", "random", "--seq-len", 8, "--num-seqs", 3, "--resume")
    assert code == 2 and "different options" in err
    # the same options: the finished scan's checkpoint is gone, so there is nothing to resume (not a rerun)
    code, _, err = _scan(cli, llama_dir, out, "--data", "random", "--seq-len", 8, "--num-seqs", 2, "--no-figures",
                         "--resume")
    assert code == 2 and "finished scan" in err
    code, _, err = _scan(cli, llama_dir, out, "--data", "random", "--seq-len", 8, "--num-seqs", 2)
    assert code == 2 and "not empty" in err


def _byte_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(str(path))


def save_tokenized_tiny(path):
    """A tiny random-init Llama (2 layers, hidden 32, 64 positions) with a byte-level tokenizer at ``path``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    _byte_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def tokenized_dir(tmp_path_factory):
    return save_tokenized_tiny(tmp_path_factory.mktemp("tok") / "m")


@pytest.mark.parametrize("kind", ["stdlib", "text", "jsonl_text", "jsonl_ids", "dir"])
def test_data_sources(cli, tokenized_dir, tmp_path, kind):
    text = "def f(x):\n    return x + 1\n" * 20
    if kind == "stdlib":
        data = "stdlib"
    elif kind == "text":
        data = tmp_path / "a.txt"
        data.write_text(text)
    elif kind == "dir":
        data = tmp_path / "d"
        data.mkdir()
        (data / "a.txt").write_text(text)
    elif kind == "jsonl_text":
        data = tmp_path / "a.jsonl"
        data.write_text("\n".join(json.dumps({"text": text}) for _ in range(2)))
    else:
        data = tmp_path / "ids.jsonl"
        data.write_text("\n".join(json.dumps({"input_ids": list(range(3, 100))}) for _ in range(2)))
    out = tmp_path / "run"
    code, _, err = _scan(cli, tokenized_dir, out, "--data", data, "--seq-len", 16, "--num-seqs", 3, "--no-figures")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["num_seqs"] == 3


def test_packed_text_is_deterministic(tokenized_dir):
    from poslens.capture.model.load import load_tokenizer
    from poslens.data.sources import make_source

    tok = load_tokenizer(str(tokenized_dir))
    a = make_source("stdlib", seq_len=16, num_seqs=4, tokenizer=tok, vocab_size=260)
    b = make_source("stdlib", seq_len=16, num_seqs=4, tokenizer=tok, vocab_size=260)
    assert torch.equal(a.batch(0, 4), b.batch(0, 4)) and torch.equal(a.batch(1, 3), b.batch(0, 4)[1:3])
    r = make_source("random", seq_len=16, num_seqs=4, vocab_size=260, seed=5)
    assert torch.equal(r.batch(2, 4), r.batch(0, 4)[2:4])


def test_datasets_directory(cli, llama_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [list(range(3, 60))] * 2})
    ds.save_to_disk(str(tmp_path / "ds"))
    code, _, err = _scan(cli, llama_dir, tmp_path / "run", "--data", tmp_path / "ds", "--seq-len", 16, "--num-seqs", 2,
                         "--no-figures")
    assert code == 0, err


# --- bad input: clear error, non-zero exit, nothing written -------------------------------------
@pytest.mark.parametrize("case", ["missing", "no_config", "seq_len", "empty_data", "layers", "heads", "no_tokenizer",
                                  "bad_ids", "dtype"])
def test_bad_input(cli, llama_dir, tmp_path, case):
    model, extra = llama_dir, ["--data", "random", "--seq-len", 8, "--num-seqs", 2]
    expect = {"missing": "does not exist", "no_config": "no config.json", "seq_len": "exceeds the model's maximum",
              "empty_data": "empty", "layers": "--layers", "heads": "--heads", "no_tokenizer": "no tokenizer",
              "bad_ids": "outside the model's vocabulary", "dtype": "--dtype"}[case]
    if case == "missing":
        model = tmp_path / "nope"
    elif case == "no_config":
        model = tmp_path / "empty_model"
        model.mkdir()
    elif case == "seq_len":
        extra = ["--data", "random", "--seq-len", 65]
    elif case == "empty_data":
        (tmp_path / "e.jsonl").write_text("")
        extra = ["--data", tmp_path / "e.jsonl", "--seq-len", 8]
    elif case == "layers":
        extra += ["--layers", "0,3"]
    elif case == "heads":
        extra += ["--heads", "1.9"]
    elif case == "no_tokenizer":
        (tmp_path / "t.txt").write_text("hello world " * 50)
        extra = ["--data", tmp_path / "t.txt", "--seq-len", 8]
    elif case == "bad_ids":
        (tmp_path / "i.jsonl").write_text(json.dumps({"input_ids": [5000] * 40}))
        extra = ["--data", tmp_path / "i.jsonl", "--seq-len", 8]
    elif case == "dtype":
        extra += ["--dtype", "fp8"]
    out = tmp_path / "out"
    code, _, err = _scan(cli, model, out, *extra)
    assert code == 2 and expect in err, err
    assert not out.exists()


def test_pickle_and_remote_code_are_refused(cli, tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.capture.test_capture import tiny_config

    p = tmp_path / "pkl"
    model = AutoModelForCausalLM.from_config(tiny_config("gpt2"))
    model.save_pretrained(str(p))
    for f in p.glob("*.safetensors"):  # keep config.json, replace the weights by a pickle file
        f.unlink()
    torch.save(model.state_dict(), p / "pytorch_model.bin")
    args = ["--data", "random", "--seq-len", 8, "--num-seqs", 2, "--no-figures"]
    code, _, err = _scan(cli, p, tmp_path / "o1", *args)
    assert code == 2 and "pickle" in err and "--allow-pickle" in err
    code, _, err = _scan(cli, p, tmp_path / "o2", *args, "--allow-pickle")
    assert code == 0, err

    r = save_tiny("llama", tmp_path / "remote")
    cfg = json.loads((r / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.X"}
    (r / "config.json").write_text(json.dumps(cfg))
    code, _, err = _scan(cli, r, tmp_path / "o3", *args)
    assert code == 2 and "--trust-remote-code" in err


def test_non_finite_scores_name_layer_and_head_and_leave_nothing_behind(cli, tmp_path):
    from transformers import AutoModelForCausalLM

    p = save_tiny("llama", tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(str(p))
    with torch.no_grad():  # head 2 of layer 1 overflows
        model.model.layers[1].self_attn.q_proj.weight[16:24] = 3e38
        model.model.layers[1].self_attn.k_proj.weight[8:16] = 3e38
    model.save_pretrained(str(p))
    out = tmp_path / "run"
    code, _, err = _scan(cli, p, out, "--data", "random", "--seq-len", 8, "--num-seqs", 2, "--no-figures")
    assert code == 2 and "layer 1, head 2" in err, err
    assert not out.exists() or not any(out.iterdir())  # a failed run into a new --out leaves nothing behind
    code, _, again = _scan(cli, p, out, "--data", "random", "--seq-len", 8, "--num-seqs", 2, "--no-figures")
    assert code == 2 and again == err  # so a plain rerun meets the same error, not a refusal of the directory


def test_pool_for_figure_block_means_skip_the_causal_triangle():
    from poslens.metrics.diagonal import causal_view
    from poslens.figures import pool_for_figure

    S = 10
    m = torch.arange(S * S, dtype=torch.float64).reshape(S, S)
    assert pool_for_figure(m, max_positions=16) is m  # short maps are drawn as they are
    p = pool_for_figure(causal_view(m), max_positions=4)  # f = 3: blocks of 3 (the last padded)
    assert p.shape == (4, 4)
    assert p[0, 0] == (0 + 10 + 11 + 20 + 21 + 22) / 6  # the block's lower triangle only
    assert p[1, 0] == m[3:6, 0:3].mean()
    assert p[3, 3] == m[9, 9] and p[3, 0] == m[9, 0:3].mean()  # the ragged last block
    assert bool(torch.isnan(p[0, 1])) and bool(torch.isnan(p[0, 3]))  # wholly above the diagonal


def _brute_aps(h: torch.Tensor, positions: torch.Tensor) -> float:
    """The paper's APS of one sequence by counting triples (an independent reference)."""
    v = torch.nn.functional.normalize(h[positions].double().reshape(len(positions), -1), dim=-1)
    c = (v[:, None, :] * v[None, :, :]).sum(-1)  # every entry the same elementwise sum: identical vectors tie exactly
    T = len(positions)
    hits = sum(bool(c[i, k] > c[i, j]) for i in range(T) for k in range(i) for j in range(k))
    return hits / math.comb(T, 3)


def test_one_sequence_mean_map_aps_is_its_own_aps_with_repeated_tokens(tmp_path):
    """One sequence: the mean cosine map is that sequence's map, so its APS is the sequence's own.
    At the embedding layer a repeated token gives identical vectors (exact ties); the Gram's
    separate products (300 positions: quarters and leaves) must keep them tied, as the per-sequence
    cosines do, or the mean-map APS counts their last bits as rises."""
    from tests import archs

    model = archs.save_tiny("llama", tmp_path / "m", 0, layers=1, hidden=32, positions=512)
    cfg = ScanConfig(model_dir=str(model), out=str(tmp_path / "r"), data="random", seq_len=300, num_seqs=1,
                     batch_size=1, figures=False, seed=3)
    summary = run_scan(cfg, progress=False)
    assert summary["embedding_mean_map_aps"] == summary["embedding_aps"]


def test_per_sequence_aps_equals_hidden_state_reference(llama_dir, tmp_path):
    """Scan's APS is the paper's per-sequence APS (mean and std over sequences) of the residual stream
    (transformers' output_hidden_states, the last one before the final norm) and of the head outputs
    before o_proj, on a position subsample."""
    from transformers import AutoModelForCausalLM

    from poslens.data.sources import make_source

    S, N = 20, 6
    cfg = ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "r"), data="random", seq_len=S, num_seqs=N,
                     batch_size=4, figures=False, seed=5, aps_max_positions=12)
    summary = run_scan(cfg, progress=False)
    ids = make_source("random", seq_len=S, num_seqs=N, seed=5, vocab_size=V).batch(0, N)
    model = AutoModelForCausalLM.from_pretrained(str(llama_dir), attn_implementation="eager").eval()
    model.config.tie_last_hidden_states = False  # hidden_states[-1]: the last layer's output, before the norm
    heads = {}
    for l, layer in enumerate(model.model.layers):
        layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a, l=l: heads.__setitem__(l, a[0].detach()))
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
    pos = torch.linspace(0, S - 1, 12).round().long()
    for k, h in enumerate(hs):
        ref = torch.tensor([_brute_aps(h[b], pos) for b in range(N)], dtype=torch.float64)
        got = (summary["embedding_aps_mean"], summary["embedding_aps_std"]) if k == 0 else \
            (summary["layers"][k - 1]["aps_mean"], summary["layers"][k - 1]["aps_std"])
        assert got[0] == pytest.approx(float(ref.mean()), abs=1e-9), k
        assert got[1] == pytest.approx(float(ref.std()), abs=1e-9), k
    for l, o in heads.items():
        ref = torch.tensor([_brute_aps(o[b], pos) for b in range(N)], dtype=torch.float64)
        row = summary["layers"][l]
        assert (row["attn_aps_mean"], row["attn_aps_std"]) == (pytest.approx(float(ref.mean()), abs=1e-9),
                                                              pytest.approx(float(ref.std()), abs=1e-9)), l
    # the APS of the mean map is another number, kept under its own name
    assert summary["layers"][0]["aps"] == summary["layers"][0]["aps_mean"] and "mean_map_aps" in summary["layers"][0]


def test_slash_summary_stays_in_the_offset_range(llama_dir, tmp_path):
    """No summary names an offset beyond Δ = 16 (or one with fewer than half the queries) a slash head,
    even when a head's strongest sub-diagonal is the sink column's far corner."""
    summary = run_scan(ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "r"), data="random", seq_len=40,
                                  num_seqs=4, batch_size=2, figures=False), progress=False)
    assert summary["slash_offsets"] == [1, 16]
    tops = summary["slash_top_heads"] + [t for l in summary["layers"] for t in l["top_slash_heads"]]
    assert tops and all(1 <= t["offset"] <= 16 for t in tops)
    for l in summary["layers"]:
        assert 0.0 <= l["sink_weight"] <= 1.0


def test_score_groups_partition_the_sequences(llama_dir, tmp_path):
    """Sequence n is in noise group n % 16; the groups' sums add up to the scores on the grid."""
    from poslens.capture.statistics.accumulators import noise_grid

    S, N = 12, 20
    run_scan(ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "r"), data="random", seq_len=S, num_seqs=N,
                        batch_size=3, figures=False), progress=False)
    maps = read_tensors(tmp_path / "r" / "maps.safetensors")
    counts = maps["score_group_counts"]
    assert counts.tolist() == [2, 2, 2, 2] + [1] * 12
    g = maps["score_groups"].double()
    total = (g * counts.double()[:, None, None, None]).sum(0) / N
    grid = noise_grid(S, 128)
    lower = torch.ones(len(grid), len(grid), dtype=torch.bool).tril()
    want = maps["scores"].double()[:, grid][:, :, grid]
    assert torch.allclose(total[:, lower], want[:, lower], atol=1e-5)


def test_map_size_scan_equals_block_means_of_full_scan(cli, llama_dir, tmp_path):
    """`--map-size` on the whole pipeline: block maps equal the block means of a full scan's maps, O(S)
    statistics equal the full scan's, the sink weight is the exact key-0 column, the checkpoint of a
    finished scan is gone (kept with --keep-checkpoint)."""
    base = ("--data", "random", "--seq-len", 24, "--num-seqs", 3, "--batch-size", 2, "--heads", "1.2")
    code, _, err = _scan(cli, llama_dir, tmp_path / "full", *base)
    assert code == 0, err
    code, _, err = _scan(cli, llama_dir, tmp_path / "blk", *base, "--map-size", 6, "--keep-checkpoint")
    assert code == 0, err
    assert not (tmp_path / "full" / "checkpoint.safetensors").exists()
    assert (tmp_path / "blk" / "checkpoint.safetensors").exists()
    full = read_tensors(tmp_path / "full" / "maps.safetensors")
    blk = read_tensors(tmp_path / "blk" / "maps.safetensors")
    f, S = 4, 24
    causal = torch.ones(S, S, dtype=torch.bool).tril()

    def block_means(m, valid):
        m = m.double().masked_fill(~valid, 0).reshape(*m.shape[:-2], S // f, f, S // f, f).sum((-3, -1))
        cnt = valid.double().reshape(S // f, f, S // f, f).sum((1, 3))
        return torch.where(cnt > 0, m / cnt.clamp_min(1), 0.0)

    for name in ("scores", "probs", "head_scores", "head_probs"):
        assert blk[name].shape[-2:] == (6, 6)
        torch.testing.assert_close(blk[name].double(), block_means(full[name], causal), rtol=0, atol=1e-5, msg=name)
    for name in ("cosine", "attn_cosine"):
        torch.testing.assert_close(blk[name].double(), block_means(full[name], torch.ones(S, S, dtype=torch.bool)),
                                   rtol=0, atol=1e-5, msg=name)
    for name in ("slash", "norms", "q_gram", "dim_logit", "score_groups"):
        torch.testing.assert_close(blk[name], full[name], rtol=0, atol=1e-6, msg=name)
    sf = json.loads((tmp_path / "full" / "summary.json").read_text())
    sb = json.loads((tmp_path / "blk" / "summary.json").read_text())
    assert sb["map_size"]["blocks"] == 6 and sb["map_size"]["block"] == 4 and sf["map_size"] is None
    for lf, lb in zip(sf["layers"], sb["layers"]):
        assert abs(lf["sink_weight"] - lb["sink_weight"]) < 1e-6  # exact: the key-0 column, not its block
        assert lf["aps_mean"] == pytest.approx(lb["aps_mean"], abs=1e-6)  # per-sequence APS: same positions
        assert lb["flat_p"] == pytest.approx(lf["flat_p"], abs=1e-9)  # the noise floor reads the grid maps


def test_closed_form_checks_of_a_block_scan_hold_and_catch_a_wrong_map(cli, llama_dir, tmp_path):
    """benchmarks/check_block_scan.py (the 32k GPU run's check, where no full-map reference fits):
    passes on a real --map-size scan and on a full one, fails once a block of `probs` is off."""
    import importlib.util

    from safetensors.torch import load_file, save_file

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("check_block_scan", root / "benchmarks" / "check_block_scan.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    base = ("--data", "random", "--seq-len", 26, "--num-seqs", 3, "--batch-size", 2, "--heads", "1.2")
    for name, extra in (("blk", ("--map-size", 6)), ("full", ())):
        code, _, err = _scan(cli, llama_dir, tmp_path / name, *base, *extra)
        assert code == 0, err
        assert check.main(str(tmp_path / name)) == 0, name
    path = tmp_path / "blk" / "maps.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    t = load_file(str(path))
    t["probs"][0, 2, 1] *= 1.01  # one block 1 % off
    save_file(t, str(path), metadata=meta)
    assert check.main(str(tmp_path / "blk")) == 1


def test_scan_prints_its_throughput_and_the_report_card_shows_gpu_memory(cli, llama_dir, tmp_path):
    """Without --quiet the scan ends with its tokens, seconds and tokens/s (no GPU line on the CPU); a
    summary with a GPU peak shows it on the report's card."""
    from types import SimpleNamespace

    from poslens.reporting.cards import _meta

    code, out, err = cli("scan", llama_dir, "--out", tmp_path / "run", "--data", "random", "--seq-len", 16,
                         "--num-seqs", 3, "--batch-size", 2, "--no-figures")
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "48 tokens in" in out and "tokens/s" in out and "peak GPU memory" not in out
    assert "peak_gpu_memory_bytes" not in summary["throughput"]
    run = SimpleNamespace(summary={"throughput": {"tokens_per_s": 10.0, "peak_gpu_memory_bytes": 3 * 2**30}},
                          config={})
    assert ("peak GPU memory", "3.0 GiB") in _meta(run)


def test_a_model_poslens_loaded_is_freed_before_the_results_are_written(llama_dir, tmp_path, monkeypatch):
    """The weights of a model the scan loaded are gone before the merged sums are read out (both are
    as large), whether its last reference freed it or a collection had to."""
    import weakref

    from poslens.capture.scan import run as scan_module

    refs, seen = [], []
    load, merge = scan_module._load, scan_module._merge_and_write

    def loading(job, progress, given):
        model = load(job, progress, given)
        refs.append(weakref.ref(model))
        return model

    def merging(*a, **kw):
        seen.append(refs[0]() is None)
        return merge(*a, **kw)

    monkeypatch.setattr(scan_module, "_load", loading)
    monkeypatch.setattr(scan_module, "_merge_and_write", merging)
    run_scan(ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "r"), data="random", seq_len=12, num_seqs=4,
                        batch_size=2, figures=False), progress=False)
    assert seen == [True]


def test_the_plan_is_frozen_and_decides_the_rope_layers(llama_dir, tmp_path):
    """A plan is made once and not changed afterwards; it knows which layers rotate q/k before anything is
    loaded (an unlisted architecture without a rotary module: none), and planning writes nothing."""
    import dataclasses

    import transformers as tf

    from poslens.capture.scan.plan import plan_scan

    common = dict(data="random", seq_len=8, num_seqs=2)
    plan = plan_scan(ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "run"), **common))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.device = "cpu"
    assert plan.spec.rope_layers == set(range(plan.spec.num_layers))
    tf.AutoModelForCausalLM.from_config(tf.OPTConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
        max_position_embeddings=64, word_embed_proj_dim=32)).save_pretrained(str(tmp_path / "opt"))
    with pytest.warns(UserWarning, match="'opt' has no adapter"):
        plan = plan_scan(ScanConfig(model_dir=str(tmp_path / "opt"), out=str(tmp_path / "run"), **common))
    assert plan.adapter.generic and plan.spec.rope_layers == set()
    assert not (tmp_path / "run").exists()


def test_the_out_dir_is_checked_once_per_scan(cli, llama_dir, tmp_path, monkeypatch):
    """``poslens scan`` and ``poslens.scan`` check --out in one place, once, before anything is loaded."""
    import poslens
    import poslens.capture.scan.plan as plan_module
    from poslens.rundir import outdir

    seen = []

    def counted(out, **kw):
        seen.append(Path(out))
        return real(out, **kw)

    real = outdir.check_out_dir
    monkeypatch.setattr(outdir, "check_out_dir", counted)
    monkeypatch.setattr(plan_module, "check_out_dir", counted)
    args = ("--data", "random", "--seq-len", 8, "--num-seqs", 2, "--no-figures")
    assert _scan(cli, llama_dir, tmp_path / "cli", *args)[0] == 0
    assert seen == [tmp_path / "cli"]
    seen.clear()
    assert _scan(cli, llama_dir, tmp_path / "cli", *args, "--overwrite")[0] == 0
    assert seen == [tmp_path / "cli"]
    seen.clear()
    poslens.scan(str(llama_dir), data="random", seq_len=8, num_seqs=2, out=tmp_path / "api", progress=False)
    assert seen == [tmp_path / "api"]
    seen.clear()
    poslens.scan(str(llama_dir), data="random", seq_len=8, num_seqs=2, out=tmp_path / "api", overwrite=True,
                 progress=False)
    assert seen == [tmp_path / "api"]
    seen.clear()
    with pytest.raises(poslens.PoslensError, match="contradict"):
        poslens.scan(str(llama_dir), data="random", out=tmp_path / "api", resume=True, overwrite=True)
    assert len(seen) == 1
