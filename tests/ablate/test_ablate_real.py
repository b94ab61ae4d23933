"""``poslens ablate`` on the real SmolLM2 and Gemma 3 (GGUF): the loss with no intervention equals
transformers' loss with labels, switching RoPE off everywhere costs far more than its standard error,
and the model's logits afterwards equal those before."""

from __future__ import annotations

import pytest
import torch

import poslens
from poslens.capture.model.load import load_model, load_tokenizer
from poslens.data.sources import make_source
from real_models import real_model_file

pytestmark = pytest.mark.real_model

S, N = 64, 8


def _loaded(name: str):
    p = real_model_file(name)
    model = load_model(str(p), dtype=torch.float32, device="cpu")
    tok = load_tokenizer(str(p))
    ids = make_source("stdlib", seq_len=S, num_seqs=N, tokenizer=tok, vocab_size=model.config.vocab_size).batch(0, N)
    return model, ids


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_model_loss_rope_off_and_unchanged(name):
    model, ids = _loaded(name)
    with torch.no_grad():
        before = model(input_ids=ids[:1, :16]).logits.clone()
        ref = model(input_ids=ids, labels=ids, use_cache=False).loss
    a = poslens.ablate(model, ["rope-off", "sink-off"], layers="all", data=ids, progress=False, threads=None)
    # the model's own loss is float32 cross-entropy, below the float64 value by up to 2e-5 nats over Gemma-3's
    # 262,144 logits (the blocked losses are the float64 ones to a few float32 roundings: test_ablate.py)
    assert a.summary["loss_base"] == pytest.approx(float(ref), abs=5e-5)
    c = {x["name"]: x for x in a.summary["conditions"]}
    d = c["rope-off@all"]["delta"]
    assert d["mean"] > 3 * d["se"] and d["mean"] > 0.5  # nats per token (SmolLM2 at 8 x 64: 1.4 ± 0.19)
    assert c["rope-off@all"]["beyond_noise"]
    assert a.summary["replayed_prefix"] is True
    with torch.no_grad():
        after = model(input_ids=ids[:1, :16]).logits
    assert torch.equal(before, after)
