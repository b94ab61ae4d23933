"""Statistics as objects: what a scan computes from the tensors it captures, written by anyone.

A :class:`Statistic` names the capture points it needs (:data:`poslens.capture.statistics.points.CAPTURE_POINTS`),
takes them piece by piece (``add(layer, **points)``), merges with another of its kind, saves and loads its state (so
a killed scan resumes bit for bit) and returns named result tensors, which the scan stores in
``maps.safetensors`` beside the built-in maps. A statistic of ``scores`` or ``probs`` gets them as
the built-in statistics do, a chunk of query rows at a time (:mod:`poslens.capture.statistics.users`), so its
memory stays at a chunk at any sequence length; any other gets one call per layer and batch::

    class AttentionEntropy(poslens.Statistic):
        needs = ("probs",)
        def __init__(self):
            self.sum, self.rows = {}, {}
        def add(self, layer, probs):               # [batch, heads, rows, keys]: a chunk of query rows
            ...
        def merge(self, other): ...
        def state_dict(self): return {"sum": self.sum, "rows": self.rows}
        def load_state_dict(self, state): self.sum, self.rows = state["sum"], state["rows"]
        def result(self): return {"entropy": ...}

    poslens.scan(model, data=ids, stats=["probs", AttentionEntropy()])

A state is a tree of dicts (any JSON key: str, int, float, bool), lists and tuples whose leaves
are tensors, numbers, strings or None. It is stored without pickle: the tensors in a flat key
space of the checkpoint's safetensors file, the tree around them as JSON (:func:`flatten_state`).
A statistic named by its qualified class name (``"package.module.Class"``: the form
``config.json`` records, and what ``poslens scan --stats`` and ``torchrun`` take) is imported and
built with no arguments.
"""

from __future__ import annotations

import copy
import importlib
import json
from typing import Any

import torch

from poslens.capture.statistics.points import CAPTURE_POINTS, PASS_POINTS, RESIDUAL_POINTS, WHERE_POINTS
from poslens.errors import PoslensError


class Statistic:
    """A statistic of captured tensors, accumulated over a scan (baukit ``runningstats`` style).

    Subclasses set ``needs`` (names of :data:`~poslens.capture.statistics.points.CAPTURE_POINTS`) and implement
    :meth:`add`, :meth:`merge`, :meth:`state_dict`, :meth:`load_state_dict` and :meth:`result`. ``add`` is
    called with the model's decoder-layer index and one keyword argument per needed point: once per
    captured layer and batch, or, for a statistic of ``scores``/``probs``, once per chunk of query
    rows (and of sequences) of the layer. The default :meth:`all_reduce` merges the states of every rank.
    """

    needs: tuple[str, ...] = ()

    def add(self, layer: int, **points: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__}.add(layer, **points)")

    def merge(self, other: "Statistic") -> None:
        raise NotImplementedError(f"{type(self).__name__}.merge(other)")

    def state_dict(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__}.state_dict()")

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError(f"{type(self).__name__}.load_state_dict(state)")

    def result(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__}.result()")

    def all_reduce(self, group=None) -> None:
        """Make this statistic the merge of every rank's (torch.distributed), in rank order on
        every rank: rank 0's state, merged with rank 1's, then rank 2's... Each state travels as its
        safetensors bytes (:func:`state_bytes`), never pickled."""
        import torch.distributed as dist

        world = dist.get_world_size(group)
        dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
        mine = torch.frombuffer(bytearray(state_bytes(self.state_dict())), dtype=torch.uint8).to(dev)
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64, device=dev), group=group)
        n = int(max(int(s) for s in sizes))
        padded = torch.zeros(n, dtype=torch.uint8, device=dev)
        padded[:mine.numel()] = mine
        parts = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(world)]
        dist.all_gather(parts, padded, group=group)
        states = [state_from_bytes(p[:int(s)].cpu().numpy().tobytes()) for p, s in zip(parts, sizes)]
        merged = copy.deepcopy(self)
        merged.load_state_dict(states[0])
        for st in states[1:]:
            other = copy.deepcopy(self)
            other.load_state_dict(st)
            merged.merge(other)
        self.load_state_dict(merged.state_dict())


# --------------------------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------------------------
def qualified_name(stat) -> str:
    """``"module.Class"`` of a statistic (or its class): what config.json records."""
    cls = stat if isinstance(stat, type) else type(stat)
    return f"{cls.__module__}.{cls.__qualname__}"


def resolve_statistic(name: str) -> Statistic:
    """A statistic built from its qualified class name ``"package.module.Class"`` (no arguments)."""
    parts = name.split(".")
    obj, err = None, None
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError as e:
            err = err or e
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            obj = None
        break
    if obj is None:
        why = f" ({type(err).__name__}: {err})" if err is not None else ""
        raise PoslensError(f"--stats {name}: neither a built-in statistic nor an importable class{why}; give a "
                           "built-in name or the qualified name of a poslens.Statistic subclass (package.module.Class) "
                           "on the Python path.")
    if not (isinstance(obj, type) and issubclass(obj, Statistic)):
        raise PoslensError(f"--stats {name}: {obj!r} is not a poslens.Statistic subclass.")
    try:
        return obj()
    except TypeError as e:
        raise PoslensError(f"--stats {name}: the statistic cannot be built without arguments ({e}); pass an "
                           "instance from Python instead.") from None


