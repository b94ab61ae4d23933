"""The fast capture against the readable one (:mod:`poslens.capture.statistics.reference`): every built-in
statistic of tiny grouped-query models (Llama; Mistral with a sliding window shorter than the
sequences; Qwen3 with q/k norms; Gemma 2 with soft-capped logits and alternating windows), with
per-head maps, equals its definition computed eagerly, one layer, sequence and head
at a time, in float64. The fast path runs in float32 in cache-sized chunks sliced over sequences."""

from __future__ import annotations

import archs
import pytest
import torch

from poslens.capture.model.adapters import get_adapter
from poslens.capture.engine.spec import ALL_STATS, CaptureSpec
from poslens.capture.engine.capture import Capture
from poslens.capture.model.load import load_model
from poslens.capture.engine.loop import attach, forward
from poslens.capture.statistics.reference import aps, cosine_map, reference_capture

S, B = 12, 5
HEADS = [(0, 1), (1, 3)]


def fast_capture(path, ids, **kw):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    ad = get_adapter(config)
    L = ad.num_layers(config)
    spec = CaptureSpec(num_layers=L, num_heads=ad.num_heads(config), num_kv_heads=ad.num_kv_heads(config),
                       head_dim=ad.head_dim(config), seq_len=ids.shape[1], layers=list(range(L)),
                       rope_layers=ad.rope_layers(config), heads=HEADS, stats=ALL_STATS, reservoir=0, **kw)
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    cap = Capture(spec)
    handles = attach(model, ad, cap)
    for s in range(0, ids.shape[0], 2):  # three batches
        forward(model, ids[s:s + 2], capture=cap, seq_start=s)
    for h in handles:
        h.remove()
    return cap


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen3", "gemma2"])
def both(request, tmp_path_factory):
    path = archs.save_tiny(request.param, tmp_path_factory.mktemp(request.param) / "m", layers=2, hidden=32)
    ids = torch.randint(3, archs.V, (B, S), generator=torch.Generator().manual_seed(7))
    return request.param, reference_capture(path, ids, heads=HEADS), fast_capture(path, ids, chunk_elems=2 * 4 * S)


def test_every_statistic_equals_the_reference(both):
    arch, ref, cap = both
    got = cap.means()
    groups, counts = cap.accs["score_groups"].group_means()
    got["score_groups"], got["score_group_counts"] = groups, counts.to(torch.int64)
    assert set(ref) <= set(got)  # a built-in statistic added later may carry its own eager test instead
    for name, want in ref.items():
        if name in ("aps_seq", "attn_aps_seq", "score_group_counts"):
            continue
        torch.testing.assert_close(got[name], want, rtol=0, atol=2e-5, msg=f"{arch} {name}")
    assert torch.equal(got["score_group_counts"], ref["score_group_counts"])
    # the per-sequence APS counts strict rises of float32 (fast) against float64 (reference) cosines:
    # equal unless a pair of cosines is tied within float32 rounding
    for name in ("aps_seq", "attn_aps_seq"):
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-9, msg=f"{arch} {name}")
    if arch == "mistral":  # the window hides keys: the reference must see that too
        assert bool((ref["probs"][0][S - 1, :S - archs.WINDOW] == 0).all())


def test_reference_definitions_on_known_cases():
    assert aps(torch.tensor([[0.0] * 4, [1, 0, 0, 0], [1, 2, 0, 0], [1, 2, 3, 0]])) == 1.0  # every row rises
    assert aps(torch.tensor([[0.0] * 4, [1, 0, 0, 0], [2, 1, 0, 0], [3, 2, 1, 0]])) == 0.0
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [0.0, 0.0]], dtype=torch.float64)
    c = cosine_map(x)
    assert c[0, 1] == 0 and abs(c[0, 2] - 2 ** -0.5) < 1e-15 and c[3, 3] == 0 and c[1, 1] == 1
