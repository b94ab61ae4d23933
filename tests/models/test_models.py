"""Model families: plain HF configs, the NoPE switch really removes positions, presets, init scale."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from poslens.errors import PoslensError
from poslens.models.families import PRESETS, build_config, build_model, count_parameters, pe_of, resolve_shape


def test_families_are_plain_hf_configs():
    assert build_config("none", "micro", 50).model_type == "smollm3"
    assert build_config("none", "micro", 50).no_rope_layers == [0, 0]
    assert build_config("rope", "micro", 50).no_rope_layers == [1, 1]
    assert build_config("learned", "micro", 50).model_type == "gpt2"
    for pe in ("none", "rope", "learned"):
        assert pe_of(build_config(pe, "micro", 50)) == pe


def test_nope_layers_do_not_apply_rope():
    nope, rope = build_model("none", "micro", 50), build_model("rope", "micro", 50)
    assert not any(layer.self_attn.use_rope for layer in nope.model.layers)
    assert all(layer.self_attn.use_rope for layer in rope.model.layers)


def _last_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_one_layer_nope_is_blind_to_prefix_order_rope_is_not():
    # With one layer and no positional encoding, the last position attends to a *set* of keys:
    # permuting the earlier tokens cannot change its output. RoPE makes it order-dependent.
    a = [5, 9, 13, 21, 7, 30]
    b = [13, 5, 21, 9, 7, 30]  # same prefix multiset, different order, same last token
    for pe, invariant in (("none", True), ("rope", False), ("learned", False)):
        m = build_model(pe, "micro", 50, layers=1, init_std=0.5, seed=1).eval()
        same = torch.allclose(_last_logits(m, a), _last_logits(m, b), atol=1e-5)
        assert same == invariant, pe


@pytest.mark.parametrize("pe", ["none", "rope", "learned"])
def test_save_reload_identical(pe, tmp_path):
    m = build_model(pe, "micro", 40, seed=3).eval()
    m.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    r = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(m(input_ids=ids).logits, r(input_ids=ids).logits)


def test_seed_determines_weights():
    a, b, c = (build_model("rope", "micro", 40, seed=s) for s in (1, 1, 2))
    wa, wb, wc = (m.model.layers[0].self_attn.q_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


@pytest.mark.parametrize("std", [0.0002, 0.02, 2.0])
def test_init_std_sets_weight_scale(std):
    m = build_model("none", "micro", 40, init_std=std, hidden=64, seed=0)
    w = m.model.layers[0].mlp.up_proj.weight
    assert abs(float(w.detach().std()) / std - 1) < 0.1
    g = build_model("learned", "micro", 40, init_std=std, hidden=64, seed=0)
    assert abs(float(g.transformer.h[0].mlp.c_fc.weight.detach().std()) / std - 1) < 0.1


def test_overrides_and_gqa():
    cfg = build_config("rope", "tiny", 50, layers=1, hidden=64, heads=4, kv_heads=2, rope_theta=500.0)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (1, 64, 4, 2)
    assert cfg.rope_parameters["rope_theta"] == 500.0
    g = build_config("learned", "micro", 50, layers=3, hidden=48, heads=3, max_positions=99)
    assert (g.n_layer, g.n_embd, g.n_head, g.n_positions) == (3, 48, 3, 99)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(pe="alibi"), "--pe"),
    (dict(preset="huge"), "--preset"),
    (dict(hidden=30, heads=4), "divisible"),
    (dict(heads=4, kv_heads=3), "kv-heads"),
    (dict(layers=0), "--num-layers"),
    (dict(init_std=0.0), "--init-std"),
    (dict(pe="learned", heads=4, kv_heads=2), "grouped-query"),
])
def test_bad_shapes_are_clear_errors(kwargs, msg):
    args = dict(pe="rope", preset="micro", vocab_size=50)
    args.update(kwargs)
    with pytest.raises(PoslensError, match=msg):
        build_config(args.pop("pe"), args.pop("preset"), args.pop("vocab_size"), **args)


def test_presets_grow_and_1b_is_about_a_billion():
    sizes = [resolve_shape(p) for p in PRESETS]
    assert [s.hidden for s in sizes] == sorted(s.hidden for s in sizes)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(build_config("rope", "1b", 32000))
    assert 0.9e9 < count_parameters(m) < 1.4e9


def test_integer_init_std_is_accepted():
    # the random-init sweep's largest sigma is written "2" on the command line
    from poslens.models.families import build_model

    for pe in ("none", "rope", "learned"):
        m = build_model(pe, "micro", 64, init_std=2)
        assert m.config.initializer_range == 2.0
