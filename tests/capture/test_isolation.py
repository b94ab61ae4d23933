"""No state shared between a model and a capture but the capture itself: two captures in one
process, on two models or in two threads, never see each other's tensors.

The active capture reaches the attention function through a context variable (each thread or task
sees only what it activated) and takes calls only from the attention modules of the model it is
attached to. Each capture below must equal the same capture run alone (same code, same data)."""

from __future__ import annotations

import threading

import archs
import pytest
import torch

from poslens.capture.engine.context import active_capture
from poslens.capture.model.adapters import get_adapter
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import CaptureSpec
from poslens.capture.model.load import load_model
from poslens.capture.engine.loop import attach, forward

S, B = 16, 2


def _setup(path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    ad = get_adapter(config)
    L = ad.num_layers(config)
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    spec = CaptureSpec(num_layers=L, num_heads=ad.num_heads(config), num_kv_heads=ad.num_kv_heads(config),
                       head_dim=ad.head_dim(config), seq_len=S, layers=list(range(L)),
                       rope_layers=ad.rope_layers(config))
    return model, ad, spec


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """A tiny Llama and a tiny Qwen3 of another width and depth, their inputs and each one's capture
    run alone."""
    runs = []
    for n, (arch, kw) in enumerate([("llama", dict(layers=2, hidden=32)), ("qwen3", dict(layers=3, hidden=48))]):
        path = archs.save_tiny(arch, tmp_path_factory.mktemp(arch) / "m", seed=n, **kw)
        model, ad, spec = _setup(path)
        ids = torch.randint(3, archs.V, (B, S), generator=torch.Generator().manual_seed(10 + n))
        alone = Capture(spec)
        handles = attach(model, ad, alone)
        forward(model, ids, capture=alone)
        for h in handles:
            h.remove()
        runs.append(dict(model=model, ad=ad, spec=spec, ids=ids, alone=alone.means()))
    return runs


def _assert_same(got: dict, want: dict):
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-10, equal_nan=True, msg=name)


def _fresh(run):
    cap = Capture(run["spec"])
    return cap, attach(run["model"], run["ad"], cap)


def test_two_threads_interleaved_inside_their_forwards(two_models):
    """Thread a stops in the middle of its forward (before layer 1), thread b activates its capture and
    stops at the same point, then a finishes while b's capture is active in the other thread: a global
    "active capture" would hand a's last layers to b."""
    caps, errors = [], []
    at_layer1 = [threading.Event(), threading.Event()]
    go = [threading.Event(), threading.Event()]

    def work(i):
        run = two_models[i]
        cap, handles = caps[i]

        def pause(_m, _args, i=i):
            if not at_layer1[i].is_set():
                at_layer1[i].set()
                assert go[i].wait(30), "the other thread never let this one go on"
        layer1 = run["ad"].decoder_layers(run["model"])[1]
        handles.append(layer1.register_forward_pre_hook(pause))
        try:
            forward(run["model"], run["ids"], capture=cap)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            for ev in at_layer1 + go:
                ev.set()
        finally:
            for h in handles:
                h.remove()

    caps[:] = [_fresh(r) for r in two_models]
    ta = threading.Thread(target=work, args=(0,))
    tb = threading.Thread(target=work, args=(1,))
    ta.start()
    assert at_layer1[0].wait(30)
    tb.start()
    assert at_layer1[1].wait(30)
    go[0].set()
    ta.join(60)
    go[1].set()
    tb.join(60)
    assert not errors, errors
    for (cap, _), run in zip(caps, two_models):
        _assert_same(cap.means(), run["alone"])


def test_two_models_in_one_thread_with_both_captures_active(two_models):
    """Both captures active at once (nested), each model's calls reach its own capture only; a model
    with no capture attached runs plain attention under another model's capture."""
    (ca, ha), (cb, hb) = _fresh(two_models[0]), _fresh(two_models[1])
    ma, mb = two_models[0]["model"], two_models[1]["model"]
    ida, idb = two_models[0]["ids"], two_models[1]["ids"]
    try:
        ca.begin_batch(B)
        cb.begin_batch(B)
        with torch.no_grad(), ca.active(), cb.active():
            assert active_capture() is cb and ca.is_active() and cb.is_active()
            ma(input_ids=ida, use_cache=False)
            mb(input_ids=idb, use_cache=False)
        ca.end_batch()
        cb.end_batch()
    finally:
        for h in ha + hb:
            h.remove()
    _assert_same(ca.means(), two_models[0]["alone"])
    _assert_same(cb.means(), two_models[1]["alone"])
    assert active_capture() is None and not ca.is_active()

    # model b, with nothing attached, under a's capture: a is untouched, b's logits are the plain ones
    (cc, hc) = _fresh(two_models[0])
    with torch.no_grad():
        plain = mb(input_ids=idb, use_cache=False).logits
    try:
        cc.begin_batch(B)
        with torch.no_grad(), cc.active():
            under = mb(input_ids=idb, use_cache=False).logits
            ma(input_ids=ida, use_cache=False)
        cc.end_batch()
    finally:
        for h in hc:
            h.remove()
    assert torch.equal(under, plain)
    _assert_same(cc.means(), two_models[0]["alone"])
    assert cc.seen_layers == set(range(2))  # model b's three layers never reached it
