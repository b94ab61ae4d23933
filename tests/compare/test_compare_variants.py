"""compare's variants on tiny random models: the specs parsed and refused, the RoPE variants against
transformers' own models built with that config, dtype and the interventions applied and undone, the
model handed back as it was."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from archs import V, tiny_config
from test_model_untouched import changes, snapshot

from poslens.analysis.compare.variants import (
    Variant,
    applied,
    parse_variant,
    variant_label,
)
from poslens.capture.model.adapters import get_adapter
from poslens.capture.model.borrow import borrowed
from poslens.errors import PoslensError

S, N, POS = 24, 2, 16  # sequences longer than max_position_embeddings: dynamic scaling takes effect


def _model(arch: str = "llama", seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM

    kw.setdefault("positions", POS)
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(tiny_config(arch, **kw))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj", "c_attn")) and p.ndim == 2:
                p.mul_(8.0)
    return m.eval()


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, V, (N, S), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids=None):
    with torch.no_grad():
        return model(input_ids=_ids() if ids is None else ids, use_cache=False).logits


def _apply(model, specs, **kw):
    return applied(model, specs, adapter=get_adapter(model.config), config=model.config, **kw)


def _rope_outputs(model):
    """The (cos, sin) every call of the model's current rotary module returns in one forward."""
    got = []
    h = get_adapter(model.config).rotary_module(model).register_forward_hook(
        lambda _m, _a, out: got.append((out[0].detach().clone(), out[1].detach().clone())))
    try:
        _logits(model)
    finally:
        h.remove()
    return got


def _tree(model):
    return [(name, type(m), id(m)) for name, m in model.named_modules()]


def _state(model):
    return {k: (v, v.detach().clone()) for k, v in model.state_dict(keep_vars=True).items()}


def _same_state(before, model) -> bool:
    now = model.state_dict(keep_vars=True)
    return now.keys() == before.keys() and all(now[k] is v and v.dtype == c.dtype and torch.equal(v, c)
                                               for k, (v, c) in before.items())


# --------------------------------------------------------------------------------------------
# the specs
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,kind,name,label", [
    ("rope-scaling=yarn:4", "rope-scaling", "rope-scaling=yarn:4", "yarn ×4"),
    ("rope-scaling=linear:2.5", "rope-scaling", "rope-scaling=linear:2.5", "linear ×2.5"),
    ("Rope-Scaling=dynamic:8", "rope-scaling", "rope-scaling=dynamic:8", "dynamic ×8"),
    ("rope-scaling=llama3:8.0", "rope-scaling", "rope-scaling=llama3:8", "llama3 ×8"),
    ("rope-theta=5e5", "rope-theta", "rope-theta=500000", "θ=500000"),
    ("dtype=bf16", "dtype", "dtype=bfloat16", "bfloat16"),
    ("dtype=float16", "dtype", "dtype=float16", "float16"),
    ("dtype=fp32", "dtype", "dtype=float32", "float32"),
    ("window=16", "window", "window=16", "window 16"),
    ("rope-off@3", "intervention", "rope-off@3", "rope-off@3"),
    ("sink-off@all", "intervention", "sink-off@all", "sink-off@all"),
    ("rope-band:low@0,3", "intervention", "rope-band:low@0,3", "rope-band:low@0,3"),
    ("window:16@2", "intervention", "window:16@2", "window:16@2"),
    ("massive-qk@5", "intervention", "massive-qk@5", "massive-qk@5"),
    ("random-qk@1-3", "intervention", "random-qk@1,2,3", "random-qk@1,2,3"),
])
def test_every_spec_form_parses(spec, kind, name, label):
    v = parse_variant(spec)
    assert isinstance(v, Variant) and (v.kind, v.name) == (kind, name)
    assert parse_variant(v.name) == v and parse_variant(v) is v
    assert variant_label([spec]) == label


