"""The Python face: ``poslens.scan`` on a model already in memory equals the CLI's run bit for bit,
hands the model back as it was, and its tables equal independent eager computations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import poslens
from poslens.errors import PoslensError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from archs import tiny_config  # noqa: E402

S, N = 24, 6


def tiny(arch: str = "llama", seed: int = 0, **kw):
    import transformers as tf

    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(tiny_config(arch, **kw)).eval()


def ids(n: int = N, s: int = S, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 100, (n, s), generator=g)


def model_state(model) -> dict:
    """Everything a scan could leave changed on a model."""
    return {
        "attn": [getattr(m.config, "_attn_implementation", None) for m in model.modules()
                 if getattr(m, "config", None) is not None],
        "training": [m.training for m in model.modules()],
        "grad": [p.requires_grad for p in model.parameters()],
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
        "params": [p.data_ptr() for p in model.parameters()],
    }


def eager_head_sink(model, x: torch.Tensor) -> torch.Tensor:
    """``[L, H]``: mean over sequences and queries 1 … S−1 of each head's weight on key 0, from
    transformers' own eager attention (no poslens code)."""
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            att = model(input_ids=x, output_attentions=True, use_cache=False).attentions
    finally:
        model.set_attn_implementation(impl)
    A = torch.stack([a.double() for a in att])  # [L, B, H, S, S]
    return A[..., 1:, 0].mean(dim=(1, 3))


# --------------------------------------------------------------------------------------------
# the same run as the CLI's
# --------------------------------------------------------------------------------------------
def test_scan_of_loaded_model_equals_cli_run_bit_for_bit(tmp_path, cli):
    model = tiny()
    model.save_pretrained(tmp_path / "m")
    x = ids()
    with open(tmp_path / "ids.jsonl", "w") as f:
        for row in x.tolist():
            f.write(json.dumps({"input_ids": row}) + "\n")
    code, _, err = cli("scan", tmp_path / "m", "--out", tmp_path / "cli", "--data", tmp_path / "ids.jsonl",
                       "--seq-len", S, "--num-seqs", N, "--batch-size", 2, "--no-figures", "--quiet", "--threads", 1)
    assert code == 0, err
    r = poslens.scan(model, data=x, batch_size=2, progress=False, threads=1)
    c = poslens.load(tmp_path / "cli")
    assert set(r.maps) == set(c.maps) and "probs" in r.maps and "sink_heads" in r.maps
    for k in c.maps:
        assert torch.equal(r.maps[k], c.maps[k]), k
    # the same numbers in the summary, apart from where and how fast
    assert r.summary["layers"] == c.summary["layers"]
    # a path is scanned as the CLI scans it
    p = poslens.scan(tmp_path / "m", data=str(tmp_path / "ids.jsonl"), seq_len=S, num_seqs=N, batch_size=2,
                     progress=False, threads=1)
    for k in c.maps:
        assert torch.equal(p.maps[k], c.maps[k]), k


def test_token_id_lists_and_tensor_give_the_same_sequences():
    model = tiny()
    x = ids(4, 16)
    a = poslens.scan(model, data=x, stats="probs", progress=False)
    b = poslens.scan(model, data=x.tolist(), stats=["probs"], progress=False)
    assert torch.equal(a.maps["probs"], b.maps["probs"])
    assert a.summary["num_seqs"] == 4 and a.summary["seq_len"] == 16


# --------------------------------------------------------------------------------------------
# the model is handed back as it was
# --------------------------------------------------------------------------------------------
def test_model_left_as_it_was():
    model = tiny()
    model.train()  # a model mid-training: the scan runs in eval mode and restores training mode after
    model.model.layers[0].mlp.requires_grad_(False)
    x = ids()
    model.eval()
    with torch.no_grad():
        before = model(input_ids=x).logits.clone()
    model.train()
    state = model_state(model)
    poslens.scan(model, data=x, progress=False)
    assert model_state(model) == state
    model.eval()
    with torch.no_grad():
        after = model(input_ids=x).logits
    assert torch.equal(before, after)


def test_model_left_as_it_was_after_an_exception(monkeypatch, tmp_path):
    import poslens.capture.scan.run as scan_mod

    model = tiny()
    model.train()
    state = model_state(model)

    def boom(*a, **k):
        raise RuntimeError("planted failure inside the scan")

    monkeypatch.setattr(scan_mod, "_scan_batches", boom)
    with pytest.raises(RuntimeError, match="planted"):
        poslens.scan(model, data=ids(), out=tmp_path / "run", progress=False)
    assert model_state(model) == state
    assert model.config._attn_implementation == "sdpa"


