"""poslens ablate on tiny random models: the interventions against closed forms and brute-force references,
the loss against transformers', the model handed back unchanged, the statistics against scipy."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from archs import V, tiny_config  # noqa: E402

import poslens  # noqa: E402
from poslens.analysis.ablate.config import AblateConfig, parse_layers  # noqa: E402
from poslens.analysis.ablate.losses import bh, paired_stats, position_buckets, token_losses  # noqa: E402
from poslens.analysis.ablate.run import run_ablate  # noqa: E402
from poslens.capture.engine.intervene import (Edits, LayerEdit, layer_edit, massive_mask, parse_intervention,  # noqa: E402
                                       random_like)
from poslens.capture.backends.rope import rotate_qk, unrotate_qk  # noqa: E402
from poslens.errors import PoslensError  # noqa: E402
from poslens.rope import apply_rope, cos_sin  # noqa: E402

S, N = 24, 8


def _model(arch: str = "llama", seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(tiny_config(arch, **kw))
    with torch.no_grad():  # attention far from uniform, so that interventions matter
        for name, p in m.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj")) and p.ndim == 2:
                p.mul_(8.0)
    return m.eval()


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, V, (N, S), generator=torch.Generator().manual_seed(seed))


def _ablate(model, **kw):
    kw.setdefault("data", _ids())
    kw.setdefault("progress", False)
    kw.setdefault("threads", None)
    return poslens.ablate(model, **kw)


@pytest.fixture(scope="module")
def llama():
    return _model("llama", layers=3)


# --------------------------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------------------------
def test_parse_intervention_and_layers():
    assert parse_intervention("rope-band:low").name == "rope-band:low"
    assert parse_intervention("window:16").arg == 16
    for bad in ("rope", "rope-band", "rope-band:lowest", "window:0", "window:x", "sink-off:3"):
        with pytest.raises(PoslensError, match="--intervention"):
            parse_intervention(bad)
    assert parse_layers("each", 3) == [[0], [1], [2]]
    assert parse_layers("all", 3) == [[0, 1, 2]]
    assert parse_layers("0,2", 3) == [[0, 2]]
    assert parse_layers("each:1-2", 3) == [[1], [2]]
    assert parse_layers([2, 0], 3) == [[0, 2]]
    with pytest.raises(PoslensError, match="layers 0..2"):
        parse_layers("5", 3)


def test_position_buckets_and_statistics():
    assert position_buckets(8) == [(1, 2), (2, 4), (4, 8)]
    assert position_buckets(9) == [(1, 2), (2, 4), (4, 8), (8, 9)]
    from scipy import stats

    d = torch.tensor([0.3, 0.1, 0.5, 0.2, 0.4, 0.0, 0.6, 0.35, 0.15, 0.25])
    st = paired_stats(d, 5)
    gm = [float(d[g::5].mean()) for g in range(5)]
    ref = stats.ttest_1samp(gm, 0.0)
    assert st["mean"] == pytest.approx(sum(gm) / 5)
    assert st["se"] == pytest.approx(stats.sem(gm))
    assert st["p"] == pytest.approx(ref.pvalue)
    assert paired_stats(torch.zeros(6), 3)["p"] == 1.0
    assert paired_stats(torch.ones(1), 4)["se"] is None
    ps = [0.001, 0.02, 0.009, None, 0.5]
    assert bh(ps, 0.05) == [True, True, True, False, False]
    assert bh(ps, 0.01) == [True, False, False, False, False]


def test_token_losses_match_cross_entropy():
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    ref = torch.stack([torch.stack([-torch.log_softmax(logits[b, t], -1)[ids[b, t + 1]] for t in range(4)])
                       for b in range(2)])
    assert torch.allclose(token_losses(logits, ids), ref, atol=1e-6)


# --------------------------------------------------------------------------------------------
# the interventions, directly
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotate_is_the_inverse_of_unrotate(layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 8, generator=g)
    cos, sin = cos_sin(torch.arange(6), 8)
    cos, sin = cos[None].expand(2, -1, -1), sin[None].expand(2, -1, -1)
    if layout == "interleaved":  # each angle twice, side by side
        cos = cos[..., :4].repeat_interleave(2, -1)
        sin = sin[..., :4].repeat_interleave(2, -1)
    y = rotate_qk(x, cos, sin, layout)
    back, _ = unrotate_qk(y, y, cos, sin, layout=layout)
    assert torch.allclose(back, x, atol=1e-5)
    if layout == "half":
        assert torch.allclose(y, apply_rope(x, cos[:, None], sin[:, None]), atol=1e-6)


def _edits(edit: LayerEdit, layer=0):
    cos, sin = cos_sin(torch.arange(6), 8)
    e = Edits({layer: edit}, rope_layers={layer}, layout="half")
    e.cos_sin[layer] = (cos[None], sin[None])
    return e, cos, sin


def test_rope_band_unrotates_only_its_pairs():
    g = torch.Generator().manual_seed(1)
    pre = torch.randn(1, 2, 6, 8, generator=g)
    labels = ["high", "high", "medium", "low"]
    e, cos, sin = _edits(layer_edit(parse_intervention("rope-band:low"), 0, band_labels=labels))
    post = apply_rope(pre, cos, sin)
    q, k = e.apply(0, post, post)
    low = [3, 7]  # pair 3 = dims 3 and 3 + 4 in the rotate-half layout
    rest = [d for d in range(8) if d not in low]
    assert torch.allclose(q[..., low], pre[..., low], atol=1e-5)
    assert torch.equal(q[..., rest], post[..., rest])
    off, _, _ = _edits(layer_edit(parse_intervention("rope-off"), 0, band_labels=labels))
    assert torch.allclose(off.apply(0, post, post)[0], pre, atol=1e-5)


def test_massive_dims_replaced_by_their_mean():
    g = torch.Generator().manual_seed(2)
    pre = torch.randn(2, 2, 6, 8, generator=g)
    pre[:, 1, :, 5] += 40.0  # one massive dim in head 1
    e0 = Edits({}, rope_layers={0}, layout="half", moments=True)
    cos, sin = cos_sin(torch.arange(6), 8)
    e0.cos_sin[0] = (cos[None].expand(2, -1, -1), sin[None].expand(2, -1, -1))
    post = apply_rope(pre, cos, sin)
    e0.apply(0, post, post)
    from poslens.capture.engine.intervene import Moments

    mom = Moments.from_edits(e0)
    mask = massive_mask(mom.q_rms[0], 5.0)
    assert mask.nonzero().tolist() == [[1, 5]]
    edit = layer_edit(parse_intervention("massive-qk"), 0, band_labels=["high"] * 4, moments=mom)
    e = Edits({0: edit}, rope_layers={0}, layout="half")
    e.cos_sin[0] = e0.cos_sin[0]
    q, _ = e.apply(0, post, post)
    back, _ = unrotate_qk(q, q, *e0.cos_sin[0])
    assert torch.allclose(back[:, 1, :, 5], pre[:, 1, :, 5].mean().expand(2, 6), atol=1e-4)
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[1, 5] = False
    assert torch.allclose(back.permute(1, 3, 0, 2)[keep], pre.permute(1, 3, 0, 2)[keep], atol=1e-4)
    r = random_like(mask, torch.Generator().manual_seed(0))
    assert int(r.sum()) == 1 and not bool((r & mask).any())


def test_sink_off_is_attention_without_key_0():
    from poslens.capture.engine.attention import _plain_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g) for _ in range(3))
    out = _plain_attention(q, k, v, None, causal=True, window=None, scaling=0.5, softcap=None, dropout=0.0,
                           sink_off=True)
    for i in range(5):
        keys = [0] if i == 0 else list(range(1, i + 1))
        logits = 0.5 * torch.einsum("bhd,bhkd->bhk", q[:, :, i], k[:, :, keys])
        ref = torch.einsum("bhk,bhkd->bhd", torch.softmax(logits, -1), v[:, :, keys])
        assert torch.allclose(out[:, :, i], ref, atol=1e-6)


# --------------------------------------------------------------------------------------------
# whole runs
# --------------------------------------------------------------------------------------------
def test_no_intervention_loss_is_transformers_loss(llama):
    r = _ablate(llama, interventions="sink-off", layers="all")
    ids = _ids()
    with torch.no_grad():
        ref = llama(input_ids=ids, labels=ids, use_cache=False).loss
    assert r.summary["loss_base"] == pytest.approx(float(ref), abs=1e-5)
    assert r.maps["loss_base"].shape == (N, S - 1)


def test_model_handed_back_unchanged(llama):
    ids = _ids(1)
    impl = llama.config._attn_implementation
    with torch.no_grad():
        before = llama(input_ids=ids).logits
    _ablate(llama, interventions=["rope-off", "massive-qk", "window:3"], layers="each")
    with torch.no_grad():
        after = llama(input_ids=ids).logits
    assert torch.equal(before, after)
    assert llama.config._attn_implementation == impl
    for m in llama.modules():
        assert "forward" not in m.__dict__ and not m._forward_hooks and not m._forward_pre_hooks


def test_replayed_layers_equal_full_forwards(llama):
    kw = dict(interventions=["rope-off", "sink-off"], layers="each")
    a = run_ablate(AblateConfig(model_dir="-", **kw), progress=False, model=llama, data=_ids())
    b = run_ablate(AblateConfig(model_dir="-", replay=False, **kw), progress=False, model=llama, data=_ids())
    assert a["summary"]["replayed_prefix"] is True and b["summary"]["replayed_prefix"] is False
    assert a["tensors"].keys() == b["tensors"].keys()
    for name in a["tensors"]:
        assert torch.equal(a["tensors"][name], b["tensors"][name]), name


def test_rope_off_on_nope_layers_changes_nothing():
    m = _model("smollm3", layers=2)  # layer 0 rotates, layer 1 is NoPE
    r = run_ablate(AblateConfig(model_dir="-", interventions=["rope-off"], layers="each"), progress=False, model=m,
                   data=_ids())
    t = r["tensors"]
    assert torch.equal(t["loss.rope-off@1"], t["loss_base"])
    assert not torch.equal(t["loss.rope-off@0"], t["loss_base"])
    c = {x["name"]: x for x in r["summary"]["conditions"]}
    assert c["rope-off@1"]["applies"] is False and c["rope-off@0"]["applies"] is True


def test_wide_window_changes_nothing_and_short_window_does(llama):
    r = run_ablate(AblateConfig(model_dir="-", interventions=[f"window:{S}", "window:2"], layers="all"),
                   progress=False, model=llama, data=_ids())
    t = r["tensors"]
    assert torch.allclose(t[f"loss.window:{S}@all"], t["loss_base"], atol=1e-5)
    assert (t["loss.window:2@all"] - t["loss_base"]).abs().max() > 1e-3
    # position 1 and 2 see at most 2 keys back anyway: their losses are unchanged
    assert torch.allclose(t["loss.window:2@all"][:, :2], t["loss_base"][:, :2], atol=1e-5)


def test_rope_off_all_equals_the_no_rope_control(llama):
    """rope-off in every layer = a forward with each layer's q/k un-rotated (scan's --no-rope-layers
    control), computed here by the capture's own route."""
    from poslens.capture.model.borrow import borrowed
    from poslens.capture.engine.spec import CaptureSpec
    from poslens.capture.engine.capture import Capture
    from poslens.capture.model.adapters import get_adapter
    from poslens.capture.engine.loop import attach

    ids = _ids()
    r = run_ablate(AblateConfig(model_dir="-", interventions=["rope-off"], layers="all"), progress=False, model=llama,
                   data=ids)
    adapter = get_adapter(llama.config)
    spec = CaptureSpec(num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, seq_len=S, layers=[],
                       rope_layers={0, 1, 2}, no_rope_layers={0, 1, 2}, stats=())
    cap = Capture(spec)
    with borrowed(llama):
        handles = attach(llama, adapter, cap)
        try:
            with torch.no_grad(), cap.active():
                logits = llama(input_ids=ids, use_cache=False).logits
        finally:
            for h in handles:
                h.remove()
    ref = token_losses(logits, ids)
    assert torch.allclose(r["tensors"]["loss.rope-off@all"], ref, atol=1e-5)


