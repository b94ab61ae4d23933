"""``poslens compare`` on tiny random models: a model against itself gives exactly zero and
``unchanged`` everywhere; each reading equals an independent computation from the model's own
attention weights; the losses equal the LM's own cross-entropy; the paired statistics and the
verdict rule on known cases; bad input refused in one line with nothing written."""

from __future__ import annotations

import math

import pytest
import torch

import poslens
from archs import tiny_config
from poslens.analysis.compare.readings import mean_distance
from poslens.errors import PoslensError
from poslens.metrics.noise import paired_groups, signflip_pvalues
from poslens.metrics.verdicts import CHANGED, UNCHANGED, change_verdicts


def _llama(layers=2, positions=128, seed=0):
    import transformers as tf

    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(tiny_config("llama", layers=layers, positions=positions)).eval()


def _ids(n=8, s=48, seed=1):
    return torch.randint(3, 100, (n, s), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model():
    return _llama()


@pytest.fixture(scope="module")
def self_run(model):
    return poslens.compare(model, data=_ids(), seq_len=[24, 48], num_seqs=8, noise_groups=8, progress=False,
                           threads=None)


def test_a_model_against_itself_is_exactly_unchanged(self_run):
    df = self_run.changes()
    assert len(df) > 0 and set(df.seq_len) == {24, 48}
    assert (df.delta == 0).all() and (df.se == 0).all() and (df.p == 1).all()
    assert (df.verdict == UNCHANGED).all()
    m = self_run.maps
    for k in m:
        if k.startswith("a."):
            b = m["b." + k[2:]]
            assert torch.equal(m[k].nan_to_num(7.0), b.nan_to_num(7.0)), k  # bit for bit, both sides


def test_every_heads_map_is_kept_for_both_sides_and_equals_a_scans(self_run, model):
    """``{side}.{S}.head_maps`` ``[L, H, m, m]`` (float16): identical for a model against itself, and the
    mean over all sequences of the weights, as a scan's ``head_maps`` of the same sequences."""
    m = self_run.maps
    for S in (24, 48):
        a, b = m[f"a.{S}.head_maps"], m[f"b.{S}.head_maps"]
        assert a.dtype == torch.float16 and a.shape == (2, 4, S, S)
        assert torch.equal(a, b)
        r = poslens.scan(model, data=_ids()[:, :S], seq_len=S, num_seqs=8, heads="all", stats="probs", reservoir=0,
                         progress=False)
        torch.testing.assert_close(a.float(), r.maps["head_maps"], rtol=1e-3, atol=1e-6)


def test_every_reading_has_its_rows(self_run):
    df = self_run.changes(seq_len=48)
    L, H = 2, 4
    for reading in ("sink", "slash", "prev_token", "entropy", "distance"):
        rows = df[df.reading == reading]
        assert len(rows) == L * H + L  # every head, and each layer's mean over heads
    for reading in ("relativity", "locality", "diagonal_trend", "band_high", "band_medium", "band_low",
                    "massive_dims"):
        assert len(df[df.reading == reading]) == L
    loss = df[df.reading == "loss"]
    assert loss.positions.iloc[0] == [1, 47] and len(loss) == 1 + 6  # overall and buckets [1,2) ... [32,48)
    with pytest.raises(PoslensError, match="no such reading"):
        self_run.changes(reading="nonsense")


def _weights(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, use_cache=False)
    return out.attentions, out.logits


def test_readings_equal_an_independent_computation_from_the_weights():
    """The sink, previous-token score, entropy and mean distance of each head, and the loss, against a
    brute-force loop over the eager attention weights of the same model on the same tokens."""
    import transformers as tf

    torch.manual_seed(3)
    cfg = tiny_config("llama", layers=2, positions=64)
    cfg._attn_implementation = "eager"
    m = tf.LlamaForCausalLM(cfg).eval()
    ids = _ids(4, 32, seed=5)
    r = poslens.compare(m, data=ids, seq_len=32, num_seqs=4, noise_groups=4, progress=False, threads=None)
    att, logits = _weights(m, ids)
    S = 32
    df = r.changes()
    for li, A in enumerate(att):  # [N, H, S, S]
        A = A.double()
        i = torch.arange(S)
        sink = A[..., 1:, 0].mean(-1).mean(0)
        prev = A[..., i[1:], i[1:] - 1].mean(-1).mean(0)
        ent = -(A * A.clamp_min(1e-300).log()).sum(-1).mean(-1).mean(0)
        dist = (A * (i[:, None] - i[None, :]).clamp_min(0).double()).sum(-1).mean(-1).mean(0)
        for name, ref in (("sink", sink), ("prev_token", prev), ("entropy", ent), ("distance", dist)):
            got = df[(df.reading == name) & (df.layer == li) & df["head"].notna()].sort_values("head").a.to_numpy()
            assert got == pytest.approx(ref.numpy(), rel=1e-4, abs=1e-6), (name, li)
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                           ids[:, 1:].reshape(-1), reduction="none").view(4, -1)
    assert torch.allclose(r.maps["a.32.loss"], ce, atol=1e-5)
    assert df[df.reading == "loss"].a.iloc[0] == pytest.approx(float(ce.double().mean()), abs=1e-6)


