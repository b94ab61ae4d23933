"""The package layout as a checkable contract: no import cycle between poslens modules,
the library never imports the CLI, and the CLI starts without torch, transformers or matplotlib.

The import graph is read from the source with :mod:`ast` (every import statement, at module top or
inside a function: a cycle hidden in a function-local import is still a cycle)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "poslens"
#: the CLI package (the typer app and one module per command group) and `python -m poslens`.
CLI = ("poslens.cli", "poslens.__main__")
HEAVY = ("torch", "transformers", "matplotlib")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(name: str, known: set[str]) -> str | None:
    """The poslens module that ``name`` denotes: itself, or its longest known prefix (an attribute)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


#: modules allowed an ``importlib.import_module`` call whose module name is not written in the source:
#: the users' statistics, named by their qualified class names (never a poslens module)
DYNAMIC_IMPORTS = {"poslens.capture.statistics.protocol"}


def _str_values(tree: ast.AST, name: str) -> list[str]:
    """The string values of the module-level dict literal ``name`` (e.g. a lazy-import table)."""
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return [v.value for v in node.value.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def dynamic_imports(path: Path) -> list[tuple[list[str] | None, int]]:
    """``importlib.import_module(...)`` calls: ``(the module names it can import, line)``; ``None`` where
    the name is not in the source (neither a string nor a subscript of a module-level dict of strings)."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module" and node.args):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.append(([arg.value], node.lineno))
        elif isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name) and _str_values(tree, arg.value.id):
            out.append((_str_values(tree, arg.value.id), node.lineno))
        else:
            out.append((None, node.lineno))
    return out


def imports_of(mod: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """``(imported poslens module, line)`` for every import statement in the file, and for every
    ``importlib.import_module`` call whose module name the source holds."""
    is_pkg = path.name == "__init__.py"
    out = []
    for names, line in dynamic_imports(path):
        for n in names or []:
            target = _resolve(n, known) if n == "poslens" or n.startswith("poslens.") else None
            if target and target != mod:
                out.append((target, line))
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from pkg import sub` imports the submodule when there is one, else an attribute of pkg
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        else:
            continue
        for n in names:
            target = _resolve(n, known) if n == "poslens" or n.startswith("poslens.") else None
            if not target or target == mod:
                continue
            out.append((target, node.lineno))
            # importing poslens.a.b first runs poslens/a/__init__.py: a dependency too (a cycle through a
            # package's __init__ fails at import time), except for the importer's own packages
            parts = target.split(".")
            for k in range(2, len(parts)):
                pkg = ".".join(parts[:k])
                if pkg in known and not (mod == pkg or mod.startswith(pkg + ".")):
                    out.append((pkg, node.lineno))
    return out


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    where: dict[tuple[str, str], int] = {}
    for m, p in mods.items():
        for t, line in imports_of(m, p, known):
            graph[m].add(t)
            where.setdefault((m, t), line)
    return graph, where


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def is_cli(mod: str) -> bool:
    return any(mod == c or mod.startswith(c + ".") for c in CLI)


# ---------------------------------------------------------------------------------------------
# the checker itself, on known graphs
# ---------------------------------------------------------------------------------------------
def test_cycle_finder_on_known_graphs():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    two = cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}, "e": {"a", "c"}})
    assert sorted(two) == [["a", "b"], ["c", "d"]]


def test_import_reader_sees_local_relative_and_submodule_imports(tmp_path):
    known = {"poslens", "poslens.a", "poslens.pkg", "poslens.pkg.sub", "poslens.pkg.other"}
    f = tmp_path / "other.py"
    f.write_text("import os\nfrom poslens.a import thing\n\ndef f():\n    from poslens.pkg import sub\n"
                 "    from . import sub as s2\n    import poslens.pkg.sub.deeper\n")
    got = sorted({t for t, _ in imports_of("poslens.pkg.other", f, known)})
    assert got == ["poslens.a", "poslens.pkg.sub"]  # its own package's __init__ is not an edge
    g = tmp_path / "a.py"
    g.write_text("from poslens.pkg.sub import thing\n")
    assert sorted({t for t, _ in imports_of("poslens.a", g, known)}) == ["poslens.pkg", "poslens.pkg.sub"]


def test_import_reader_sees_importlib(tmp_path):
    known = {"poslens", "poslens.a", "poslens.b", "poslens.c"}
    f = tmp_path / "x.py"
    f.write_text("import importlib\n_API = {'f': 'poslens.b', 'g': 'poslens.c'}\n"
                 "def f(name):\n    importlib.import_module('poslens.a')\n    return importlib.import_module(_API[name])\n"
                 "def g(name):\n    return importlib.import_module(name)\n")
    assert sorted({t for t, _ in imports_of("poslens.x", f, known)}) == ["poslens.a", "poslens.b", "poslens.c"]
    assert [n for n, _ in dynamic_imports(f)] == [["poslens.a"], ["poslens.b", "poslens.c"], None]


# ---------------------------------------------------------------------------------------------
# the contract on the real source tree
# ---------------------------------------------------------------------------------------------
def test_every_dynamic_import_names_its_module():
    """An import the checker cannot read would hide a cycle: every ``importlib.import_module`` in the
    library names its module in the source, except where users' own classes are imported."""
    bad = [f"{m} line {line}" for m, p in modules().items() if m not in DYNAMIC_IMPORTS
           for names, line in dynamic_imports(p) if names is None]
    assert not bad, "importlib.import_module of a name the source does not hold:\n" + "\n".join(bad)


def test_graph_is_read():
    graph, _ = import_graph()
    assert len(graph) > 40
    assert "poslens.errors" in graph["poslens.rundir.io"] and "poslens.rundir.io" in graph["poslens.rundir.load"]


def test_no_import_cycle():
    graph, where = import_graph()
    found = cycles(graph)
    detail = []
    for comp in found:
        s = set(comp)
        detail += [f"{a} -> {b} (line {where[(a, b)]})" for a in comp for b in sorted(graph[a] & s)]
    assert not found, "import cycles between poslens modules:\n" + "\n".join(detail)


def test_library_never_imports_the_cli():
    graph, where = import_graph()
    bad = [f"{m} imports {t} (line {where[(m, t)]})" for m, ts in graph.items() if not is_cli(m)
           for t in sorted(ts) if is_cli(t)]
    assert not bad, "library modules import the CLI:\n" + "\n".join(bad)


def test_cli_starts_without_heavy_modules_and_fast():
    code = ("import sys, time; t = time.perf_counter(); import poslens.cli; dt = time.perf_counter() - t; "
            f"print(dt, *[m for m in {HEAVY!r} if m in sys.modules])")
    env_src = {"PYTHONPATH": str(SRC)}
    import os

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env_src},
                       timeout=120)
    assert r.returncode == 0, r.stderr
    dt, *heavy = r.stdout.split()
    assert heavy == [], f"`import poslens.cli` imports {heavy}: keep them lazy in the CLI's path"
    # loose: the goal is < 0.5 s on an idle machine; a loaded CI machine gets slack
    assert float(dt) < 3.0
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "poslens", "--help"], capture_output=True, text=True,
                       env={**os.environ, **env_src}, timeout=120)
    assert r.returncode == 0 and "Usage" in r.stdout
    assert time.perf_counter() - t < 6.0