def test_gemma3_two_rope_tables_and_windows():
    m = _model("gemma3_text", layers=2)
    r = run_ablate(AblateConfig(model_dir="-", interventions=["rope-off", "rope-band:high", "massive-qk"],
                                layers="each"), progress=False, model=m, data=_ids())
    s = r["summary"]
    assert s["replayed_prefix"] is True
    assert {c["name"] for c in s["conditions"]} == {f"{i}@{l}" for i in ("rope-off", "rope-band:high", "massive-qk")
                                                    for l in (0, 1)}
    assert all(math.isfinite(c["delta"]["mean"]) for c in s["conditions"])


# --------------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------------
def test_cli_writes_a_run_that_loads(cli, tmp_path):
    model = tmp_path / "m"
    _model("llama", layers=2).save_pretrained(str(model))
    out = tmp_path / "a"
    code, stdout, err = cli("ablate", model, "--out", out, "--data", "random", "--seq-len", 16, "--num-seqs", 8,
                            "-i", "rope-off", "-i", "sink-off", "--threads", 1)
    assert code == 0, err
    assert "rope-off@1" in stdout
    r = poslens.load(out)
    assert r.command == "ablate"
    assert set(r.tables()["conditions"]["condition"]) == {"rope-off@0", "rope-off@1", "sink-off@0", "sink-off@1"}
    assert list(r.layers()["layer"]) == [0, 1]
    assert (out / "ablate_rope-off.png").exists() and (out / "ablate_sink-off.png").exists()
    code, _, err = cli("ablate", model, "--out", tmp_path / "b", "-i", "rope-band:lowest", "--data", "random")
    assert code == 2 and err.startswith("poslens: error:") and "rope-band" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "b").exists()
    code, _, err = cli("ablate", model, "--out", tmp_path / "c", "--layers", "7", "--data", "random")
    assert code == 2 and "0..1" in err and not (tmp_path / "c").exists()


