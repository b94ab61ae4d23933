"""The backend seam: every backend (torch, the C kernels, Triton under its interpreter) gives the same
statistics, equal to the readable reference; a new built-in statistic added as the docs describe
(its module and one registry line) runs on each of them; the choice is made in one place, checked,
and recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import archs
import pytest
import torch

from poslens import native
from poslens.capture.backends import choice as backends
from poslens.errors import PoslensError

S, B = 24, 4

#: a per-head statistic written as docs/statistics.md describes: one module ...
PREV_TOKEN = '''
"""``prev_token``: each head's mean attention weight on the previous token, ``A_h[i, i - 1]`` over
queries ``i >= 1`` and sequences."""

from poslens.capture.statistics.builtin.base import BuiltinStatistic


class PrevToken(BuiltinStatistic):
    name = "prev_token"
    accumulators = ("prev_token",)
    needs = frozenset({"diagonal_sums"})

    def shapes(self, spec):
        return {"prev_token": (len(spec.layers), spec.num_heads)}

    def begin_layer(self, batch, maps):
        maps.zeros("prev_token", batch.query.shape[1])

    def add(self, batch, piece):
        d = piece["diagonal_sums"]
        if d.shape[1] > 1:
            batch.maps["prev_token"] += d[:, 1]

    def end_layer(self, batch, maps):
        S = batch.query.shape[2]
        batch.capture.accs["prev_token"].sum[batch.li] += maps["prev_token"].double() / (S - 1)


STATISTIC = PrevToken()
'''

#: ... and one line in the registry; then a scan on the given backend, its means written to a file
SCRIPT = '''
import json, sys
import torch
from safetensors.torch import save_file
sys.path.insert(0, sys.argv[1])
import prev_token
import poslens.capture.statistics.builtin as builtin
builtin.REGISTRY = builtin.REGISTRY + (prev_token.STATISTIC,)

from poslens.capture.model.adapters import get_adapter
from poslens.capture.engine.capture import Capture
from poslens.capture.model.load import load_model
from poslens.capture.engine.loop import attach, forward
from poslens.capture.engine.spec import CaptureSpec
from transformers import AutoConfig

path, ids, out = sys.argv[2], torch.load(sys.argv[3]), sys.argv[4]
config = AutoConfig.from_pretrained(path)
ad = get_adapter(config)
L = ad.num_layers(config)
spec = CaptureSpec(num_layers=L, num_heads=ad.num_heads(config), num_kv_heads=ad.num_kv_heads(config),
                   head_dim=ad.head_dim(config), seq_len=ids.shape[1], layers=list(range(L)),
                   rope_layers=ad.rope_layers(config), heads=[(0, 1), (1, 2)] if sys.argv[5] == "heads" else [],
                   stats=frozenset({"prev_token", "scores", "probs", "slash"}), reservoir=0, chunk_elems=2 * 4 * 24 * 5)
model = load_model(path, dtype=torch.float32, device="cpu")
cap = Capture(spec)
handles = attach(model, ad, cap)
for s in range(0, ids.shape[0], 2):
    forward(model, ids[s:s + 2], capture=cap, seq_start=s)
save_file({k: v.contiguous() for k, v in cap.means().items() if k != "score_groups"}, out)
print(json.dumps({str(l): b for l, (b, _) in cap.backends.items()}))
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("backends")
    path = archs.save_tiny("llama", root / "m")  # 4 heads of dimension 16, 2 key heads
    ids = torch.randint(3, archs.V, (B, S), generator=torch.Generator().manual_seed(3))
    torch.save(ids, root / "ids.pt")
    (root / "prev_token.py").write_text(textwrap.dedent(PREV_TOKEN))
    (root / "run.py").write_text(SCRIPT)
    return root, path, ids


_SCANS: dict = {}


def _scan(setup, kernel, extra_env=None, heads=False):
    """The scan's means and the backend of each layer, once per (kernel, heads) in this module."""
    key = (kernel, heads)
    if key not in _SCANS:
        _SCANS[key] = _run_scan(setup, kernel, extra_env, heads)
    return _SCANS[key]


