"""``poslens.scan`` on the real SmolLM2 (GGUF, dequantised into the cache), loaded by the caller with
transformers: equal to the CLI's run on the .gguf file bit for bit, the model's logits unchanged,
and each head's sink weight equal to transformers' own eager attention."""

from __future__ import annotations

import pytest
import torch

import poslens
from real_models import real_model_file

pytestmark = pytest.mark.real_model

S, N = 64, 4


@pytest.fixture(scope="module")
def smollm2():
    p = real_model_file("smollm2")
    from transformers import AutoModelForCausalLM

    from poslens.capture.model.source import model_directory

    d = model_directory(str(p))
    return p, AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()


def test_smollm2_scan_equals_cli_and_eager(smollm2, tmp_path, cli):
    import json

    gguf, model = smollm2
    ids = torch.randint(0, model.config.vocab_size, (N, S), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = model.config.bos_token_id or 1
    with open(tmp_path / "ids.jsonl", "w") as f:
        for row in ids.tolist():
            f.write(json.dumps({"input_ids": row}) + "\n")
    with torch.no_grad():
        before = model(input_ids=ids[:1]).logits.clone()
    r = poslens.scan(model, data=ids, stats="scores,probs,slash", batch_size=2, progress=False, threads=1)
    with torch.no_grad():
        after = model(input_ids=ids[:1]).logits
    assert torch.equal(before, after)
    code, _, err = cli("scan", gguf, "--out", tmp_path / "cli", "--data", tmp_path / "ids.jsonl", "--seq-len", S,
                       "--num-seqs", N, "--batch-size", 2, "--stats", "scores,probs,slash", "--no-figures", "--quiet", "--threads", 1)
    assert code == 0, err
    c = poslens.load(tmp_path / "cli")
    assert set(c.maps) == set(r.maps)
    for k in c.maps:
        assert torch.equal(r.maps[k], c.maps[k]), k
    # each head's mean weight on key 0 (queries 1 … S−1), against eager attention
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            sinks = []
            for b in range(N):
                att = model(input_ids=ids[b:b + 1], output_attentions=True, use_cache=False).attentions
                sinks.append(torch.stack([a[0].double()[:, 1:, 0].mean(-1) for a in att]))  # [L, H]
    finally:
        model.set_attn_implementation(impl)
    ref = torch.stack(sinks).mean(0)
    got = torch.tensor(r.heads()["sink"].to_numpy()).reshape(ref.shape)
    assert torch.allclose(got, ref, atol=1e-4, rtol=0), float((got - ref).abs().max())
    assert float(ref.max()) > 0.3  # a real model's sinks: far above uniform attention