def test_readings_under_an_intervention(llama, tmp_path):
    """The scans under each condition: without one, the numbers of a plain scan of the same ids; under
    sink-off, no weight on key 0 after query 0 (sink weight exactly 0)."""
    ids = _ids()
    a = _ablate(llama, interventions=["sink-off", "rope-off"], layers="all", readings=True, out=tmp_path / "a")
    base = a.summary["readings_base"]
    plain = poslens.scan(llama, data=ids, stats="scores,probs,slash", progress=False, threads=None)
    from poslens.analysis.ablate.run import scan_readings

    assert base == scan_readings(plain.path)
    c = {x["name"]: x for x in a.summary["conditions"]}
    assert c["sink-off@all"]["readings"]["sink_weight"] == 0.0
    assert base["sink_weight"] > 0.01
    assert (tmp_path / "a" / "scans" / "rope-off@all" / "maps.safetensors").exists()
    assert poslens.load(tmp_path / "a" / "scans" / "sink-off@all").command == "scan"


def test_massive_qk_without_massive_dims_is_said(llama):
    a = _ablate(llama, interventions=["massive-qk"], layers="all", massive_lambda=50.0)
    c = a.summary["conditions"][0]
    assert c["applies"] is False and c["delta"]["mean"] == 0.0
    from poslens.reporting.readings.ablate import ablate_readings

    assert "findings" not in a.summary and a.summary["readings"] == []  # numbers in the summary, words rendered
    assert ablate_readings(a.summary)  # rendered from the numbers alone


