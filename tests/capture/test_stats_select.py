"""``--stats``: only the asked-for statistics are allocated and computed, with the same numbers.

Each requested statistic must equal, bit for bit or to float tolerance, the same statistic of a
capture that computes everything; unrequested ones have no accumulator and their code never runs;
a bad name is a one-line error listing the valid names; the summary reads missing ones as null.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from poslens.capture.engine import attention as att
from poslens.capture.statistics.builtin import attn_cosine as builtin_attn_cosine
from poslens.capture.statistics.builtin import cosine as builtin_cosine
from poslens.capture.statistics.builtin import dim_logit as builtin_dim_logit
from poslens.capture.statistics.builtin import qk as builtin_qk
from poslens.capture.scan.checkpoint import fingerprint
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.errors import PoslensError
from poslens.rundir.io import read_tensors
from tests.capture.test_capture import save_tiny


def _spec(stats, S=40, heads=()):
    return att.CaptureSpec(num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, seq_len=S, layers=[0],
                           rope_layers=set(), heads=list(heads), stats=att.parse_stats(stats), chunk_elems=2 * 4 * S * 7)


def _observe(stats, heads=()):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 40, 8, generator=g)
    k = torch.randn(2, 2, 40, 8, generator=g)
    out = torch.randn(2, 4, 40, 8, generator=g)
    cap = att.Capture(_spec(stats, heads=heads))
    cap.begin_batch(2)
    cap.observe_attention(0, q, k, out, 1 / math.sqrt(8))
    cap.observe_hidden(0, torch.randn(2, 40, 16, generator=g))
    cap.end_batch()
    return cap


@pytest.mark.parametrize("stats", ["scores", "probs", "slash", "scores,probs", "qk,dim_logit", "attn_cosine",
                                   "cosine", "probs,slash"])
def test_requested_statistics_equal_the_full_capture(stats):
    full = _observe("all").means()
    part_cap = _observe(stats)
    part = part_cap.means()
    wanted = {a for s in stats.split(",") for a in att.STATS[s]}
    assert set(part) == wanted  # nothing else allocated
    for name in wanted:
        torch.testing.assert_close(part[name], full[name], rtol=0, atol=1e-12)


def test_unrequested_statistics_are_not_computed(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("computed a statistic that was not asked for")

    monkeypatch.setattr(builtin_cosine, "add_cosine", boom)
    monkeypatch.setattr(builtin_attn_cosine, "add_cosine", boom)
    monkeypatch.setattr(att.Capture, "unrotate", boom)
    monkeypatch.setattr(builtin_qk, "head_gram", boom)
    monkeypatch.setattr(builtin_dim_logit, "causal_pair_dim_sum", boom)
    cap = _observe("scores,probs")
    # score_groups: the scores' noise groups; sink_heads: each head's key-0 column of the probs' softmax
    assert set(cap.means()) == {"scores", "score_groups", "probs", "sink_heads"}


def test_qk_only_skips_the_attention_maps(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("attention maps computed for --stats qk")

    from poslens.capture.backends import attnpass
    from poslens.capture.backends import choice as backends

    monkeypatch.setattr(attnpass.AttentionPass, "run", boom)
    monkeypatch.setattr(backends, "triton_pass", boom)
    assert set(_observe("qk,dim_logit").means()) == {"q_gram", "k_gram", "dim_logit"}


def test_head_maps_follow_heads_with_any_stats():
    full = _observe("all", heads=[(0, 1)]).means()
    part = _observe("qk", heads=[(0, 1)]).means()
    assert set(part) == {"q_gram", "k_gram", "head_scores", "head_probs"}
    torch.testing.assert_close(part["head_probs"], full["head_probs"], rtol=0, atol=1e-12)


def test_bad_stats_name_is_one_clear_error():
    with pytest.raises(PoslensError) as e:
        att.parse_stats("scores,bogus")
    msg = str(e.value)
    assert "bogus" in msg and "\n" not in msg
    for name in att.STATS:
        assert name in msg
    with pytest.raises(PoslensError):
        att.parse_stats("")
    assert att.parse_stats("all") == att.ALL_STATS == att.parse_stats(None)
    assert att.parse_stats([" scores", "probs "]) == {"scores", "probs"}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("llama_stats") / "m")


def test_scan_cli_stats(cli, llama_dir, tmp_path):
    out = tmp_path / "bad"
    code, _, err = cli("scan", llama_dir, "--out", out, "--quiet", "--stats", "scores,nope")
    assert code != 0 and "--stats nope" in err and "attn_cosine" in err
    assert not out.exists()  # nothing written

    full, part = tmp_path / "full", tmp_path / "part"
    common = ["--data", "random", "--seq-len", 16, "--num-seqs", 4, "--batch-size", 2, "--quiet"]
    assert cli("scan", llama_dir, "--out", full, *common)[0] == 0
    code, _, err = cli("scan", llama_dir, "--out", part, *common, "--stats", "scores,probs")
    assert code == 0, err
    mf, mp = read_tensors(full / "maps.safetensors"), read_tensors(part / "maps.safetensors")
    assert {"scores", "probs"} <= set(mp) and not {"slash", "cosine", "q_gram", "dim_logit"} & set(mp)
    for name in ("scores", "probs"):
        torch.testing.assert_close(mp[name], mf[name], rtol=0, atol=1e-6)
    s = json.loads((part / "summary.json").read_text())
    assert s["stats"] == ["probs", "scores"]
    row = s["layers"][0]
    assert row["relativity_index"] is not None and row["aps"] is None and row["q_top1_energy"] is None
    assert s["slash_top_heads"] == [] and (part / "scores_raw.png").exists()
    # no scores: no figures, still a complete run directory
    code, _, err = cli("scan", llama_dir, "--out", tmp_path / "cos", *common, "--stats", "cosine")
    assert code == 0, err
    assert not (tmp_path / "cos" / "scores_raw.png").exists()
    assert set(read_tensors(tmp_path / "cos" / "maps.safetensors")) >= {"cosine", "norms"}


def test_resume_fingerprint_includes_stats(llama_dir, tmp_path):
    a = ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "a"), stats=["scores"])
    b = ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "a"), stats=["scores", "probs"])
    c = ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "a"), stats=["probs", "scores"])
    assert fingerprint(a) != fingerprint(b) == fingerprint(c)
    assert fingerprint(ScanConfig(model_dir=str(llama_dir), out="x")) == fingerprint(
        ScanConfig(model_dir=str(llama_dir), out="x", stats=["all"]))
    # a stopped run resumes only with the same statistics
    cfg = ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "r"), data="random", seq_len=12, num_seqs=6,
                     batch_size=2, figures=False, stats=["scores"], checkpoint_every=1)
    run_scan(cfg, progress=False, stop_after_batches=1)
    other = ScanConfig(**{**cfg.__dict__, "stats": ["scores", "probs"], "resume": True})
    with pytest.raises(PoslensError, match="different options"):
        run_scan(other, progress=False)
    done = run_scan(ScanConfig(**{**cfg.__dict__, "resume": True}), progress=False)
    assert done["num_seqs"] == 6


def test_builtin_statistic_modules_are_registered_once():
    """Each module of poslens.capture.statistics.builtin: one registry line, its --stats name in STATS with the
    accumulators it fills (and those of the statistics it brings along), their shapes in
    maps.safetensors' table, and nothing else filled."""
    import importlib
    import pkgutil

    import poslens.capture.statistics.builtin as builtin
    from poslens.capture.statistics.builtin import BUILTINS, REGISTRY, requirements

    modules = [m.name for m in pkgutil.iter_modules(builtin.__path__) if m.name != "base"]
    assert sorted(importlib.import_module(f"poslens.capture.statistics.builtin.{m}").STATISTIC.name for m in modules) == sorted(
        st.name for st in REGISTRY)  # every module registered, once
    assert len({st.name for st in REGISTRY}) == len(REGISTRY)
    spec = dataclasses.replace(_spec("all", heads=[(0, 1)]), head_maps=True)  # every statistic active
    shapes = att.accumulator_shapes(spec)
    cap = att.Capture(spec)
    for st in REGISTRY:
        own = st.shapes(spec)
        assert set(own) <= set(st.accumulators) and all(shapes[a] == s for a, s in own.items())
        assert set(st.make_accumulators(spec, "cpu")) == set(st.accumulators)  # e.g. scores' noise groups too
    for name, st in BUILTINS.items():
        assert st.name == name and att.STATS[name] == st.accumulators + tuple(
            a for r in requirements(st) for a in r.accumulators)
    assert set(cap.accs) == {a for st in REGISTRY for a in st.accumulators}
    assert set(BUILTINS) == {"scores", "probs", "slash", "cosine", "attn_cosine", "qk", "dim_logit"}
