"""``poslens compare`` on the real SmolLM2 (GGUF): the model against itself is exactly unchanged;
``rope-off@3`` moves nothing below layer 3, changes layer 3's relativity index, and its loss change
equals ``poslens ablate``'s for the same intervention on the same tokens."""

from __future__ import annotations

import pytest
import torch

import poslens
from poslens.capture.model.load import load_model, load_tokenizer
from poslens.data.sources import make_source
from real_models import real_model_file

pytestmark = pytest.mark.real_model

S, N = 48, 16


@pytest.fixture(scope="module")
def smollm2():
    p = real_model_file("smollm2")
    model = load_model(str(p), dtype=torch.float32, device="cpu")
    tok = load_tokenizer(str(p))
    ids = make_source("stdlib", seq_len=S, num_seqs=N, tokenizer=tok, vocab_size=model.config.vocab_size).batch(0, N)
    return model, ids


def test_smollm2_against_itself_is_exactly_unchanged(smollm2):
    model, ids = smollm2
    df = poslens.compare(model, data=ids[:4], seq_len=32, num_seqs=4, progress=False, threads=None).changes()
    assert (df.delta == 0).all() and (df.verdict == "unchanged").all()


def test_smollm2_rope_off_at_layer_3(smollm2):
    model, ids = smollm2
    with torch.no_grad():
        before = model(input_ids=ids[:2]).logits
    r = poslens.compare(model, variants="rope-off@3", data=ids, seq_len=S, num_seqs=N, progress=False, threads=None)
    df = r.changes()
    below = df[df.layer < 3]
    assert len(below) and (below.delta == 0).all() and (below.verdict == "unchanged").all()
    for k, v in r.maps.items():
        if k.startswith("a.") and not k.endswith((".loss", ".head_maps")):  # per group: [G, L, ...]
            assert torch.equal(v[:, :3].nan_to_num(7.0), r.maps["b." + k[2:]][:, :3].nan_to_num(7.0)), k
        elif k.endswith(".head_maps"):  # over every sequence: [L, H, m, m]
            assert torch.equal(v[:3], r.maps["b." + k[2:]][:3]), k
    rel = df[(df.reading == "relativity") & (df.layer == 3)].iloc[0]
    assert rel.verdict == "changed" and rel.delta < 0, rel  # NoPE attention in layer 3: far less relative
    a = poslens.ablate(model, "rope-off", layers=[3], data=ids, noise_groups=16, progress=False, threads=None)
    loss = df[df.reading == "loss"].iloc[0]
    assert loss.delta == pytest.approx(a.summary["conditions"][0]["delta"]["mean"], abs=1e-6)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids[:2]).logits, before)