def test_position_probes():
    """Strong learned absolute position embeddings (GPT-2's, scaled up) give a probe near r = 1 from the
    first layer, far above the same model without them; an intervention that changes nothing (no
    dimension is massive at lambda = 50) changes no probe."""
    m = _model("gpt2", layers=2)
    with torch.no_grad():
        m.transformer.wpe.weight.mul_(50.0)
    ids = torch.randint(3, V, (32, S), generator=torch.Generator().manual_seed(5))
    a = _ablate(m, interventions=["massive-qk"], layers="all", massive_lambda=50.0, probes=True, data=ids)
    base = a.summary["probe_base"]
    assert [b["layer"] for b in base] == [0, 1]
    assert base[0]["r"] > 0.95
    with torch.no_grad():
        m.transformer.wpe.weight.zero_()
    flat = _ablate(m, interventions=["massive-qk"], layers="all", massive_lambda=50.0, probes=True, data=ids)
    assert flat.summary["probe_base"][0]["r"] < base[0]["r"] - 0.1
    p = a.summary["conditions"][0]["probe"]
    assert [x["r"] for x in p] == [b["r"] for b in base]
    assert all(x["delta_mse"]["mean"] == 0.0 for x in p)
    from poslens.reporting.readings.ablate import ablate_readings

    assert any("probe" in f for f in ablate_readings(a.summary))


