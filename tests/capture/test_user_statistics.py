"""Users' own statistics (``poslens.Statistic``): defined here, outside the package, and run by the scan.

The entropy statistic is the one ``docs/python.md`` shows, as written there. Its result must equal an
independent eager computation (transformers' ``output_attentions``) on a tiny Llama and on SmolLM2,
survive a SIGKILL and ``--resume`` bit for bit, and merge across ``torchrun`` ranks. A probe of every
capture point checks each one against a hook on the model's own modules.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import archs
import pytest
import torch

import poslens
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.data.sources import make_source
from poslens.capture.statistics.points import CAPTURE_POINTS
from poslens.capture.statistics.protocol import flatten_state, state_bytes, state_from_bytes, unflatten_state
from poslens.errors import PoslensError
from poslens.rundir.io import read_tensors

HERE = Path(__file__).resolve().parent


class AttentionEntropy(poslens.Statistic):
    """Mean entropy (nats) of each head's attention rows, per layer."""
    needs = ("probs",)
    def __init__(self):
        self.sum, self.rows = {}, {}
    def add(self, layer, probs):          # probs: [batch, heads, S, S], rows sum to 1
        p = probs.double()
        e = -(p * p.clamp_min(1e-300).log()).sum(-1)     # [batch, heads, S]
        self.sum[layer] = self.sum.get(layer, 0) + e.sum((0, 2))
        self.rows[layer] = self.rows.get(layer, 0) + e.shape[0] * e.shape[2]
    def merge(self, other):
        for l in other.sum:
            self.sum[l] = self.sum.get(l, 0) + other.sum[l]
            self.rows[l] = self.rows.get(l, 0) + other.rows[l]
    def state_dict(self):
        return {"sum": self.sum, "rows": self.rows}
    def load_state_dict(self, state):
        self.sum, self.rows = state["sum"], state["rows"]
    def result(self):                      # named tensors, stored with the run
        return {"entropy": torch.stack([self.sum[l] / self.rows[l] for l in sorted(self.sum)])}


ENTROPY = f"{AttentionEntropy.__module__}.AttentionEntropy"  # as config.json records it and --stats takes it