def test_mean_distance_of_known_profiles():
    S = 6
    uniform = torch.zeros(S)  # uniform causal attention: row i spreads 1/(i+1) over its i+1 keys
    for d in range(S):
        uniform[d] = sum(1 / (i + 1) for i in range(d, S)) / (S - d)
    assert float(mean_distance(uniform)) == pytest.approx(sum(i / 2 for i in range(S)) / S)
    prev = torch.zeros(S)
    prev[1] = 1.0
    prev[0] = 0.0
    assert float(mean_distance(prev)) == pytest.approx((S - 1) / S)  # every query but the first looks 1 back


def test_signflip_pvalues_known_cases():
    d = torch.ones(8, 1)
    assert float(signflip_pvalues(d)[0]) == pytest.approx(2 / 2**8 * 2 / 2)  # only all-same signs reach |8|
    assert float(signflip_pvalues(torch.zeros(8, 2))[0]) == 1.0
    assert math.isnan(float(signflip_pvalues(torch.ones(1, 1))[0]))
    st = paired_groups(torch.zeros(4, 3), torch.ones(4, 3) * torch.tensor([1.0, 2.0, 3.0]))
    assert st["delta"].tolist() == [1.0, 2.0, 3.0] and (st["se"] == 0).all()


def test_the_change_rule_needs_significance_and_the_threshold():
    v = change_verdicts([0.5, 0.5, 0.001, 0.5], [0.01, 0.01, 0.0001, None], [1e-5, 0.5, 1e-5, 1e-5], threshold=0.02)
    assert [x["verdict"] for x in v] == [CHANGED, UNCHANGED, UNCHANGED, UNCHANGED]
    assert v[0]["floor"] == pytest.approx(2.3263 * 0.01, rel=1e-3)


def test_the_null_on_disjoint_samples_changes_at_the_stated_rate():
    """The same model on two token samples that share no sequence: row n of sample A pairs with row n of
    sample B (independent draws of the same distribution), over 20 seeds. Every reading's family of cells is
    held at a false discovery rate of 0.01: a change anywhere is a false positive."""
    m = _llama(layers=2, positions=64, seed=4)
    cells = changed = families = fam_changed = 0
    for seed in range(20):
        g = torch.Generator().manual_seed(100 + seed)
        ids = torch.randint(3, 100, (16, 32), generator=g)
        ids_b = torch.randint(3, 100, (16, 32), generator=g)
        r = poslens.compare(m, data=ids, data_b=ids_b, seq_len=32, num_seqs=16, noise_groups=16, map_size=0,
                            progress=False, threads=None)
        df = r.changes()
        cells += len(df)
        changed += int((df.verdict == CHANGED).sum())
        for _, fam in df.groupby(["reading", df["head"].isna()]):
            families += 1
            fam_changed += bool((fam.verdict == CHANGED).any())
    assert changed / cells <= 0.01
    assert fam_changed / families <= 0.05


def test_bad_input_is_refused_in_one_line_and_writes_nothing(tmp_path, model):
    out = tmp_path / "o"
    with pytest.raises(PoslensError, match="beyond_context=True") as e:
        poslens.compare(model, data=_ids(4, 160), seq_len=160, num_seqs=4, out=out, progress=False)
    assert "\n" not in str(e.value) and not out.exists()
    import transformers as tf

    other = tf.LlamaForCausalLM(tiny_config("llama", layers=3, positions=128)).eval()
    with pytest.raises(PoslensError, match="layers") as e:
        poslens.compare(model, other, data=_ids(4, 16), seq_len=16, num_seqs=4, out=out, progress=False)
    assert "\n" not in str(e.value) and not out.exists()
    cfg = tiny_config("llama", layers=2, positions=128)
    cfg.vocab_size = 120
    wide = tf.LlamaForCausalLM(cfg).eval()
    with pytest.raises(PoslensError, match="tokenizer") as e:
        poslens.compare(model, wide, data=_ids(4, 16), seq_len=16, num_seqs=4, out=out, progress=False)
    assert not out.exists()
    with pytest.raises(PoslensError, match="num_seqs"):
        poslens.compare(model, data=_ids(4, 16), seq_len=16, num_seqs="4", progress=False)