def test_pair_verdict_follows_the_one_rule():
    """value − max(chance, floor) ≥ threshold, the floor from the paired difference's standard error."""
    from poslens.reproduce.ablations import THRESHOLD, pair_verdict
    from poslens.metrics.verdicts import z

    g = torch.Generator().manual_seed(0)
    base = torch.rand(16, 9, generator=g) + 2.0
    small = base + 0.1 + 0.01 * torch.randn(16, 9, generator=g)
    t = {"loss_base": base, "loss.a@all": base + 0.5 + 0.01 * torch.randn(16, 9, generator=g), "loss.b@all": small}
    summ = {"conditions": [{"name": n, "delta": paired_stats((t[f"loss.{n}"] - base).mean(1), 8)}
                           for n in ("a@all", "b@all")]}
    v = pair_verdict(summ, t, "a@all", "b@all", 8)
    se = paired_stats((t["loss.a@all"] - small).mean(1), 8)["se"]
    assert v["value"] == pytest.approx(0.5, abs=0.02) and v["chance"] == pytest.approx(0.1, abs=0.02)
    assert v["floor"] == pytest.approx(v["chance"] + z() * se)
    assert v["threshold"] == THRESHOLD and v["reproduced"] is True
    assert pair_verdict(summ, t, "b@all", "a@all", 8)["reproduced"] is False