def _run_scan(setup, kernel, extra_env, heads):
    from safetensors.torch import load_file

    root, path, _ = setup
    out = root / f"{kernel}.safetensors"
    env = dict(os.environ, POSLENS_CAPTURE_KERNEL=kernel, **(extra_env or {}))
    proc = subprocess.run([sys.executable, str(root / "run.py"), str(root), str(path), str(root / "ids.pt"), str(out),
                           "heads" if heads else "-"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_file(str(out)), json.loads(proc.stdout.strip().splitlines()[-1])


def _reference(path, ids):
    """prev_token, probs and slash from the eager float64 record of the same forward."""
    from poslens.capture.statistics.reference import record_forward

    rec = record_forward(path, ids)
    prev, probs, slash = [], [], []
    for l in sorted(rec["layers"]):
        r = rec["layers"][l]
        q, k = r["q"], r["k"]
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        logits = (q @ k.transpose(-1, -2)) * r["scaling"]
        w = torch.softmax(logits.masked_fill(~r["visible"], float("-inf")), -1)  # [B, H, S, S]
        prev.append(torch.diagonal(w, -1, 2, 3).mean(dim=(0, 2)))
        probs.append(w.mean(dim=(0, 1)))
        slash.append(torch.stack([torch.diagonal(w, -d, 2, 3).sum(-1).mean(0) / (S - d) for d in range(S)], -1))
    return {"prev_token": torch.stack(prev), "probs": torch.stack(probs), "slash": torch.stack(slash)}


BACKENDS = [
    pytest.param("torch", {}, "torch", id="torch"),
    pytest.param("auto", {}, "native", id="native",
                 marks=pytest.mark.skipif(not native.available(), reason="the C kernels are not built here")),
    pytest.param("triton", {"TRITON_INTERPRET": "1"}, "triton", id="triton-interpreter",
                 marks=pytest.mark.skipif(not backends.cuda_maps._triton(), reason="triton is not installed")),
]


@pytest.mark.parametrize("kernel,env,expect", BACKENDS)
def test_a_new_statistic_runs_on_every_backend_and_equals_the_reference(setup, kernel, env, expect):
    root, path, ids = setup
    got, used = _scan(setup, kernel, env)
    assert set(used.values()) == {expect}, used  # the backend asked for took every layer
    ref = _reference(path, ids)
    for name in ("prev_token", "probs", "slash"):
        torch.testing.assert_close(got[name].double(), ref[name], rtol=0, atol=2e-6, msg=f"{expect} {name}")
    assert got["prev_token"].shape == (2, 4)


def test_backends_agree_on_every_map(setup):
    """Scores, weights, slash, sink and the new statistic: the torch pass and each fast backend to
    float32 rounding (the per-head maps: tests/capture/test_cuda_maps.py, under the interpreter)."""
    base, _ = _scan(setup, "torch")
    others = [("auto", {})] if native.available() else []
    if backends.cuda_maps._triton():
        others.append(("triton", {"TRITON_INTERPRET": "1"}))
    if not others:
        pytest.skip("neither the C kernels nor triton are available here")
    for kernel, env in others:
        got, used = _scan(setup, kernel, env)
        assert set(got) == set(base) and "torch" not in set(used.values())
        for name in base:
            torch.testing.assert_close(got[name], base[name], rtol=1e-5, atol=1e-5, msg=f"{kernel} {name}")


def test_the_kernel_setting_takes_only_its_documented_values(monkeypatch):
    from poslens.capture.engine.capture import Capture
    from poslens.capture.engine.spec import CaptureSpec

    for value in backends.KERNEL_VALUES:
        monkeypatch.setenv(native.KERNEL_ENV, value)
        assert backends.kernel_setting() == value
    monkeypatch.setenv(native.KERNEL_ENV, "garbage")
    with pytest.raises(PoslensError) as e:
        Capture(CaptureSpec(num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4, seq_len=8, layers=[0]))
    assert "POSLENS_CAPTURE_KERNEL" in str(e.value) and "garbage" in str(e.value) and "\n" not in str(e.value)


def test_the_choice_and_its_reason():
    q = torch.zeros(1, 4, 8, 16)
    k = torch.zeros(1, 2, 8, 16)
    sums = frozenset({"logit_sum", "weight_sum"})
    name, why = backends.choose(q, k, sums, window=None, softcap=None)
    assert name == (backends.NATIVE if native.available() else backends.TORCH) and why
    assert backends.choose(q, k, sums, window=4, softcap=None)[0] == backends.TORCH  # C kernels: no windows
    assert backends.choose(q, k, sums | {"scores"}, window=None, softcap=None)[0] == backends.TORCH
    name, why = backends.choose(q.double(), k.double(), sums, window=None, softcap=None)
    assert name == backends.TORCH and "float64" in why


def test_a_scan_records_its_backend(tmp_path, cli):
    """config.json names the backend a scan takes, summary.json which layers each backend computed,
    `poslens scan` prints it (not under --quiet) and the Result shows it."""
    import poslens

    path = archs.save_tiny("llama", tmp_path / "m")
    ids = torch.randint(3, archs.V, (2, 16), generator=torch.Generator().manual_seed(1))
    r = poslens.scan(str(path), data=ids, stats="scores,probs", progress=False)
    want = backends.NATIVE if native.available() else backends.TORCH
    assert r.config["capture_backend"]["backend"] == want and r.config["capture_backend"]["reason"]
    assert r.summary["capture_backends"][want]["layers"] == [0, 1]
    assert want in backends.used_line(r.summary["capture_backends"])
    assert r.backends[want]["layers"] == [0, 1] and f"backend {want}" in repr(r)
    code, out, err = cli("scan", path, "--out", tmp_path / "run", "--data", "random", "--seq-len", 16, "--num-seqs", 2,
                         "--no-figures")
    assert code == 0, err
    assert f"capture backend: {want}" in out
    code, out, _ = cli("scan", path, "--out", tmp_path / "quiet", "--data", "random", "--seq-len", 16, "--num-seqs", 2,
                       "--no-figures", "--quiet")
    assert code == 0 and "capture backend" not in out


@pytest.mark.skipif(not native.available(), reason="the C kernels are not built here")
def test_a_non_finite_logit_under_a_users_chunks_is_one_error():
    """The C pass stops at a non-finite visible logit; a user's statistic has been handed the chunks
    before it, so the layer is not redone (it would hand them twice): one error names the layer."""
    import poslens
    from poslens.capture.engine.capture import Capture
    from poslens.capture.engine.spec import CaptureSpec

    class Rows(poslens.Statistic):
        needs = ("probs",)

        def __init__(self):
            self.rows = 0

        def add(self, layer, probs):
            self.rows += probs.shape[2]

    stat = Rows()
    B, H, S, D = 1, 2, 300, 8
    cap = Capture(CaptureSpec(num_layers=1, num_heads=H, num_kv_heads=H, head_dim=D, seq_len=S, layers=[0],
                              stats=frozenset({"probs"}), user_stats=(stat,)))
    q, k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    q[0, 1, 250, 0] = float("inf")  # a row of the last chunk: the earlier chunks reach the statistic first
    cap.begin_batch(B)
    with pytest.raises(PoslensError, match="layer 0"):
        cap.observe_attention(0, q, k, None, 0.3, value=v)
    assert 0 < stat.rows < S
