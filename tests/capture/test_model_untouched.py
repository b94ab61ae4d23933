"""A loaded model handed to poslens comes back as it was: no module's ``forward`` replaced, no attribute
left on a module, no hook left registered, the config as it was.

Every module's ``__dict__`` is snapshot before a call and compared after it: the same keys, the same
objects (tensors: the same values), and the hook and submodule dicts (``_forward_hooks``,
``_forward_pre_hooks``, ``_parameters``, ...) holding what they held before. The calls: a scan with a
user's statistic on the q/k capture points, q/k capture-point hooks (:func:`hook_point`), an ablate with
layer-at-a-time conditions (the earlier layers replayed) and a neighbourhood run with the
bidirectional control.
"""

from __future__ import annotations

import archs
import pytest
import torch

import poslens
from poslens.capture.engine.loop import forward, hooked
from poslens.capture.statistics.points import QK_POINTS
from poslens.capture.model.adapters import get_adapter
from poslens.capture.model.borrow import borrowed

S, N = 16, 4


class QKNorms(poslens.Statistic):
    """Sum of the squared pre- and post-RoPE queries and keys, per layer (reads every q/k capture point)."""
    needs = QK_POINTS

    def __init__(self):
        self.sums = {}

    def add(self, layer, **points):
        self.sums[layer] = self.sums.get(layer, 0) + sum(float(x.double().square().sum()) for x in points.values())

    def merge(self, other):
        for l, v in other.sums.items():
            self.sums[l] = self.sums.get(l, 0) + v

    def state_dict(self):
        return {"sums": self.sums}

    def load_state_dict(self, state):
        self.sums = state["sums"]

    def result(self):
        return {"qk_norms": torch.tensor([self.sums[l] for l in sorted(self.sums)], dtype=torch.float64)}


class Watch:
    """A user's own forward pre-hook on every module: each call must find the module's class ``forward``
    (none set on the instance) and the hook itself must still be there after poslens' call."""

    def __init__(self, model):
        self.classes = {m: type(m) for m in model.modules()}
        self.calls, self.patched = 0, []
        self.handles = [m.register_forward_pre_hook(self._check) for m in model.modules()]

    def _check(self, m, _args):
        self.calls += 1
        if "forward" in m.__dict__ or type(m) is not self.classes[m]:
            self.patched.append(type(m).__name__)

    def close(self):
        for h in self.handles:
            h.remove()


@pytest.fixture
def model():
    """A tiny Llama as a user loads it (transformers' own attention, eval mode), q/k far from uniform."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(archs.tiny_config("llama", layers=3, hidden=32))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj")) and p.ndim == 2:
                p.mul_(8.0)
    m.eval()
    with torch.no_grad():  # a first forward: whatever transformers sets up lazily is there before the snapshot
        m(input_ids=_ids(), use_cache=False)
    return m


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, archs.V, (N, S), generator=torch.Generator().manual_seed(seed))


def _value(v):
    """What is compared of one ``__dict__`` entry: a dict's entries, a tensor's values, else the object."""
    if isinstance(v, dict):
        return ("dict", type(v), {k: _value(x) for k, x in v.items()})
    if isinstance(v, torch.Tensor):
        return ("tensor", v, v.detach().clone())
    return ("object", v)


def _same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "dict":
        return a[1] is b[1] and a[2].keys() == b[2].keys() and all(_same(a[2][k], b[2][k]) for k in a[2])
    if a[0] == "tensor":
        return a[1] is b[1] and a[2].dtype == b[2].dtype and torch.equal(a[2], b[2])
    return a[1] is b[1]


def snapshot(model) -> dict:
    """``{(module name, key): compared value}`` over every module's ``__dict__``, and the config's entries."""
    snap = {(name, key): _value(v) for name, m in model.named_modules() for key, v in m.__dict__.items()}
    snap.update({("<config>", key): ("config", v) for key, v in model.config.__dict__.items()})
    return snap


def changes(before: dict, after: dict) -> list:
    """The entries added, removed or changed between two snapshots."""
    out = [("added", k) for k in after.keys() - before.keys()] + [("removed", k) for k in before.keys() - after.keys()]
    for k in before.keys() & after.keys():
        b, a = before[k], after[k]
        if (b[1] != a[1]) if b[0] == "config" else not _same(b, a):
            out.append(("changed", k))
    return sorted(out)


def _logits(model):
    with torch.no_grad():
        return model(input_ids=_ids(1), use_cache=False).logits


def test_scan_with_qk_capture_points_leaves_the_model_as_it_was(model):
    watch = Watch(model)
    impl, before, logits = model.config._attn_implementation, snapshot(model), _logits(model)
    r = poslens.scan(model, data=_ids(), stats=["qk", QKNorms()], seq_len=S, batch_size=2, progress=False,
                     figures=False, threads=None)
    assert r.maps["qk_norms"].shape == (3,) and bool((r.maps["qk_norms"] > 0).all())
    assert changes(before, snapshot(model)) == []
    assert watch.calls > 0 and watch.patched == []
    watch.close()
    assert model.config._attn_implementation == impl != "poslens"
    assert torch.equal(_logits(model), logits)


def test_qk_hook_points_leave_no_attribute_behind(model):
    ad = get_adapter(model.config)
    watch = Watch(model)
    before = snapshot(model)
    got = {}
    points = {(p, l): (lambda x, key=(p, l): got.__setitem__(key, x.clone())) for p in QK_POINTS for l in range(3)}
    with borrowed(model):
        mid = snapshot(model)  # the poslens attention switched on: hooks are all that differ inside the block
        with hooked(model, ad, points):
            forward(model, _ids())
            forward(model, _ids(2))
        assert changes(mid, snapshot(model)) == []
    assert set(got) == set(points) and got[("q_pre", 0)].shape == (N, 4, S, 8)
    assert not torch.equal(got[("q_pre", 1)], got[("q_post", 1)])  # RoPE rotated them
    assert changes(before, snapshot(model)) == []
    assert watch.calls > 0 and watch.patched == []
    watch.close()


def test_ablate_with_replayed_layers_leaves_the_model_as_it_was(model):
    watch = Watch(model)
    impl, before, logits = model.config._attn_implementation, snapshot(model), _logits(model)
    r = poslens.ablate(model, ["rope-off", "sink-off", "massive-qk"], layers="each", data=_ids(), progress=False,
                       threads=None)
    assert r.summary["replayed_prefix"] is True
    assert changes(before, snapshot(model)) == []
    assert watch.calls > 0 and watch.patched == []
    watch.close()
    assert model.config._attn_implementation == impl
    assert torch.equal(_logits(model), logits)


def test_neighborhood_with_the_bidirectional_control_leaves_the_model_as_it_was(model):
    watch = Watch(model)
    impl, before, logits = model.config._attn_implementation, snapshot(model), _logits(model)
    r = poslens.neighborhood(model, data="random", seq_len=S, num_seqs=N, batch_size=2, bidirectional=True,
                             progress=False, figures=False, threads=None)
    assert r.summary["layers"][1]["bidirectional_aps_mean"] is not None
    assert changes(before, snapshot(model)) == []
    assert watch.calls > 0 and watch.patched == []
    watch.close()
    assert model.config._attn_implementation == impl
    assert torch.equal(_logits(model), logits)
