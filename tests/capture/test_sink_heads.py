"""``sink_heads [L, H, S]``: each head's mean weight on key 0 at every query position.

The reference is transformers' eager attention (``output_attentions=True``) reduced by the plain
loops of :func:`references.brute_sink_heads`; the capture runs its fast chunked CPU path, in
chunks sliced over sequences, under ``--map-size`` and with ``slash`` alone. The fused CUDA path's
key-0 column (:func:`poslens.capture.backends.cuda_maps.key0_weights`) is checked against a float64
softmax on the CPU (it reads the kernels' base-2 log-sum-exp)."""

from __future__ import annotations

import archs
import pytest
import torch

from poslens.capture.backends import cuda_maps
from poslens.capture.model.adapters import get_adapter
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import CaptureSpec, parse_stats
from poslens.capture.model.load import load_model
from poslens.capture.engine.loop import attach, forward
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.data.sources import make_source
from poslens.rundir.io import read_tensors
from references import brute_sink_heads

S, B = 20, 3

# (arch, attention heads, key/value heads): multi-head Llama, grouped-query Llama and Qwen3
MODELS = [("llama", 4, 4), ("llama", 4, 2), ("qwen3", 4, 2)]


@pytest.fixture(scope="module", params=MODELS, ids=lambda m: f"{m[0]}-kv{m[2]}")
def model_run(request, tmp_path_factory):
    arch, heads, kv = request.param
    path = archs.save_tiny(arch, tmp_path_factory.mktemp(arch) / "m", heads=heads, kv=kv, layers=2, hidden=32)
    ids = torch.randint(3, archs.V, (B, S), generator=torch.Generator().manual_seed(2))
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        att = eager(input_ids=ids, output_attentions=True, use_cache=False).attentions
    ref = torch.tensor(brute_sink_heads(att), dtype=torch.float64)
    return path, ids, ref


def _capture(path, ids, **spec_kw):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    ad = get_adapter(config)
    L = ad.num_layers(config)
    spec = CaptureSpec(num_layers=L, num_heads=ad.num_heads(config), num_kv_heads=ad.num_kv_heads(config),
                       head_dim=ad.head_dim(config), seq_len=ids.shape[1], layers=list(range(L)),
                       rope_layers=ad.rope_layers(config), **spec_kw)
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    cap = Capture(spec)
    handles = attach(model, ad, cap)
    try:
        forward(model, ids[:2], capture=cap)  # two batches: the sums and counts add up
        forward(model, ids[2:], capture=cap)
    finally:
        for h in handles:
            h.remove()
    return cap


@pytest.mark.parametrize("opts", [dict(), dict(chunk_elems=2 * 4 * S), dict(map_size=6),
                                  dict(stats=parse_stats("slash")), dict(stats=parse_stats("probs"), own_output=False)],
                         ids=["default", "sliced-chunks", "map-size", "slash-only", "probs-sdpa-output"])
def test_sink_heads_equal_eager_attention(model_run, opts):
    path, ids, ref = model_run
    cap = _capture(path, ids, **opts)
    got = cap.means()["sink_heads"]
    assert got.shape == ref.shape == (2, 4, S)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    assert torch.equal(got[:, :, 0], torch.ones_like(got[:, :, 0]))  # query 0 sees key 0 alone
    assert float(ref[:, :, 1:].std()) > 0.05  # the heads differ: a map of one constant would not pass


def test_sink_heads_absent_without_a_softmax_statistic():
    spec = CaptureSpec(num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4, seq_len=8, layers=[0],
                       stats=parse_stats("scores,cosine,qk,dim_logit"))
    assert "sink_heads" not in Capture(spec).accs
    spec.stats = parse_stats("slash")
    assert Capture(spec).accs["sink_heads"].shape == (1, 2, 8)


@pytest.mark.parametrize("causal", [True, False])
def test_fused_key0_weights_from_the_base2_logsumexp(causal):
    g = torch.Generator().manual_seed(4)
    Bq, H, Hk, T, D, scaling = 3, 6, 2, 17, 8, 0.35
    q = torch.randn(Bq, H, T, D, generator=g) * 2
    k = torch.randn(Bq, Hk, T, D, generator=g) * 2
    logits = (q.double() @ k.double().repeat_interleave(H // Hk, 1).transpose(-1, -2)) * scaling
    if causal:
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    log2e = 1.0 / torch.log(torch.tensor(2.0, dtype=torch.float64))
    lse2 = (torch.logsumexp(logits, -1) * log2e).float()  # what the lse kernel writes
    got = cuda_maps.key0_weights(q, k, lse2, scaling * float(log2e))
    want = torch.softmax(logits, -1)[..., 0].sum(0)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)


def test_scan_writes_sink_heads(model_run, tmp_path):
    path, _, _ = model_run
    cfg = ScanConfig(model_dir=str(path), out=str(tmp_path / "r"), data="random", seq_len=12, num_seqs=5,
                     batch_size=2, figures=False, seed=3, stats=["probs"])
    run_scan(cfg, progress=False)
    maps = read_tensors(tmp_path / "r" / "maps.safetensors")
    ids = make_source("random", seq_len=12, num_seqs=5, seed=3, vocab_size=archs.V).batch(0, 5)
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        att = eager(input_ids=ids, output_attentions=True, use_cache=False).attentions
    ref = torch.tensor(brute_sink_heads(att), dtype=torch.float64)
    torch.testing.assert_close(maps["sink_heads"].double(), ref, rtol=0, atol=1e-6)