def eager_entropy(model_dir, ids: torch.Tensor) -> torch.Tensor:
    """``[L, H]``: the mean over sequences and query rows of each head's attention entropy, from
    transformers' eager attention (``output_attentions``), one sequence at a time, in float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    total = None
    with torch.no_grad():
        for b in range(ids.shape[0]):
            att = model(input_ids=ids[b:b + 1], output_attentions=True, use_cache=False).attentions
            e = []
            for a in att:
                p = a[0].double()  # [H, S, S]
                ent = torch.where(p > 0, -p * p.log(), torch.zeros_like(p)).sum(-1)  # [H, S]
                e.append(ent.mean(-1))
            e = torch.stack(e)
            total = e if total is None else total + e
    return total / ids.shape[0]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return archs.save_tiny("llama", tmp_path_factory.mktemp("llama") / "m", layers=3, hidden=32)


OPTS = dict(data="random", seq_len=16, num_seqs=7, batch_size=2, seed=3, figures=False)


def _ids(n=7, s=16, seed=3):
    return make_source("random", seq_len=s, num_seqs=n, seed=seed, vocab_size=archs.V).batch(0, n)


def test_entropy_equals_eager_and_is_stored_with_the_run(llama_dir, tmp_path):
    out = tmp_path / "r"
    run_scan(ScanConfig(model_dir=str(llama_dir), out=str(out), stats=["probs", AttentionEntropy()], **OPTS),
             progress=False)
    maps = read_tensors(out / "maps.safetensors")
    assert maps["entropy"].shape == (3, 4)
    torch.testing.assert_close(maps["entropy"].double(), eager_entropy(llama_dir, _ids()), rtol=0, atol=1e-6)
    assert float(maps["entropy"].std()) > 1e-3  # heads differ: not a constant that any statistic would give
    cfg = json.loads((out / "config.json").read_text())  # JSON: the statistic by its qualified class name
    assert cfg["options"]["stats"] == ["probs", ENTROPY]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["user_statistics"] == [ENTROPY] and summary["num_seqs"] == 7
    assert "probs" in maps and "scores" not in maps


def test_a_user_statistic_alone(llama_dir, tmp_path):
    out = tmp_path / "r"
    run_scan(ScanConfig(model_dir=str(llama_dir), out=str(out), stats=[AttentionEntropy()], **OPTS), progress=False)
    maps = read_tensors(out / "maps.safetensors")
    assert set(maps) == {"entropy"}
    torch.testing.assert_close(maps["entropy"].double(), eager_entropy(llama_dir, _ids()), rtol=0, atol=1e-6)
    assert json.loads((out / "summary.json").read_text())["num_seqs"] == 7


def test_stop_and_resume_is_bit_identical(llama_dir, tmp_path):
    base = dict(model_dir=str(llama_dir), checkpoint_every=1, keep_checkpoint=True, **OPTS)
    run_scan(ScanConfig(out=str(tmp_path / "a"), stats=["probs", AttentionEntropy()], **base), progress=False)
    partial = run_scan(ScanConfig(out=str(tmp_path / "b"), stats=["probs", AttentionEntropy()], **base),
                       progress=False, stop_after_batches=2)
    assert partial == {"stopped_at": 4}
    run_scan(ScanConfig(out=str(tmp_path / "b"), stats=["probs", AttentionEntropy()], resume=True, **base),
             progress=False)
    for f in ("maps.safetensors", "checkpoint.safetensors"):  # the results and the float64 sums themselves
        a, b = read_tensors(tmp_path / "a" / f), read_tensors(tmp_path / "b" / f)
        assert set(a) == set(b)
        for k in a:
            assert torch.equal(a[k], b[k]), (f, k)
    assert "entropy" in a or any(k.startswith("user.0.") for k in a)
    ck = read_tensors(tmp_path / "b" / "checkpoint.safetensors")
    assert sorted(k for k in ck if k.startswith("user.0.")) == [f"user.0.{i}" for i in range(3)]  # one sum a layer
    # a resume asking for another statistic is refused (the fingerprint records the class)
    with pytest.raises(PoslensError, match="different options"):
        run_scan(ScanConfig(out=str(tmp_path / "b"), stats=["probs", PointProbe()], resume=True, **base),
                 progress=False)


def _env():
    path = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def test_killed_scan_resumes_bit_for_bit(llama_dir, tmp_path):
    """SIGKILL a real `poslens scan --stats probs,<the entropy class>` after its first checkpoint,
    resume it from Python with the statistic object, compare with an uninterrupted run."""
    cfg = dict(model_dir=str(llama_dir), data="random", seq_len=24, num_seqs=40, batch_size=2, checkpoint_every=1,
               figures=False, seed=0)
    out = tmp_path / "killed"
    args = ["--data", "random", "--seq-len", "24", "--num-seqs", "40", "--batch-size", "2", "--checkpoint-every", "1",
            "--no-figures", "--quiet", "--stats", f"probs,{ENTROPY}"]
    proc = subprocess.Popen([sys.executable, "-m", "poslens", "scan", str(llama_dir), "--out", str(out), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    deadline = time.time() + 120
    while not (out / "checkpoint.safetensors").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert killed or proc.returncode == 0, err.decode()[-2000:]
    run_scan(ScanConfig(out=str(out), resume=True, stats=["probs", AttentionEntropy()], **cfg), progress=False)
    run_scan(ScanConfig(out=str(tmp_path / "clean"), stats=["probs", AttentionEntropy()], **cfg), progress=False)
    a = read_tensors(out / "maps.safetensors")
    b = read_tensors(tmp_path / "clean" / "maps.safetensors")
    assert set(a) == set(b) and "entropy" in a
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_torchrun_merges_the_ranks(llama_dir, tmp_path):
    single = tmp_path / "single"
    run_scan(ScanConfig(model_dir=str(llama_dir), out=str(single), stats=["probs", AttentionEntropy()],
                        **{**OPTS, "num_seqs": 10}), progress=False)
    out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "localhost:0", "-m", "poslens", "scan", str(llama_dir), "--out", str(out),
           "--data", "random", "--seq-len", "16", "--num-seqs", "10", "--batch-size", "2", "--seed", "3",
           "--stats", f"probs,{ENTROPY}", "--no-figures", "--quiet"]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**_env(), "POSLENS_DIST_TIMEOUT": "60"},
                         timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = read_tensors(single / "maps.safetensors"), read_tensors(out / "maps.safetensors")
    assert set(a) == set(b)
    for k in a:  # the same per-batch sums, added in another order
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-7, msg=k)
    assert json.loads((out / "summary.json").read_text())["num_seqs"] == 10


# --------------------------------------------------------------------------------------------
# every capture point, against the model's own modules
# --------------------------------------------------------------------------------------------
class PointProbe(poslens.Statistic):
    """Keeps the first batch's tensors of its capture points, per layer."""
    needs = ("resid_pre", "resid_post")

    def __init__(self):
        self.seen = {}

    def add(self, layer, **points):
        assert set(points) == set(self.needs)
        self.seen.setdefault(layer, {k: v.detach().clone() for k, v in points.items()})


