"""Devices are explicit: every tensor factory in the capture and the metrics names its ``device=``.

A tensor made without a device lands on the CPU; on a GPU scan it then meets CUDA data and the
operation fails (``Expected all tensors to be on the same device``) on the first CUDA run only,
since the suite runs on the CPU. The rule is read from the source with :mod:`ast`, so it holds on
a machine without a GPU: a call ``torch.<factory>(...)`` (``arange``, ``zeros``, ``ones``,
``full``, ``linspace``, ...) passes ``device=`` (``device="cpu"`` written out for a tensor that is
meant to stay in host memory), or ``**kw`` where ``kw`` is a dict literal or ``dict(...)`` call of
the same file that has a ``device`` key. ``*_like`` factories and ``x.new_*`` take their data's
device and need nothing.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "poslens"
#: the packages the rule covers: everything on a scan's path from the attention call to the metrics
CHECKED = ("capture", "metrics")
#: ``torch.<name>(...)`` calls that make a tensor on the default (CPU) device unless told otherwise
FACTORIES = frozenset({"arange", "zeros", "ones", "full", "linspace", "logspace", "tensor", "eye", "empty",
                       "empty_strided", "tril_indices", "triu_indices", "rand", "randn", "randint", "randperm"})
#: Files (a trailing ``/``: a folder) that are being rewritten: their violations are reported as a
#: warning, not failed. An entry leaves this list when its files name every device; the warning
#: names the entries that have no violation left.
PENDING: tuple[str, ...] = ()


def _splat_names_with_device(tree: ast.AST) -> set[str]:
    """Names bound in the file to a dict literal or ``dict(...)`` call that has a ``device`` key."""
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        v = node.value
        has = (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict"
               and any(kw.arg == "device" for kw in v.keywords)) or (
            isinstance(v, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "device" for k in v.keys))
        if has:
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def violations(path: Path) -> list[str]:
    """``"name:line"`` for every factory call in ``path`` that names no device."""
    tree = ast.parse(path.read_text(), str(path))
    with_device = _splat_names_with_device(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and node.func.attr in FACTORIES):
            continue
        named = any(kw.arg == "device" or (kw.arg is None and isinstance(kw.value, ast.Name)
                                           and kw.value.id in with_device) for kw in node.keywords)
        if not named:
            out.append(f"torch.{node.func.attr}:{node.lineno}")
    return sorted(out, key=lambda s: int(s.rpartition(":")[2]))


def checked_files() -> dict[str, Path]:
    return {p.relative_to(PKG.parent.parent).as_posix(): p for pkg in CHECKED for p in sorted((PKG / pkg).rglob("*.py"))}


def is_pending(rel: str) -> bool:
    return any(rel == e or (e.endswith("/") and rel.startswith(e)) for e in PENDING)


def test_every_tensor_factory_names_its_device():
    found = {rel: violations(p) for rel, p in checked_files().items()}
    bad = {rel: v for rel, v in found.items() if v and not is_pending(rel)}
    assert not bad, ("tensor factories without device= (pass the device of the data they meet, or "
                     f'device="cpu" for a host-only tensor): {bad}')
    pending = {rel: v for rel, v in found.items() if v and is_pending(rel)}
    clean = [e for e in PENDING if not any(rel == e or (e.endswith("/") and rel.startswith(e)) for rel in pending)]
    if pending or clean:
        warnings.warn(f"device rule, pending files: {pending}; pending entries with no violation left "
                      f"(remove them from PENDING): {clean}", stacklevel=1)


def test_the_check_catches_a_factory_without_device(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import torch\nkw = dict(dtype=torch.float32, device='cpu')\nbare = {'dtype': 1}\n"
                   "def f(x):\n    a = torch.arange(3)\n    b = torch.zeros(2, device=x.device)\n"
                   "    c = torch.empty(2, **kw)\n    d = torch.full((2,), 1.0, **bare)\n"
                   "    e = torch.zeros_like(x)\n    g = x.new_zeros(2)\n    return torch.tensor([1.0], device='cpu')\n")
    assert violations(src) == ["torch.arange:5", "torch.full:8"]