def test_parsed_fields_and_joined_label():
    v = parse_variant("rope-scaling=yarn:4")
    assert (v.rope_type, v.factor) == ("yarn", 4.0)
    assert parse_variant("rope-theta=1e6").theta == 1e6
    assert parse_variant("window=7").window == 7
    iv = parse_variant("rope-band:low@0,3")
    assert (iv.intervention.kind, iv.intervention.arg, iv.layers) == ("rope-band", "low", "0,3")
    assert variant_label(["rope-scaling=yarn:4", "dtype=bf16", "rope-off@3"]) == "yarn ×4 + bfloat16 + rope-off@3"


@pytest.mark.parametrize("spec", ["foo=1", "bar", "rope-scaling=yarn", "rope-scaling=ntk:2", "rope-scaling=yarn:0",
                                  "rope-scaling=linear:-2", "rope-scaling=linear:nan", "rope-scaling=yarn:x",
                                  "rope-theta=0", "rope-theta=inf", "dtype=int8", "window=0", "window=1.5",
                                  "rope-off", "rope-off@each", "sink-off@each:0-3", "rope-band:lowest@1",
                                  "window:0@2", "rope-off@x", "rope-off@"])
def test_bad_specs_are_one_line_errors(spec):
    with pytest.raises(PoslensError) as e:
        parse_variant(spec)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"--variant {spec!r}")


def test_unknown_spec_lists_the_valid_forms():
    with pytest.raises(PoslensError) as e:
        parse_variant("foo=1")
    msg = str(e.value)
    assert msg == ("--variant 'foo=1': unknown variant; use rope-scaling=linear|dynamic|yarn|llama3:FACTOR, "
                            "rope-theta=X, dtype=bfloat16|float16, window=W, or an ablate intervention such as "
                            "rope-off@3 or sink-off@all.")


# --------------------------------------------------------------------------------------------
# RoPE: transformers' own tables
# --------------------------------------------------------------------------------------------
_ROPE_CASES = [
    ("llama", "rope-scaling=yarn:4", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                      "original_max_position_embeddings": POS}),
    ("llama", "rope-scaling=linear:2", {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    ("llama", "rope-scaling=dynamic:4", {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}),
    ("llama", "rope-scaling=llama3:8", {"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": POS}),
    ("llama", "rope-theta=500", {"rope_type": "default", "rope_theta": 500.0}),
    ("gemma3_text", "rope-scaling=yarn:4", {
        "sliding_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                              "original_max_position_embeddings": POS},
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                           "original_max_position_embeddings": POS}}),
    ("gemma3_text", "rope-theta=5e4", {  # the base replaced, the global layers' linear scaling kept
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e4},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 5e4}}),
]


@pytest.mark.parametrize("arch,spec,params", _ROPE_CASES)
def test_rope_variants_give_the_tables_of_transformers_own_model(arch, spec, params):
    from transformers import AutoModelForCausalLM

    model = _model(arch)
    cfg = type(model.config).from_dict({**model.config.to_dict(), "rope_parameters": params})
    ref = AutoModelForCausalLM.from_config(cfg).eval()
    ref.load_state_dict(model.state_dict())
    expected, plain = _rope_outputs(ref), _rope_outputs(model)
    with _apply(model, [spec]) as ap:
        got = _rope_outputs(model)
        logits = _logits(model)
        assert ap.edits is None and ap.rope_layers == [0, 1]
        assert ap.describe()["rope"]["rope_parameters"] == params
    assert len(got) == len(expected) > 0
    for (c, s), (ce, se), (cp, _) in zip(got, expected, plain):
        assert torch.allclose(c, ce, atol=1e-6) and torch.allclose(s, se, atol=1e-6)
        assert c.shape == cp.shape
    assert any(not torch.allclose(c, cp, atol=1e-4) for (c, _), (cp, _) in zip(got, plain))  # the variant did something
    assert torch.allclose(logits, _logits(ref), atol=1e-5)