def check_needs(stat, rope: bool) -> None:
    """Refuse a statistic that is not a :class:`Statistic` or asks for a point this model cannot give
    (``rope``: whether any captured layer applies RoPE, so that pre-RoPE q/k exist)."""
    name = qualified_name(stat)
    if not isinstance(stat, Statistic):
        raise PoslensError(f"stats: {name} is not a poslens.Statistic; subclass poslens.Statistic and implement "
                           "add, merge, state_dict, load_state_dict and result.")
    needs = tuple(stat.needs) if not isinstance(stat.needs, str) else (stat.needs,)
    if not needs:
        raise PoslensError(f"stats: {name}.needs is empty; name the capture points it reads "
                           f"({', '.join(CAPTURE_POINTS)}).")
    bad = [p for p in needs if p not in CAPTURE_POINTS]
    if bad:
        raise PoslensError(f"stats: {name} needs {', '.join(map(repr, bad))}, which is not a capture point; "
                           f"choose from {', '.join(CAPTURE_POINTS)}.")
    if set(needs) & set(WHERE_POINTS) and not set(needs) & set(PASS_POINTS):
        raise PoslensError(f"stats: {name} needs rows/seqs, which only a statistic of scores or probs gets "
                           "(it is fed chunk by chunk); drop them or add scores/probs.")
    mixed = set(needs) & set(RESIDUAL_POINTS)
    if mixed and set(needs) & set(PASS_POINTS):
        raise PoslensError(f"stats: {name} needs scores/probs (given chunk by chunk) and {', '.join(sorted(mixed))} "
                           "(given once per layer); split it into two statistics.")
    if not rope and any(p in ("q_pre", "k_pre") for p in needs):
        raise PoslensError(f"stats: {name} needs pre-RoPE queries/keys, but no scanned layer of this model applies "
                           "RoPE (its positions are learned or absent); ask for q_post/k_post instead.")


# --------------------------------------------------------------------------------------------
# state <-> safetensors (flat tensor keys + a JSON tree)
# --------------------------------------------------------------------------------------------
def flatten_state(state: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """``(tensors, tree)``: the tensors of a state under flat keys ``prefix + "0"``, ``prefix + "1"``...
    and the state's structure as JSON-able values, each tensor replaced by ``{"tensor": key}``.

    Dicts become ``{"dict": [[key, value], ...]}`` (keys keep their type: an int layer index stays an
    int), tuples ``{"tuple": [...]}``; numbers, strings, booleans and None stay themselves (Python's
    JSON writes a float's shortest round-tripping repr, so a float comes back bit for bit)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(x):
        if isinstance(x, torch.Tensor):
            key = f"{prefix}{len(tensors)}"
            tensors[key] = x.detach()
            return {"tensor": key}
        if isinstance(x, dict):
            for k in x:
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    raise PoslensError(f"state_dict: key {k!r} of type {type(k).__name__} cannot be saved; use "
                                       "str, int, float or bool keys.")
            return {"dict": [[k, walk(v)] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {"tuple": [walk(v) for v in x]}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise PoslensError(f"state_dict: a value of type {type(x).__name__} cannot be saved; a state holds "
                           "tensors, numbers, strings, None, and dicts, lists or tuples of them.")

    return tensors, walk(state)


def unflatten_state(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The state :func:`flatten_state` took apart."""
    if isinstance(tree, list):
        return [unflatten_state(v, tensors) for v in tree]
    if isinstance(tree, dict):
        if "tensor" in tree:
            return tensors[tree["tensor"]]
        if "tuple" in tree:
            return tuple(unflatten_state(v, tensors) for v in tree["tuple"])
        return {k: unflatten_state(v, tensors) for k, v in tree["dict"]}
    return tree


def state_bytes(state: Any) -> bytes:
    """A state as the bytes of one safetensors file (tensors + the JSON tree in its metadata)."""
    from safetensors.torch import save

    tensors, tree = flatten_state(state)
    return save({k: v.cpu().contiguous() for k, v in tensors.items()}, metadata={"tree": json.dumps(tree)})


def state_from_bytes(data: bytes) -> Any:
    """The state :func:`state_bytes` wrote."""
    from safetensors.torch import load

    tensors = load(data)
    n = int.from_bytes(data[:8], "little")  # the header (its __metadata__ holds the tree): 8-byte length, JSON
    meta = json.loads(data[8:8 + n].decode()).get("__metadata__", {})
    return unflatten_state(json.loads(meta["tree"]), tensors)
