"""A model's name in a run: a GGUF dequantised into poslens's cache is named after its file, not the cache
folder's hash; the caller's ``names=`` win; docs/fingerprint.md's first block runs as written."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

import poslens
from poslens.capture.model.source import model_names
from poslens.errors import PoslensError

ROOT = Path(__file__).resolve().parents[2]
HASH = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture
def cached(tmp_path) -> Path:
    """A folder as poslens's GGUF cache makes one: named by the file's hash, its record naming the file."""
    d = tmp_path / "gguf" / HASH
    d.mkdir(parents=True)
    (d / "poslens_source.json").write_text(json.dumps({"kind": "gguf", "sha256": HASH,
                                                       "path": "/models/SmolLM2-135M-Instruct.Q4_1.gguf"}))
    return d


def test_a_cached_gguf_is_named_after_its_file(cached):
    assert model_names([str(cached)]) == ["SmolLM2-135M-Instruct.Q4_1"]
    # a model loaded from the cache (its name_or_path is the folder), twice
    label = f"<in-memory LlamaForCausalLM: {cached}>"
    assert model_names([label, f"{label[:-1]} #2>"]) == ["SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct.Q4_1-2"]
    # without the file's path, the GGUF's general.name
    (cached / "poslens_source.json").write_text(json.dumps({"kind": "gguf", "name": "Smollm2 135M"}))
    assert model_names([str(cached)]) == ["Smollm2_135M"]


def test_files_and_directories_keep_their_names(tmp_path):
    assert model_names(["a/smollm2.gguf", str(tmp_path / "model_nope"), "b/smollm2.gguf"]) == \
        ["smollm2", "model_nope", "smollm2-2"]


def test_names_given_are_checked():
    assert model_names(["a", "b"], ["x", "y"]) == ["x", "y"]
    for bad in (["x"], ["x", "x"], ["x", "a/b"]):
        with pytest.raises(PoslensError) as e:
            model_names(["a", "b"], bad)
        msg = str(e.value)
        assert "names=" in msg and "\n" not in msg


def _gguf_helpers():
    spec = importlib.util.spec_from_file_location("poslens_test_gguf_helpers", ROOT / "tests" / "capture" / "test_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_docs_fingerprint_block_runs_as_written(tmp_path, monkeypatch):
    """docs/fingerprint.md's first Python block, on two tiny GGUF files named as there (scanned small:
    random tokens, 16 positions, 2 sequences); ``r.maps["smollm2.sink"]`` is the first model's map."""
    pytest.importorskip("gguf")
    helpers = _gguf_helpers()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSLENS_CACHE", str(tmp_path / "cache"))
    for i, name in enumerate(("smollm2.gguf", "gemma3.gguf")):
        helpers.write_gguf(helpers.tiny_llama(seed=i), tmp_path / name)
    block = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "fingerprint.md").read_text(), flags=re.S | re.M)[0]
    assert 'r.maps["smollm2.sink"]' in block
    small = dict(data="random", seq_len=16, num_seqs=2, batch_size=2, progress=False, threads=1)
    ns = {"__name__": "docs"}
    real = poslens.fingerprint
    monkeypatch.setattr(poslens, "fingerprint", lambda models, **kw: real(models, **{**small, **kw}))
    exec(compile(block.replace("import poslens\n", ""), "docs/fingerprint.md", "exec"), {**ns, "poslens": poslens})
    r = poslens.load("runs/fp")
    assert r.maps["smollm2.sink"].shape == (2, 4) and "gemma3.sink" in r.maps
    named = real(["smollm2.gguf", "gemma3.gguf"], names=["a", "b"], **small)
    assert "a.sink" in named.maps and "b.sink" in named.maps and not any(k.startswith("smollm2") for k in named.maps)


def test_a_snapshot_named_by_a_hash_takes_its_configs_name(tmp_path):
    d = tmp_path / "models--org--tiny" / "snapshots" / ("0123abcd" * 5)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-135M"}))
    assert model_names([str(d)]) == ["SmolLM2-135M"]
    (d / "config.json").write_text(json.dumps({"_name_or_path": str(d)}))
    assert model_names([str(d)]) == ["0123abcd" * 5]