class ChunkProbe(PointProbe):
    """Every attention point, chunk by chunk, put back together into the first batch's whole tensors."""
    needs = tuple(p for p in CAPTURE_POINTS if p not in ("resid_pre", "resid_post"))

    def add(self, layer, **points):
        assert set(points) == set(self.needs)
        r, s = points["rows"], points["seqs"]
        seen = self.seen.setdefault(layer, {})
        b = s.stop - s.start
        for name in ("scores", "probs"):
            x = points[name]
            assert x.shape[:3] == (b, x.shape[1], r.stop - r.start)
            full = seen.setdefault(name, torch.full((s.stop, x.shape[1], 12, 12), float("nan")))
            full[s, :, r] = float("-inf") if name == "scores" else 0.0
            full[s, :, r, :x.shape[-1]] = x
        for name in ("q_pre", "q_post"):
            seen.setdefault(name, torch.zeros(s.stop, 4, 12, 8))[s, :, r] = points[name]
        for name in ("k_pre", "k_post"):
            k = points[name]
            seen.setdefault(name, torch.zeros(s.stop, 2, 12, 8))[s, :, :k.shape[2]] = k
        seen.setdefault("head_out", torch.zeros(s.stop, 12, 4, 8))[s, r] = points["head_out"]

    def merge(self, other):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def result(self):
        return {}