def test_cli_membership():
    assert is_cli("poslens.cli") and is_cli("poslens.cli.simulate") and is_cli("poslens.__main__")
    assert not is_cli("poslens.client") and not is_cli("poslens.capture.scan.run")


# ---------------------------------------------------------------------------------------------
# arrows point downward
# ---------------------------------------------------------------------------------------------
#: what each layer must not import (DESIGN.md: cli -> analysis -> capture / metrics / data / models ->
#: basics): the capture never reaches up into the report or the analyses, metrics are pure functions
#: of tensors (no capture, no models, no run directories of their own), figures draw tensors only
FORBIDDEN = {
    "poslens.capture": ("poslens.reporting", "poslens.analysis", "poslens.api", "poslens.reproduce", "poslens.demo",
                        "poslens.simulator"),
    "poslens.metrics": ("poslens.capture", "poslens.models", "poslens.data", "poslens.simulator", "poslens.reporting",
                        "poslens.analysis", "poslens.api", "poslens.reproduce", "poslens.demo", "poslens.figures"),
    "poslens.figures": ("poslens.capture", "poslens.reporting", "poslens.analysis", "poslens.api", "poslens.simulator"),
    # numbers below, words above: an analysis writes numbers and verdict codes, the report says them
    "poslens.analysis": ("poslens.reporting", "poslens.api", "poslens.reproduce", "poslens.demo"),
    # the C kernels are a basic layer: the capture and the metrics call them, they call neither
    "poslens.native": ("poslens.capture", "poslens.metrics", "poslens.models", "poslens.data", "poslens.reporting",
                       "poslens.analysis", "poslens.api", "poslens.simulator"),
}