def test_overwrite_replaces_only_an_ablate_run(llama, tmp_path):
    out = tmp_path / "a"
    _ablate(llama, interventions="sink-off", layers="all", out=out)
    with pytest.raises(PoslensError, match="exists"):
        _ablate(llama, interventions="rope-off", layers="all", out=out)
    _ablate(llama, interventions="rope-off", layers="all", out=out, overwrite=True)
    assert poslens.load(out).summary["interventions"] == ["rope-off"]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(PoslensError, match="notes.txt"):
        _ablate(llama, interventions="sink-off", layers="all", out=out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert poslens.load(out).summary["interventions"] == ["rope-off"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# --------------------------------------------------------------------------------------------
# the forwards of the floor
# --------------------------------------------------------------------------------------------
def test_blocked_losses_equal_the_losses_of_the_whole_logits():
    from poslens.analysis.ablate.losses import blocked_token_losses

    torch.manual_seed(0)
    head = torch.nn.Linear(16, V, bias=False)
    hidden, ids = torch.randn(3, S, 16), _ids()[:3]
    with torch.no_grad():
        ref = token_losses(head(hidden), ids)
    for block in (1, V, 5 * V + 3, 10**9):  # one row at a time, rows not dividing the positions, all at once
        got = blocked_token_losses(head, hidden, ids, V, block=block)
        assert got.shape == (3, S - 1) and got.dtype == torch.float32
        assert torch.allclose(got, ref, rtol=1e-6, atol=1e-6), block


def test_blocked_losses_equal_float64_losses_at_a_large_vocabulary():
    """At 2^18 logits per position (Gemma-3's vocabulary) the blocked losses are the float64 ones to a few
    float32 roundings, where float32 cross-entropy of the same logits is off by about 2e-5 nats."""
    from poslens.analysis.ablate.losses import blocked_token_losses

    torch.manual_seed(0)
    vocab = 2**18
    head = torch.nn.Linear(16, vocab, bias=False)
    torch.nn.init.normal_(head.weight)
    hidden, ids = torch.randn(2, 33, 16), torch.randint(0, vocab, (2, 33))
    with torch.no_grad():
        z = head(hidden[:, :-1]).double()
        exact = torch.logsumexp(z, -1) - z.gather(-1, ids[:, 1:, None])[..., 0]
        got = blocked_token_losses(head, hidden, ids, vocab, block=5 * vocab)
        cross_entropy = token_losses(head(hidden), ids)
    err, ce_err = (got.double() - exact).abs().max(), (cross_entropy.double() - exact).abs().max()
    assert err < 5e-6 and err < ce_err / 4, (err, ce_err)


def test_no_capture_without_readings(llama, monkeypatch):
    from poslens.capture.engine import capture

    made = []  # the layers each capture made observes
    init = capture.Capture.__init__
    monkeypatch.setattr(capture.Capture, "__init__",
                        lambda self, spec, *a, **kw: (made.append(list(spec.layers)), init(self, spec, *a, **kw))[1])
    r = _ablate(llama, interventions=["rope-off", "sink-off"], layers="each")
    assert made == [[]] and r.summary["replayed_prefix"] is True  # the dispatch check's dry run observes no layer
    made.clear()
    _ablate(llama, interventions="sink-off", layers="all", readings=True, num_seqs=4)
    assert made.count([0, 1, 2]) == 2  # the readings: a scan without the intervention and one under it


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_replayed_layers_run_on_one_token(arch, monkeypatch):
    from poslens.analysis.ablate.replay import LayerReplay

    model = _model(arch, layers=3)
    seen = []
    replaying = LayerReplay.replaying
    monkeypatch.setattr(LayerReplay, "replaying", lambda self, k, one_token=True: (seen.append((k, one_token)),
                                                                                   replaying(self, k, one_token))[1])
    kw = {"interventions": ["rope-off", "window:3"], "layers": "each"}
    a = run_ablate(AblateConfig(model_dir="-", **kw), progress=False, model=model, data=_ids())
    assert (1, True) in seen and all(one for _, one in seen) and a["summary"]["replayed_prefix"] is True
    b = run_ablate(AblateConfig(model_dir="-", replay=False, **kw), progress=False, model=model, data=_ids())
    for name in a["tensors"]:
        assert torch.equal(a["tensors"][name], b["tensors"][name]), name


def test_cli_and_python_give_the_same_losses(cli, tmp_path):
    model = tmp_path / "m"
    _model("llama", layers=2).save_pretrained(str(model))
    out = tmp_path / "a"
    code, _, err = cli("ablate", model, "--out", out, "--data", "random", "--seq-len", 16, "--num-seqs", 8,
                       "-i", "rope-off", "-i", "window:3", "--threads", 1, "--no-figures", "--quiet")
    assert code == 0, err
    r = poslens.ablate(str(model), ["rope-off", "window:3"], data="random", seq_len=16, num_seqs=8,
                       progress=False, threads=1)
    a, b = poslens.load(out).maps, r.maps
    assert set(a) == set(b) and len(a) == 5
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_loss_head_falls_back_to_the_models_logits_where_they_differ(llama, monkeypatch):
    from poslens.analysis.ablate.losses import LossHead

    ids = _ids()[:2]
    with torch.no_grad():
        ref = token_losses(llama(input_ids=ids, use_cache=False).logits, ids)
    head = LossHead(llama)
    assert torch.allclose(head.forward(ids, check=True), ref, atol=1e-5) and head.ok
    assert torch.allclose(head.forward(ids), ref, atol=1e-5)
    capped = LossHead(llama)  # logits changed after the head (a soft cap): the check fails, the model's are used
    h = llama.register_forward_hook(lambda _m, _a, out: out.__setitem__("logits", out["logits"].tanh()) or out)
    try:
        with torch.no_grad():
            ref2 = token_losses(llama(input_ids=ids, use_cache=False).logits, ids)
        got = capped.forward(ids, check=True)
        assert not capped.ok and torch.equal(got, ref2) and torch.equal(capped.forward(ids), ref2)
    finally:
        h.remove()