@pytest.mark.parametrize("piece_elems", [None, 100, 20])
def test_every_capture_point_equals_the_models_own_tensors(llama_dir, monkeypatch, piece_elems):
    """q/k before RoPE = the q/k projections; head outputs = the output projection's input; the
    residual stream = the decoder layer's input and output; probs = softmax(scores) = eager attention;
    scores = scaling * q . k after RoPE below the diagonal, -inf above it. With users' pieces smaller
    than the pass's chunks (a few rows; one row of one sequence) the pieces put back together are the
    same."""
    import poslens.capture.statistics.users as users

    if piece_elems:
        monkeypatch.setattr(users, "USER_PIECE_ELEMS", piece_elems)
    from transformers import AutoModelForCausalLM

    from poslens.capture.model.adapters import get_adapter
    from poslens.capture.engine.capture import Capture
    from poslens.capture.engine.spec import CaptureSpec
    from poslens.capture.model.load import load_model
    from poslens.capture.engine.loop import attach, forward

    ids = _ids(3, 12)
    model = load_model(str(llama_dir), dtype=torch.float32, device="cpu")
    ad = get_adapter(model.config)
    rec = {}
    hooks = []
    for l, layer in enumerate(ad.decoder_layers(model)):
        at = layer.self_attn
        hooks += [at.q_proj.register_forward_hook(lambda m, a, o, l=l: rec.__setitem__((l, "q"), o.clone())),
                  at.k_proj.register_forward_hook(lambda m, a, o, l=l: rec.__setitem__((l, "k"), o.clone())),
                  at.o_proj.register_forward_pre_hook(lambda m, a, l=l: rec.__setitem__((l, "o"), a[0].clone())),
                  layer.register_forward_pre_hook(lambda m, a, kw, l=l: rec.__setitem__(
                      (l, "in"), (a[0] if a else kw["hidden_states"]).clone()), with_kwargs=True),
                  layer.register_forward_hook(lambda m, a, o, l=l: rec.__setitem__(
                      (l, "out"), (o[0] if isinstance(o, tuple) else o).clone()))]
    probe, chunks = PointProbe(), ChunkProbe()
    spec = CaptureSpec(num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8, seq_len=12, layers=[0, 1, 2],
                       rope_layers=ad.rope_layers(model.config), stats=frozenset({"probs"}), user_stats=(probe, chunks),
                       chunk_elems=4 * 12 * 5)  # chunks of 5 query rows: 3 pieces per layer
    cap = Capture(spec)
    handles = attach(model, ad, cap)
    forward(model, ids, capture=cap)
    for h in handles + hooks:
        h.remove()
    eager = AutoModelForCausalLM.from_pretrained(str(llama_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        att = eager(input_ids=ids, output_attentions=True, use_cache=False).attentions
    B, S, H, Hk, D = 3, 12, 4, 2, 8
    above = torch.ones(S, S, dtype=torch.bool).triu(1)
    for l in range(3):
        p = dict(probe.seen[l], **chunks.seen[l])
        torch.testing.assert_close(p["q_pre"], rec[l, "q"].view(B, S, H, D).transpose(1, 2), rtol=0, atol=1e-5)
        torch.testing.assert_close(p["k_pre"], rec[l, "k"].view(B, S, Hk, D).transpose(1, 2), rtol=0, atol=1e-5)
        torch.testing.assert_close(p["head_out"].reshape(B, S, H * D), rec[l, "o"], rtol=0, atol=1e-5)
        assert torch.equal(p["resid_pre"], rec[l, "in"]) and torch.equal(p["resid_post"], rec[l, "out"])
        torch.testing.assert_close(p["probs"], att[l], rtol=0, atol=1e-6)
        torch.testing.assert_close(p["probs"], torch.softmax(p["scores"], -1), rtol=0, atol=1e-6)
        direct = p["q_post"].double() @ p["k_post"].double().repeat_interleave(2, 1).transpose(-1, -2) / D ** 0.5
        torch.testing.assert_close(p["scores"].double().masked_fill(above, 0), direct.masked_fill(above, 0),
                                   rtol=0, atol=1e-5)
        assert bool(torch.isneginf(p["scores"][..., above]).all())
        assert not torch.allclose(p["q_pre"], p["q_post"])  # RoPE rotated them (position 0 aside)
    assert torch.equal(probe.seen[1]["resid_pre"], probe.seen[0]["resid_post"])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("limit", [1, 7, 40, 200, 10_000])
def test_users_pieces_tile_the_chunk_within_the_limit(causal, limit):
    """Every (sequence, row) of a chunk is in exactly one piece; a piece holds at most ``limit`` values
    unless one row of one sequence is larger; a causal piece's keys end at its last row."""
    from poslens.capture.statistics.builtin.base import Piece
    from poslens.capture.statistics.users import sub_pieces

    H, start, stop, s0, s1 = 3, 8, 14, 1, 4
    keys = stop if causal else 20
    seen = torch.zeros(s1, stop, dtype=torch.int64)
    for r, s, k in sub_pieces(Piece(slice(start, stop), slice(s0, s1), keys, {}), causal, H, limit):
        seen[s, r] += 1
        assert k == (r.stop if causal else keys)
        n = (s.stop - s.start) * H * (r.stop - r.start) * k
        assert n <= limit or (s.stop - s.start == 1 and r.stop - r.start == 1)
    assert bool((seen[s0:, start:] == 1).all()) and int(seen.sum()) == (s1 - s0) * (stop - start)


class PreRopeAndProbs(PointProbe):
    needs = ("q_pre", "k_pre", "probs")


def _qk_scan(llama_dir, monkeypatch, users):
    """A qk+probs scan of 5 sequences (one batch), with or without a user's statistic reading q_pre,
    k_pre and probs: the sizes of the batches Capture.unrotate saw, the capture, the user's statistic."""
    from poslens.capture.model.adapters import get_adapter
    from poslens.capture.engine.capture import Capture
    from poslens.capture.engine.spec import CaptureSpec
    from poslens.capture.model.load import load_model
    from poslens.capture.engine.loop import attach, forward

    model = load_model(str(llama_dir), dtype=torch.float32, device="cpu")
    ad = get_adapter(model.config)
    calls = []
    real = Capture.unrotate
    monkeypatch.setattr(Capture, "unrotate", lambda self, q, k, batch=None: calls.append(q.shape[0]) or real(
        self, q, k, batch=batch))
    probe = PreRopeAndProbs()
    spec = CaptureSpec(num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8, seq_len=16, layers=[0, 1, 2],
                       rope_layers=ad.rope_layers(model.config), stats=frozenset({"qk", "probs"}),
                       user_stats=(probe,) if users else ())
    cap = Capture(spec)
    handles = attach(model, ad, cap)
    forward(model, _ids(5, 16), capture=cap)
    for h in handles:
        h.remove()
    monkeypatch.setattr(Capture, "unrotate", real)
    return calls, cap, probe


def test_one_rotation_and_one_softmax_per_layer_for_users_and_builtins(llama_dir, monkeypatch):
    """A user's q_pre/k_pre and the built-in qk grams come from one un-rotation of the whole batch per
    layer (qk alone un-rotates sequence by sequence), with bit-identical grams either way; the user's
    probs are the softmax the built-in probs map is summed from."""
    calls, alone, _ = _qk_scan(llama_dir, monkeypatch, users=False)
    assert calls == [1] * 15  # 3 layers x 5 sequences
    calls, shared, probe = _qk_scan(llama_dir, monkeypatch, users=True)
    assert calls == [5] * 3  # 3 layers x the whole batch
    for k in ("q_gram", "k_gram"):
        assert torch.equal(shared.accs[k].sum, alone.accs[k].sum), k
    for l in range(3):
        mean = probe.seen[l]["probs"].double().mean(dim=(0, 1))
        torch.testing.assert_close(shared.means()["probs"][l], mean, rtol=0, atol=1e-7)


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------
class AsksForLogits(AttentionEntropy):
    needs = ("logits",)


class AsksForPreRope(AttentionEntropy):
    needs = ("q_pre",)


class NamesProbs(AttentionEntropy):
    def result(self):
        return {"probs": super().result()["entropy"]}


def test_bad_statistics_are_clear_errors_and_write_nothing(llama_dir, tmp_path):
    cases = [([AsksForLogits()], "'logits', which is not a capture point"),
             ([object()], "is not a poslens.Statistic"),
             (["probs", "no_such_package.Entropy"], "neither a built-in statistic nor an importable class"),
             (["probs", "json.JSONDecoder"], "not a poslens.Statistic subclass")]
    for n, (stats, msg) in enumerate(cases):
        out = tmp_path / f"r{n}"
        with pytest.raises(PoslensError, match=msg) as e:
            run_scan(ScanConfig(model_dir=str(llama_dir), out=str(out), stats=stats, **OPTS), progress=False)
        assert "\n" not in str(e.value) and not out.exists()
    gpt2 = archs.save_tiny("gpt2", tmp_path / "gpt2", layers=2, hidden=32)  # learned positions: no RoPE
    with pytest.raises(PoslensError, match="no scanned layer of this model applies RoPE"):
        run_scan(ScanConfig(model_dir=str(gpt2), out=str(tmp_path / "g"), stats=[AsksForPreRope()], **OPTS),
                 progress=False)
    assert not (tmp_path / "g").exists()
    with pytest.raises(PoslensError, match="'probs', which another statistic also writes"):
        run_scan(ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "c"), stats=["probs", NamesProbs()], **OPTS),
                 progress=False)