def test_rope_scaling_changes_the_forward_and_hands_the_model_back_as_it_was():
    model = _model("llama")
    _logits(model)
    before, state, conf, tree, plain = snapshot(model), _state(model), model.config.to_dict(), _tree(model), _logits(model)
    rot = get_adapter(model.config).rotary_module(model)
    with _apply(model, ["rope-scaling=yarn:4"]) as ap:
        assert get_adapter(model.config).rotary_module(model) is not rot
        assert not torch.allclose(_logits(model), plain, atol=1e-4)
        d = json.loads(json.dumps(ap.describe()))
        assert d["rope"]["tables"]["default"]["attention_scaling"] > 1.0 == d["rope"]["before"]["default"][
            "attention_scaling"]
    assert get_adapter(model.config).rotary_module(model) is rot
    assert torch.equal(_logits(model), plain)
    assert changes(before, snapshot(model)) == []
    assert _same_state(state, model) and model.config.to_dict() == conf and _tree(model) == tree


def test_an_exception_inside_the_block_undoes_every_variant():
    model = _model("llama")
    _logits(model)
    before, state, plain = snapshot(model), _state(model), _logits(model)
    with pytest.raises(RuntimeError, match="boom"):
        with _apply(model, ["dtype=bf16", "rope-scaling=linear:2", "rope-off@1"]):
            raise RuntimeError("boom")
    assert changes(before, snapshot(model)) == [] and _same_state(state, model)
    assert model.config._attn_implementation != "poslens"
    assert torch.equal(_logits(model), plain)


def test_a_failed_apply_undoes_what_it_had_applied():
    model = _model("llama")
    before, state = snapshot(model), _state(model)
    with pytest.raises(PoslensError, match="both edit layer 1"):
        with _apply(model, ["dtype=bf16", "rope-scaling=yarn:2", "rope-off@1", "sink-off@all"]):
            pass
    assert changes(before, snapshot(model)) == [] and _same_state(state, model)


def test_rope_variants_refused_on_a_model_without_rope():
    model = _model("gpt2")
    for spec in ("rope-scaling=yarn:4", "rope-theta=1e6"):
        with pytest.raises(PoslensError) as e:
            with _apply(model, [spec]):
                pass
        msg = str(e.value)
        assert "\n" not in msg and parse_variant(spec).name in msg and "'gpt2'" in msg and "use a RoPE model, or drop the variant" in msg