def test_weights_are_not_copied():
    model = tiny()
    ptrs = [p.data_ptr() for p in model.parameters()]
    seen = []
    import poslens.capture.scan.run as scan_mod

    real = scan_mod._scan_batches

    def spy(job, m, *a, **k):
        seen.append([p.data_ptr() for p in m.parameters()])
        return real(job, m, *a, **k)

    scan_mod._scan_batches = spy
    try:
        poslens.scan(model, data=ids(), progress=False)
    finally:
        scan_mod._scan_batches = real
    assert seen == [ptrs]  # the scan ran the caller's own parameters


def test_bf16_model_is_scanned_in_its_dtype():
    model = tiny().to(torch.bfloat16)
    r = poslens.scan(model, data=ids(), stats="probs", progress=False)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert r.config["dtype"] == "torch.bfloat16"
    rows = r.maps["probs"][:, 1:, :].double().nansum(-1)  # each query row of the mean attention sums to 1
    assert torch.allclose(rows, torch.ones_like(rows), atol=2e-2)


# --------------------------------------------------------------------------------------------
# tables against independent computations
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_heads_sink_equals_eager(arch):
    model = tiny(arch)
    x = ids()
    r = poslens.scan(model, data=x, stats="probs,slash", progress=False)
    h = r.heads()
    ref = eager_head_sink(model, x)
    got = torch.tensor(h["sink"].to_numpy()).reshape(ref.shape)
    assert torch.allclose(got, ref, atol=1e-4, rtol=0)
    assert list(h.columns[:5]) == ["layer", "head", "sink", "slash_offset", "slash_score"]
    assert len(h) == ref.numel()


def test_heads_slash_is_the_strongest_offset_in_range():
    model = tiny()
    r = poslens.scan(model, data=ids(), stats="slash", progress=False)
    h = r.heads()
    slash = r.maps["slash"].double()
    for row in h.itertuples():
        prof = slash[row.layer, row.head, 1:17]
        assert row.slash_offset == int(prof.argmax()) + 1
        assert row.slash_score == pytest.approx(float(prof.max()), abs=1e-12)


def test_layers_table_names_its_convention():
    r = poslens.scan(tiny(), data=ids(), progress=False)
    df = r.layers()
    assert list(df["layer"]) == [0, 1]
    assert "decoder layers" in df.attrs["layer_convention"]
    assert {"relativity_index", "locality", "aps_mean", "aps_std"} <= set(df.columns)


def test_plot_returns_a_figure_and_refuses_unknown_maps():
    import matplotlib.figure

    r = poslens.scan(tiny(), data=ids(), progress=False)
    assert isinstance(r.plot("scores", layer=1), matplotlib.figure.Figure)
    assert isinstance(r.plot("slash", layer=0), matplotlib.figure.Figure)
    with pytest.raises(PoslensError, match="no map 'nonsense'"):
        r.plot("nonsense")
    with pytest.raises(PoslensError, match="layers 0 … 1"):
        r.plot("scores", layer=7)


# --------------------------------------------------------------------------------------------
# save and load
# --------------------------------------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path):
    r = poslens.scan(tiny(), data=ids(), progress=False)
    assert r.temporary
    tmp = r.path
    r.save(tmp_path / "x")
    assert not r.temporary and r.path == tmp_path / "x"
    back = poslens.load(tmp_path / "x")
    assert set(back.maps) == set(r.maps)
    for k in r.maps:
        assert torch.equal(back.maps[k], r.maps[k])
    assert back.summary == r.summary
    assert not tmp.exists()  # the temporary directory is removed once the result has a lasting place
    r.save(tmp_path / "x2")
    with pytest.raises(PoslensError, match="exists"):
        r.save(tmp_path / "x")


def test_temporary_result_is_removed_with_the_object():
    import gc

    r = poslens.scan(tiny(), data=ids(), progress=False)
    tmp = r.path
    assert tmp.exists()
    del r
    gc.collect()
    assert not tmp.exists()


def test_out_writes_a_cli_style_run_directory(tmp_path):
    r = poslens.scan(tiny(), data=ids(), out=tmp_path / "run", progress=False)
    assert not r.temporary
    assert {"config.json", "summary.json", "maps.safetensors"} <= {p.name for p in (tmp_path / "run").iterdir()}
    assert json.loads((tmp_path / "run" / "config.json").read_text())["command"] == "scan"


