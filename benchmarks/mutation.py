"""Mutation testing of the science modules: how many small wrong changes does the test suite catch?

A small AST mutator of our own (mutmut and cosmic-ray want their own project layout and a cache
of the whole suite; this one needs nothing but the standard library). For each target module it
enumerates one-token mutants:

- comparison operators: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``is`` <-> ``is not``;
- arithmetic: ``+`` <-> ``-``, ``*`` <-> ``/``, ``//`` -> ``/``, ``**`` -> ``*``;
- numbers: ``n`` -> ``n + 1`` (``0`` -> ``1``, ``1`` -> ``2``, ``0.5`` -> ``1.5``);
- ``and`` <-> ``or``, ``not x`` -> ``x``, ``True`` <-> ``False``, unary ``-x`` -> ``x``;
- augmented assignment ``+=`` -> ``=`` (a running sum that keeps only its last term).

Each mutant is written into a scratch copy of ``src/`` and the module's own fast test selection
runs against it in a forked child of a process that has already imported torch, transformers and
pytest (no per-mutant start-up cost; nothing of poslens is imported before the fork). A mutant is
*killed* when a test fails or the run exceeds the time limit. Docstrings, log/error messages and
``__all__`` are not mutated; lines marked ``# pragma: no mutate`` are skipped.

Usage (not part of the default test run; minutes per module on one core)::

    python benchmarks/mutation.py                       # every target
    python benchmarks/mutation.py metrics/diagonal.py   # one module
    python benchmarks/mutation.py --list                # the targets and their tests

Writes ``benchmarks/results_mutation.json`` (per module: mutants, killed, score, survivors with
line and change) and prints the survivors.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: module (under src/poslens) -> pytest arguments of its fast test selection
TARGETS: dict[str, list[str]] = {
    "capture/stats.py": ["tests/test_stats.py"],
    "metrics/neighborhood.py": ["tests/test_references.py", "-k", "not scan_summary and not simulator",
                                "tests/test_metrics.py"],
    "metrics/diagonal.py": ["tests/test_references.py", "-k", "not scan_summary and not simulator",
                            "tests/test_metrics.py", "tests/test_noise.py"],
    # -k applies to every file given: keep it to excluding the slow scan test
    "metrics/slash.py": ["tests/test_references.py", "tests/test_metrics.py", "tests/test_slash.py",
                         "-k", "not scan_summary"],
    "metrics/rank.py": ["tests/test_references.py", "tests/test_metrics.py", "-k", "not scan_summary"],
    "rope.py": ["tests/test_references.py", "tests/test_metrics.py", "-k", "not scan_summary"],
    "report/readings.py": ["tests/test_references.py", "tests/test_report.py", "-k", "not scan_summary and not chromium"
                           " and not screenshot"],
    "theory.py": ["tests/test_theory.py"],
}

CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
            ast.Pow: ast.Mult}


def _skip_lines(source: str) -> set[int]:
    return {i + 1 for i, line in enumerate(source.splitlines()) if "pragma: no mutate" in line}


def _message_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes inside docstrings, raise statements, f-strings and warnings: text, not science."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.JoinedStr, ast.Assert)):
            skip.update(id(n) for n in ast.walk(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.update(id(n) for n in ast.walk(first))
    return skip


def mutation_sites(tree: ast.AST, source: str) -> list[tuple[int, str, object]]:
    """``(node index in ast.walk order, description, mutation)`` for every mutant of ``tree``."""
    skip_lines, skip_nodes = _skip_lines(source), _message_nodes(tree)
    out = []
    for idx, node in enumerate(ast.walk(tree)):
        if id(node) in skip_nodes or getattr(node, "lineno", None) in skip_lines:
            continue
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in CMP_SWAP:
                    out.append((idx, f"L{line}: {type(op).__name__} -> {CMP_SWAP[type(op)].__name__}", ("cmp", k)))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BIN_SWAP:
            out.append((idx, f"L{line}: {type(node.op).__name__} -> {BIN_SWAP[type(node.op)].__name__}", ("bin",)))
        if isinstance(node, ast.AugAssign):
            out.append((idx, f"L{line}: {type(node.op).__name__}= -> =", ("aug",)))
        elif isinstance(node, ast.BoolOp):
            other = "Or" if isinstance(node.op, ast.And) else "And"
            out.append((idx, f"L{line}: {type(node.op).__name__} -> {other}", ("bool",)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            out.append((idx, f"L{line}: drop {type(node.op).__name__}", ("unary",)))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
            out.append((idx, f"L{line}: {node.value!r} -> {node.value + 1!r}", ("num",)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            out.append((idx, f"L{line}: {node.value} -> {not node.value}", ("bool_const",)))
    return out


def apply(tree: ast.AST, target: int, how: tuple) -> ast.AST:
    """A mutated deep copy of ``tree``: node number ``target`` (ast.walk order) changed as ``how`` says."""
    new = copy.deepcopy(tree)
    nodes = list(ast.walk(new))
    node = nodes[target]
    kind = how[0]
    if kind == "cmp":
        node.ops[how[1]] = CMP_SWAP[type(node.ops[how[1]])]()
    elif kind == "bin":
        node.op = BIN_SWAP[type(node.op)]()
    elif kind == "aug":
        repl = ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno, col_offset=node.col_offset)
        _replace(new, node, repl)
    elif kind == "bool":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "unary":
        _replace(new, node, node.operand)
    elif kind == "num":
        node.value = node.value + 1
    elif kind == "bool_const":
        node.value = not node.value
    return ast.fix_missing_locations(new)


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for k, v in enumerate(value):
                    if v is old:
                        value[k] = new
                        return
    raise RuntimeError("node not found")


def run_tests(scratch: Path, args: list[str], timeout: float) -> str:
    """Run pytest on ``args`` in a forked child with ``scratch/src`` first on the path: 'killed',
    'survived' or 'timeout'."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.chdir(ROOT)
            sys.path.insert(0, str(scratch / "src"))
            sys.path.insert(0, str(ROOT / "tests"))
            signal.alarm(int(timeout))
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly", *args])
            os._exit(int(code))
        except BaseException:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "timeout" if os.WTERMSIG(status) == signal.SIGALRM else "killed"
    code = os.WEXITSTATUS(status)
    return "survived" if code == 0 else "killed"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", help="targets (paths under src/poslens); default: all")
    ap.add_argument("--list", action="store_true", help="print the targets and their test selections")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per mutant run (a longer run is killed)")
    ap.add_argument("--max-mutants", type=int, default=0, help="at most this many mutants per module (0 = all)")
    ap.add_argument("--sample", type=int, default=0,
                    help="a random sample of this many mutants per module (seed 0; 0 = all): an estimate of the score")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results_mutation.json"))
    a = ap.parse_args(argv)
    if a.list:
        for m, t in TARGETS.items():
            print(f"{m:28s} {' '.join(t)}")
        return 0
    modules = a.modules or list(TARGETS)
    unknown = [m for m in modules if m not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {unknown}; see --list")

    os.environ.update({"PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                       "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"})
    sys.dont_write_bytecode = True  # a stale .pyc of the previous mutant must never be read
    import numpy  # noqa: F401  (imported once, before any fork)
    import pytest  # noqa: F401
    import scipy.stats  # noqa: F401
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401

    results = json.loads(Path(a.out).read_text()) if Path(a.out).exists() else {}
    scratch = Path(tempfile.mkdtemp(prefix="poslens_mut_"))
    try:
        shutil.copytree(ROOT / "src", scratch / "src", ignore=shutil.ignore_patterns("__pycache__"))
        for mod in modules:
            path = scratch / "src" / "poslens" / mod
            source = path.read_text()
            tree = ast.parse(source)
            sites = mutation_sites(tree, source)
            n_all = len(sites)
            if a.max_mutants:
                sites = sites[: a.max_mutants]
            if a.sample and a.sample < len(sites):
                import random

                sites = sorted(random.Random(0).sample(sites, a.sample), key=lambda t: t[0])
            base = run_tests(scratch, TARGETS[mod], a.timeout * 3)
            if base != "survived":
                print(f"{mod}: the unmutated tests do not pass ({base}); skipped", flush=True)
                continue
            t0, survivors, killed = time.time(), [], 0
            for k, (idx, desc, how) in enumerate(sites):
                try:
                    path.write_text(ast.unparse(apply(tree, idx, how)))
                except Exception as e:  # an invalid mutant (e.g. num on a tuple index): not counted
                    print(f"  skip {desc}: {e}", flush=True)
                    continue
                outcome = run_tests(scratch, TARGETS[mod], a.timeout)
                path.write_text(source)
                if outcome == "survived":
                    survivors.append(desc)
                    print(f"  SURVIVED {mod} {desc}", flush=True)
                else:
                    killed += 1
                print(f"  [{k + 1}/{len(sites)}] {mod}: {killed} killed, {len(survivors)} survived", end="\r",
                      flush=True)
            n = killed + len(survivors)
            results[mod] = {"mutants": n, "killed": killed, "score": killed / n if n else None,
                            "survivors": survivors, "tests": TARGETS[mod], "seconds": round(time.time() - t0),
                            "all_mutants": n_all, "sampled": len(sites) < n_all}
            print(f"\n{mod}: {killed}/{n} killed ({100 * killed / max(n, 1):.1f} %)", flush=True)
            Path(a.out).write_text(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total = sum(r["mutants"] for r in results.values())
    kill = sum(r["killed"] for r in results.values())
    print(f"all: {kill}/{total} killed ({100 * kill / max(total, 1):.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