# --------------------------------------------------------------------------------------------
# dtype
# --------------------------------------------------------------------------------------------
def test_dtype_bfloat16_inside_and_bit_identical_originals_after():
    model = _model("llama")
    _logits(model)
    before, state, plain = snapshot(model), _state(model), _logits(model)
    data = {id(p): p.data for p in model.parameters()}
    with _apply(model, ["dtype=bfloat16"]) as ap:
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        assert get_adapter(model.config).rotary_module(model).inv_freq.dtype == torch.float32
        assert _logits(model).dtype == torch.bfloat16
        assert ap.describe()["dtype"] == {"dtype": "bfloat16", "from": "float32", "parameters": len(data),
                                          "buffers": 0}
    assert all(p.data is data[id(p)] or p.data.data_ptr() == data[id(p)].data_ptr() for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert changes(before, snapshot(model)) == [] and _same_state(state, model)
    assert torch.equal(_logits(model), plain)


def test_dtype_and_rope_scaling_combine():
    model = _model("llama")
    plain = _logits(model)
    with _apply(model, ["rope-scaling=yarn:4"]):
        yarn = _logits(model)
    with _apply(model, ["dtype=bf16", "rope-scaling=yarn:4"]) as ap:
        both = _logits(model)
        assert ap.describe()["label"] == "bfloat16 + yarn ×4"
    assert both.dtype == torch.bfloat16
    assert (both.float() - yarn).abs().max() < (both.float() - plain).abs().max()  # nearer yarn's than the plain one
    assert torch.equal(_logits(model), plain)


# --------------------------------------------------------------------------------------------
# ablate's interventions
# --------------------------------------------------------------------------------------------
def test_rope_off_at_one_layer_leaves_the_earlier_layer_and_changes_the_logits():
    model = _model("llama", layers=2)
    plain_outside = _logits(model)
    outs = []
    h = model.model.layers[0].register_forward_hook(lambda _m, _a, out: outs.append(
        (out[0] if isinstance(out, tuple) else out).detach().clone()))
    try:
        with _apply(model, ["rope-off@1"]) as ap:
            assert sorted(ap.edits.layers) == [1] and ap.edits.layers[1].unrotated_pairs.all()
            plain = _logits(model)  # edits not active: the model as it is
            with ap.active():
                edited = _logits(model)
            assert ap.describe()["edits"]["rope-off@1"] == {"intervention": "rope-off", "layers": [1], "applies": True}
    finally:
        h.remove()
    assert torch.allclose(plain, plain_outside, atol=1e-5)
    assert len(outs) == 2 and torch.equal(outs[0], outs[1])  # layer 0 unchanged under the edit
    assert not torch.allclose(edited, plain, atol=1e-3)
    assert torch.equal(_logits(model), plain_outside)


def test_intervention_layers_are_read_against_the_model():
    model = _model("llama", layers=2)
    with _apply(model, ["sink-off@all"]) as ap:
        assert sorted(ap.edits.layers) == [0, 1] and all(e.sink_off for e in ap.edits.layers.values())
    with pytest.raises(PoslensError, match="layers 0..1"):
        with _apply(model, ["rope-off@5"]):
            pass


def test_massive_qk_needs_ids_and_is_calibrated_on_them():
    model = _model("llama")
    with pytest.raises(PoslensError, match="massive-qk@1.*ids"):
        with _apply(model, ["massive-qk@1"]):
            pass
    with _apply(model, ["massive-qk@1"], ids=_ids(), batch_size=1) as ap:
        e = ap.edits.layers[1]
        assert e.q_dims is not None and e.q_mean.shape == e.q_dims.shape
        assert set(ap.describe()["edits"]["massive-qk@1"]["massive_dims"]) == {"1"}


def test_combinations_refused_in_one_line():
    model = _model("llama")
    for specs, match in ((["dtype=bf16", "dtype=fp16"], "one dtype"),
                         (["rope-off@1", "rope-off@1"], "each variant once"),
                         (["rope-scaling=yarn:2", "rope-scaling=linear:2"], "one rope-scaling"),
                         (["window=3", "rope-off@1"], "both edit layer 1")):
        with pytest.raises(PoslensError, match=match) as e:
            with _apply(model, specs):
                pass
        assert "\n" not in str(e.value)


# --------------------------------------------------------------------------------------------
# window=W: against transformers' own sliding window of W + 1 keys
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch,ref_arch,layers", [("mistral", "mistral", [0, 1]), ("gemma3_text", "gemma3_text", [0]),
                                                  ("llama", "mistral", [0, 1])])
def test_window_narrows_the_sliding_layers_as_a_shorter_window_would(arch, ref_arch, layers):
    import transformers as tf

    W = 3
    model = _model(arch)
    ref_cfg = tiny_config(ref_arch, positions=POS)
    ref_cfg.sliding_window = W + 1  # a query sees itself and the W keys before it
    ref = tf.AutoModelForCausalLM.from_config(ref_cfg).eval()
    ref.load_state_dict(model.state_dict())
    plain = _logits(model)
    before = snapshot(model)
    with _apply(model, [f"window={W}"]) as ap:
        assert sorted(ap.edits.layers) == layers and all(ap.edits.layers[l].window == W for l in layers)
        assert json.loads(json.dumps(ap.describe()))["edits"][f"window={W}"]["layers"] == layers
        with ap.active():
            got = _logits(model)
    assert not torch.allclose(got, plain, atol=1e-3)
    with borrowed(ref):
        expected = _logits(ref)
    assert torch.allclose(got, expected, atol=1e-5)
    assert changes(before, snapshot(model)) == []


def test_window_not_narrower_than_the_models_own_is_refused():
    model = _model("mistral")  # sliding window 8: a query sees itself and 7 keys before it
    with pytest.raises(PoslensError, match="W <= 6") as e:
        with _apply(model, ["window=7"]):
            pass
    assert "\n" not in str(e.value) and "'mistral'" in str(e.value)
    with _apply(model, ["window=6"]) as ap:
        assert sorted(ap.edits.layers) == [0, 1]