# --------------------------------------------------------------------------------------------
# errors: PoslensError with the CLI's message, nothing written
# --------------------------------------------------------------------------------------------
def _nothing_written(tmp_path, call):
    out = tmp_path / "out"
    with pytest.raises(PoslensError) as e:
        call(out)
    assert not out.exists()
    return str(e.value)


def test_not_a_causal_lm(tmp_path):
    msg = _nothing_written(tmp_path, lambda out: poslens.scan(torch.nn.Linear(2, 2), data=ids(), out=out))
    assert "Linear" in msg


def test_text_without_tokenizer(tmp_path):
    msg = _nothing_written(tmp_path, lambda out: poslens.scan(tiny(), data=["some text"], out=out))
    assert "tokenizer" in msg


def test_sequences_longer_than_the_context(tmp_path):
    msg = _nothing_written(tmp_path, lambda out: poslens.scan(tiny(), data=ids(2, 200), out=out))
    assert "200" in msg and "128" in msg


def test_unknown_statistic(tmp_path):
    msg = _nothing_written(tmp_path, lambda out: poslens.scan(tiny(), data=ids(), stats="probs,nope", out=out))
    assert "nope" in msg


def test_empty_data(tmp_path):
    msg = _nothing_written(tmp_path, lambda out: poslens.scan(tiny(), data=[], out=out))
    assert "empty" in msg


def test_loaded_model_refuses_another_dtype(tmp_path):
    msg = _nothing_written(tmp_path, lambda out: poslens.scan(tiny(), data=ids(), dtype="bf16", out=out))
    assert "never copies" in msg


# --------------------------------------------------------------------------------------------
# the other functions
# --------------------------------------------------------------------------------------------
def test_simulate_returns_a_result(tmp_path):
    r = poslens.simulate(samples=64, seq_len=8, dim=16, num_layers=2, progress=False)
    assert r.command == "simulate" and r.maps["scores"].shape == (2, 8, 8)
    r.save(tmp_path / "sim")
    assert poslens.load(tmp_path / "sim").maps["scores"].shape == (2, 8, 8)


def test_neighborhood_of_a_loaded_model_leaves_it_as_it_was():
    model = tiny()
    state = model_state(model)
    r = poslens.neighborhood(model, seq_len=8, num_seqs=4, bidirectional=True, progress=False)
    assert r.command == "neighborhood"
    assert model_state(model) == state
    assert len(r.layers()) == 3  # the embeddings and two decoder layers


def test_slash_takes_a_scan_result(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path / "m")
    s = poslens.scan(tmp_path / "m", data="random", seq_len=16, num_seqs=4, progress=False)
    r = poslens.slash(s)
    assert r.command == "slash"