def test_states_travel_without_pickle_and_come_back_exactly():
    state = {"sum": {0: torch.tensor([1 / 3], dtype=torch.float64), 7: torch.arange(3)}, "rows": {0: 5, "x": 0.1},
             "misc": (None, True, float("inf"), [torch.zeros(2, 2, dtype=torch.bfloat16), "text"])}
    tensors, tree = flatten_state(state, prefix="user.0.")
    assert set(tensors) == {"user.0.0", "user.0.1", "user.0.2"}
    json.dumps(tree)  # the structure is plain JSON
    for back in (unflatten_state(json.loads(json.dumps(tree)), tensors), state_from_bytes(state_bytes(state))):
        assert list(back["sum"]) == [0, 7] and list(back["rows"]) == [0, "x"]  # key types kept
        assert torch.equal(back["sum"][0], state["sum"][0]) and back["sum"][0].dtype == torch.float64
        assert back["rows"] == {0: 5, "x": 0.1} and back["misc"][:3] == (None, True, float("inf"))
        assert back["misc"][3][0].dtype == torch.bfloat16 and back["misc"][3][1] == "text"
    with pytest.raises(PoslensError, match="cannot be saved"):
        flatten_state({"f": lambda: 0})


# --------------------------------------------------------------------------------------------
# SmolLM2
# --------------------------------------------------------------------------------------------
@pytest.mark.real_model
def test_entropy_on_smollm2_equals_eager(tmp_path):
    from poslens.capture.model.source import model_directory
    from poslens.models import realmodels

    p = realmodels.path("smollm2")
    if p is None:
        pytest.skip("real model smollm2 absent: run `python -m poslens models fetch`")
    out = tmp_path / "r"
    run_scan(ScanConfig(model_dir=str(p), out=str(out), data="random", seq_len=48, num_seqs=2, batch_size=2,
                        dtype="fp32", figures=False, stats=["probs", AttentionEntropy()]), progress=False)
    got = read_tensors(out / "maps.safetensors")["entropy"]
    from transformers import AutoConfig

    d = model_directory(str(p))
    V = AutoConfig.from_pretrained(str(d)).vocab_size
    ids = make_source("random", seq_len=48, num_seqs=2, seed=0, vocab_size=V).batch(0, 2)
    want = eager_entropy(d, ids)
    assert got.shape == want.shape == (30, 9)
    # two fp32 softmaxes by different kernels (which a BLAS picks by CPU): 1e-6, absolute or relative
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