def _within(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def upward_imports(graph: dict[str, set[str]], forbidden=FORBIDDEN) -> list[tuple[str, str]]:
    """``(module, imported)`` pairs that break a rule of ``forbidden``."""
    return sorted((m, t) for m, ts in graph.items() for layer, banned in forbidden.items() if _within(m, layer)
                  for t in ts if any(_within(t, b) for b in banned))


def test_upward_finder_on_a_known_graph():
    graph = {"poslens.capture.scan.finalize": {"poslens.reporting.plots", "poslens.metrics"},
             "poslens.metrics.diagonal": {"poslens.capture.statistics.accumulators"}, "poslens.metrics.noise": {"poslens.errors"},
             "poslens.reporting.plots": {"poslens.figures"}, "poslens.capture_extra": {"poslens.reporting"}}
    assert upward_imports(graph) == [("poslens.capture.scan.finalize", "poslens.reporting.plots"),
                                     ("poslens.metrics.diagonal", "poslens.capture.statistics.accumulators")]


def test_arrows_point_downward():
    graph, where = import_graph()
    bad = [f"{m} imports {t} (line {where[(m, t)]})" for m, t in upward_imports(graph)]
    assert not bad, "imports against the layering (DESIGN.md):\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------------
# a house a newcomer can walk: small packages, modules of one job, each fact at one home
# ---------------------------------------------------------------------------------------------
#: modules per package at most; the CLI has one module per command group, so it may hold more
MAX_MODULES, MAX_LINES = 12, 600
MANY_MODULES_OK = {"poslens.cli"}


def test_packages_are_small_and_say_what_they_hold():
    big, silent = [], []
    for init in sorted(PKG.rglob("__init__.py")):
        pkg = module_name(init)
        mods = [p for p in init.parent.glob("*.py") if p.name != "__init__.py"]
        if len(mods) > MAX_MODULES and pkg not in MANY_MODULES_OK:
            big.append(f"{pkg}: {len(mods)} modules")
        if not ast.get_docstring(ast.parse(init.read_text())):
            silent.append(pkg)
    assert not big, f"packages of more than {MAX_MODULES} modules (split them by stage):\n" + "\n".join(big)
    assert not silent, "packages whose __init__.py does not say what they hold:\n" + "\n".join(silent)


def test_modules_are_at_most_600_lines():
    long = [f"{m}: {n} lines" for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (split them by what they hold):\n" + "\n".join(long)


def _top_level(tree: ast.Module) -> tuple[set[str], dict[str, tuple[str, str]]]:
    """``(names the module defines, {name: (module, name) it imports from a poslens module})``."""
    defined, imported = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                defined |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("poslens"):
            imported.update({a.asname or a.name: (node.module, a.name) for a in node.names})
    return defined, imported


def test_names_are_imported_from_the_module_that_defines_them():
    """No module passes on a name it imported itself (a package's ``__init__`` that forms the public API
    aside): ``from poslens.a import f`` needs ``f`` to be defined in ``poslens.a``."""
    mods = modules()
    tops = {m: _top_level(ast.parse(p.read_text())) for m, p in mods.items()}
    files = [*mods.values(), *sorted((SRC.parent / "tests").rglob("*.py"))]
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and not node.level and node.module in tops):
                continue
            if mods[node.module].name == "__init__.py":
                continue
            defined, imported = tops[node.module]
            for a in node.names:
                if a.name in imported and a.name not in defined and f"{node.module}.{a.name}" not in mods:
                    bad.append(f"{path.relative_to(SRC.parent)} line {node.lineno}: {a.name} from {node.module} "
                               f"(defined in {imported[a.name][0]})")
    assert not bad, "names imported through a module that only imports them:\n" + "\n".join(bad)


#: the facts every stage shares (poslens.conventions): each assigned there and nowhere else
FACTS = ("LAYER_CONVENTION", "NOISE_P", "FEW_GROUPS_MARGIN", "SLASH_MIN_DELTA", "SLASH_MAX_DELTA", "RELATIVE",
         "TREND", "PANEL_TREND", "NORM_SHRINK", "ADJACENT", "ADJACENT_WEAK", "THEORY_CLOSE", "VERDICT_THRESHOLDS",
         "CHANGE_THRESHOLDS")
#: names that restate a fact under another name (a significance level, a layer convention, a slash range)
RESTATED = ("LEVEL", "SIGNIFICANT", "ALPHA", "THRESHOLDS")


def restates_a_fact(name: str) -> bool:
    return name in RESTATED or name.endswith("_CONVENTION") or (name.startswith("SLASH") and "DELTA" in name)


def module_assignments() -> dict[str, list[tuple[str, int, ast.AST]]]:
    """Module-level assignments: ``{name: [(module, line, value)]}``."""
    out: dict[str, list] = {}
    for m, p in modules().items():
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            out.setdefault(n.id, []).append((m, node.lineno, node.value))
    return out


def test_each_fact_has_one_home():
    assigned = module_assignments()
    for fact in FACTS:
        homes = [m for m, _, _ in assigned.get(fact, [])]
        assert homes == ["poslens.conventions"], (fact, homes)
    restated = [f"{m} line {line}: {name}" for name, where in assigned.items()
                for m, line, value in where if m != "poslens.conventions"
                and restates_a_fact(name)]
    assert not restated, "facts restated outside poslens.conventions:\n" + "\n".join(restated)
    # the layer convention's words are written once
    from poslens.conventions import LAYER_CONVENTION

    again = [m for m, p in modules().items() if m != "poslens.conventions" and LAYER_CONVENTION[:40] in p.read_text()]
    assert not again, again


#: the capture points' names and the best-slash-head rule: one home each
POINT_HOME, SLASH_RULE_HOME = "poslens.capture.statistics.points", "poslens.metrics.slash"
POINT_NAMES = ("MODULE_POINTS", "QK_POINTS", "RESIDUAL_POINTS", "PASS_POINTS", "CAPTURE_POINTS", "ATTENTION_POINTS")


def test_capture_points_and_the_best_slash_head_have_one_home():
    assigned = module_assignments()
    for name in POINT_NAMES:
        assert [m for m, _, _ in assigned.get(name, [])] == [POINT_HOME], name
    # the point names are written as a vocabulary once: no other module lists the residual points
    lists = [m for m, p in modules().items() if m != POINT_HOME and '("resid_pre", "attn_in", "attn_z"' in p.read_text()]
    assert not lists, lists
    defs = {m: [n.name for n in ast.parse(p.read_text()).body if isinstance(n, ast.FunctionDef)]
            for m, p in modules().items()}
    rule = [m for m, names in defs.items() for n in names if n in ("best_slash", "strongest_listed", "top_slash_heads")]
    assert sorted(set(rule)) == [SLASH_RULE_HOME], rule


def test_the_fact_check_knows_a_restatement():
    assert all(map(restates_a_fact, ("LEVEL", "SIGNIFICANT", "SCAN_LAYER_CONVENTION", "SLASH_MAX_DELTA")))
    assert not any(map(restates_a_fact, ("NOISE_GROUPS", "SLASH_KAPPA", "CONTRACT")))


# ---------------------------------------------------------------------------------------------
# tests check numbers and codes; few check the words
# ---------------------------------------------------------------------------------------------
TESTS = SRC.parent / "tests"
#: at most this many assertions on the readings' words, all in the tests of their rendering
MAX_PHRASE_ASSERTIONS = 50
#: the tests of the rendering: the reporting package's, the run-directory contract's, the pages'
#: (the demo's report, the reproduction and results pages, the explorer)
RENDERING_TESTS = ("tests/report/", "tests/test_contract.py", "tests/reproduce/", "tests/test_demo.py",
                   "tests/test_docs.py", "tests/explore/")
_WORD = re.compile(r"^[^_/<>=\\]*[A-Za-z]{2,}[^_/<>=\\]*$")
#: text that is an interface, not a reading: errors, warnings, help, titles, labels, columns, statuses
INTERFACE = re.compile(r"err|exc|warn|caplog|help|message|msg|log|usage|match|raises|why|reason|title|label|caption"
                       r"|column|cols|status|desc|convention|name|read_text|marker|vectors|state|asm|rows|stdout|out\b"
                       r"|axes|lines|bars|legend|meta|left_alone",
                       re.I)


def is_phrase(text: str) -> bool:
    """Two or more words (no identifiers, paths or markup)."""
    return sum(1 for w in text.split() if _WORD.match(w)) >= 2


def phrase_assertions(path: Path) -> list[int]:
    """Lines of the ``assert`` statements that compare a phrase with text poslens wrote, other than an
    interface's text (:data:`INTERFACE`, matched against the names and keys the assertion reads)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Assert):
            continue
        names = ({x.id for x in ast.walk(node.test) if isinstance(x, ast.Name)}
                 | {x.attr for x in ast.walk(node.test) if isinstance(x, ast.Attribute)}
                 | {x.slice.value for x in ast.walk(node.test) if isinstance(x, ast.Subscript)
                    and isinstance(x.slice, ast.Constant) and isinstance(x.slice.value, str)})
        if any(INTERFACE.search(n) for n in names):
            continue
        if any(isinstance(k, ast.Constant) and isinstance(k.value, str) and is_phrase(k.value)
               for c in ast.walk(node.test) if isinstance(c, ast.Compare)
               and any(isinstance(o, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)) for o in c.ops)
               for side in (c.left, *c.comparators) for k in ast.walk(side)):
            out.append(node.lineno)
    return out


def test_the_phrase_counter_tells_words_from_codes(tmp_path):
    f = tmp_path / "test_x.py"
    f.write_text('def test():\n    assert "purely relative" in text\n    assert j["relative"] == "purely_relative"\n'
                 '    assert "bad --out" in err\n    assert s["title"] == "a figure title"\n'
                 '    assert r["verdict"] == "not_reproduced"\n    assert "the mask creates it" not in " ".join(x)\n')
    assert phrase_assertions(f) == [2, 7]


def test_tests_assert_numbers_and_codes_not_words():
    found = {p.relative_to(TESTS.parent).as_posix(): lines for p in sorted(TESTS.rglob("test_*.py"))
             if (lines := phrase_assertions(p))}
    elsewhere = {f: lines for f, lines in found.items() if not f.startswith(RENDERING_TESTS)}
    total = sum(map(len, found.values()))
    assert total <= MAX_PHRASE_ASSERTIONS, f"{total} phrase assertions (at most {MAX_PHRASE_ASSERTIONS}): {found}"
    assert not elsewhere, f"phrase assertions outside the rendering tests (assert the judge's codes): {elsewhere}"