# --------------------------------------------------------------------------------------------
# importing poslens changes nothing process-wide
# --------------------------------------------------------------------------------------------
def test_import_changes_nothing_process_wide():
    code = textwrap.dedent("""
        import os, sys, warnings
        import torch
        torch.set_num_threads(3)
        env, fmt, show = dict(os.environ), warnings.formatwarning, warnings.showwarning
        import poslens, poslens.api, poslens.capture.scan.run, poslens.capture.model.adapters, poslens.analysis.neighborhood
        import poslens.reporting.render, poslens.cli, poslens.runtime
        assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())
        assert warnings.formatwarning is fmt and warnings.showwarning is show
        assert torch.get_num_threads() == 3
        print("unchanged")
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "unchanged" in p.stdout, p.stderr


def test_no_submodule_takes_a_public_functions_name():
    import importlib
    import pkgutil

    names = {m.name for m in pkgutil.iter_modules(poslens.__path__)}
    assert not names & set(poslens._API), names & set(poslens._API)
    for name in names - {"__main__"}:
        importlib.import_module(f"poslens.{name}")
    for name in poslens._API:
        assert not isinstance(getattr(poslens, name), type(poslens)), name
    assert poslens.simulate.__module__ == "poslens.api.commands"
    assert poslens.simulate(samples=32, seq_len=6, dim=8, num_layers=1, progress=False).command == "simulate"


def test_panels_of_a_loaded_model_and_kim_maps_of_a_result(tmp_path):
    model = tiny()
    state = model_state(model)
    p = poslens.panels(model, layer=0, data="random", num_seqs=4, seq_len=12, progress=False)
    assert model_state(model) == state
    assert p.command == "panels" and p.maps["panels"].shape[-1] == 12
    s = poslens.scan(model, data=ids(), progress=False)
    k = poslens.kim_maps(s)
    assert k.command == "kim-maps"
    html = poslens.report([s, k], tmp_path / "r.html")
    assert html.is_file() and "<html" in html.read_text()[:2000].lower()


def test_sweep_and_unknown_options():
    r = poslens.sweep(sigmas=[0.02], shapes=["2x64"], seq_len=8, num_seqs=2, bidirectional=False, progress=False)
    assert r.command == "sweep"
    with pytest.raises(PoslensError, match="unknown option"):
        poslens.sweep(nonsense=1)


def test_fingerprint_of_a_loaded_model_beside_a_path(tmp_path):
    a, b = tiny("llama"), tiny("qwen2", seed=1)
    b.save_pretrained(tmp_path / "qwen")
    state = model_state(a)
    r = poslens.fingerprint([a, tmp_path / "qwen"], data="random", seq_len=16, num_seqs=4, progress=False)
    assert model_state(a) == state
    assert r.command == "fingerprint"
    per_model = r.traits("model")
    assert len(per_model) == 2 and "qwen" in set(per_model["model"])
    # the sink trait of the loaded model equals the scan's own per-head sink
    s = poslens.scan(a, data="random", seq_len=16, num_seqs=4, stats="probs", progress=False)
    name = per_model["model"].iloc[0]
    assert torch.allclose(r.maps[f"{name}.sink"].double(), torch.tensor(s.heads()["sink"].to_numpy()).reshape(2, 4),
                          atol=1e-6)


def test_slash_of_a_scan_from_memory():
    model = tiny()
    s = poslens.scan(model, data="random", seq_len=16, num_seqs=4, progress=False)
    r = poslens.slash(s)  # the model's configuration travels with the scan (no model directory)
    assert r.command == "slash"


def _text_model_and_tokenizer():
    """A tiny Llama built in memory (no tokenizer beside it, as one loaded from a GGUF file) and a
    byte-level BPE tokenizer of its vocabulary size."""
    import transformers as tf

    from poslens.data.corpus import iter_texts
    from poslens.data.tokenizer import train_bpe_tokenizer

    tok = train_bpe_tokenizer([t for _, t in zip(range(10), iter_texts("stdlib"))], vocab_size=300)
    cfg = tiny_config("llama")
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval(), tok


def test_loaded_model_without_a_saved_tokenizer_takes_tokenizer_keyword(tmp_path):
    """Text data on a model with no tokenizer beside it is refused in Python's words, and
    ``tokenizer=`` makes scan, fingerprint and panels read the text."""
    model, tok = _text_model_and_tokenizer()
    msg = _nothing_written(tmp_path, lambda out: poslens.scan(model, data="stdlib", seq_len=16, num_seqs=2, out=out))
    assert "tokenizer=" in msg and "--" not in msg
    with pytest.raises(PoslensError, match="tokenizer="):
        poslens.fingerprint(model, data="stdlib", seq_len=16, num_seqs=2, progress=False)
    s = poslens.scan(model, tokenizer=tok, data="stdlib", seq_len=16, num_seqs=4, stats="probs", progress=False)
    r = poslens.fingerprint(model, tokenizer=tok, data="stdlib", seq_len=16, num_seqs=4, progress=False)
    name = r.traits("model")["model"].iloc[0]
    # the fingerprint's text scan read the same tokens as the scan with the same tokenizer
    text = poslens.load(r.path / "scans" / name / "text")
    assert torch.equal(text.maps["probs"], s.maps["probs"])
    p = poslens.panels(model, tokenizer=tok, data="stdlib", seq_len=12, num_seqs=2, progress=False)
    assert p.maps["panels"].shape[-1] == 12
    with pytest.raises(PoslensError, match="tokenizer="):
        poslens.panels(model, data="stdlib", seq_len=12, num_seqs=2, progress=False)


def test_readings_are_rendered_from_the_numbers():
    from poslens.reporting.readings.common import noise_phrase
    from poslens.reporting.readings.kim import kim_readings

    r = poslens.simulate(samples=64, seq_len=6, dim=8, num_layers=2, progress=False)
    assert "readings" in r.summary and r.summary["readings"] == []  # the summary holds numbers and codes
    assert r.readings() and r.readings() == kim_readings(r.summary["layers"], noise=noise_phrase(r.summary["layers"]))