def test_rope_off_moves_nothing_below_its_layer_and_its_loss_equals_ablates():
    m = _llama(layers=3, positions=64, seed=7)
    ids = _ids(8, 32, seed=8)
    r = poslens.compare(m, variants=["rope-off@1"], data=ids, seq_len=32, num_seqs=8, noise_groups=8, progress=False,
                        threads=None)
    df = r.changes()
    below = df[df.layer == 0]
    assert len(below) > 0 and (below.delta == 0).all() and (below.a == below.b).all()
    for k, v in r.maps.items():  # every group reading of layer 0, bit for bit
        if k.startswith("a.") and not k.endswith((".loss", ".head_maps")):
            assert torch.equal(v[:, 0].nan_to_num(7.0), r.maps["b." + k[2:]][:, 0].nan_to_num(7.0)), k
    hm_a, hm_b = r.maps["a.32.head_maps"], r.maps["b.32.head_maps"]  # [L, H, m, m]: layer 0 alike, layer 1 not
    assert torch.equal(hm_a[0], hm_b[0]) and not torch.equal(hm_a[1], hm_b[1])
    at = df[(df.layer == 1) & df["head"].notna()]
    assert (at.delta.abs() > 0).any()
    a = poslens.ablate(m, "rope-off", layers=[1], data=ids, noise_groups=8, progress=False, threads=None)
    d = a.summary["conditions"][0]["delta"]
    loss = df[df.reading == "loss"].iloc[0]
    assert loss.delta == pytest.approx(d["mean"], abs=1e-6)
    assert r.summary["variants"] == ["rope-off@1"]


def test_a_rope_variant_changes_the_readings_and_leaves_the_model_as_it_was():
    m = _llama(layers=2, positions=64, seed=9)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    ids = _ids(8, 48, seed=10)
    with torch.no_grad():
        logits = m(input_ids=ids[:2]).logits
    r = poslens.compare(m, variants="rope-scaling=linear:4", data=ids, seq_len=48, num_seqs=8, noise_groups=8,
                        progress=False, threads=None)
    df = r.changes()
    assert (df[df.reading == "distance"].delta.abs() > 0).all()
    assert r.summary["applied"]["rope"]
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    with torch.no_grad():
        assert torch.equal(m(input_ids=ids[:2]).logits, logits)


def test_bad_variants_are_refused_before_any_work(tmp_path, model):
    import transformers as tf

    out = tmp_path / "o"
    with pytest.raises(PoslensError, match="unknown variant") as e:
        poslens.compare(model, variants="rope-scale=yarn:4", data=_ids(4, 16), seq_len=16, num_seqs=4, out=out,
                        progress=False)
    assert "\n" not in str(e.value) and not out.exists()
    gpt2 = tf.GPT2LMHeadModel(tiny_config("gpt2", layers=2, positions=64)).eval()
    with pytest.raises(PoslensError, match="no RoPE") as e:
        poslens.compare(gpt2, variants="rope-scaling=yarn:2", data=_ids(4, 16), seq_len=16, num_seqs=4, out=out,
                        progress=False)
    assert "\n" not in str(e.value) and not out.exists()
    with pytest.raises(PoslensError, match="window") as e:  # llama has no window of its own: W must be shorter
        poslens.compare(_llama(), variants="window=1000", data=_ids(4, 16), seq_len=16, num_seqs=4, out=out,
                        progress=False)
    assert not out.exists()


def test_the_score_map_readings_of_all_groups_equal_the_one_map_metrics():
    from poslens.analysis.compare.readings import score_map_readings
    from poslens.capture.scan.finalize import map_view
    from poslens.metrics.diagonal import diagonal_trend, locality, relativity_index

    g = torch.Generator().manual_seed(2)
    S = 40
    i = torch.arange(S, dtype=torch.float64)
    toeplitz = -(i[:, None] - i[None, :]).abs() * 0.1
    maps = torch.stack([map_view(toeplitz + 0.3 * torch.randn(S, S, generator=g, dtype=torch.float64), w)
                        for w in (None, None, None)])
    maps[2] = map_view(toeplitz, None)  # exactly relative: index 1, trend 0
    got = score_map_readings(maps)
    for k in range(3):
        assert float(got["relativity"][k]) == pytest.approx(relativity_index(maps[k], exclude_keys=(0,)), abs=1e-12)
        assert float(got["locality"][k]) == pytest.approx(locality(maps[k], exclude_keys=(0,)), abs=1e-12)
        assert float(got["diagonal_trend"][k]) == pytest.approx(diagonal_trend(maps[k], exclude_keys=(0,)), abs=1e-12)
    assert float(got["relativity"][2]) == pytest.approx(1.0) and float(got["diagonal_trend"][2]) == 0.0
    flat = score_map_readings(map_view(torch.ones(S, S, dtype=torch.float64), None)[None])
    assert all(math.isnan(float(v[0])) for v in flat.values())
