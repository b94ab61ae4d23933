"""The docs cannot rot: every ``poslens`` command and flag that README.md and docs/*.md name exists,
every relative link resolves, and every code block marked runnable runs on a tiny model.

A block is runnable when the line before its opening fence is ``<!-- run -->`` (docs/development.md,
"Docs that cannot rot"). Bash blocks run with ``bash -e`` in a fresh directory with ``TINY_MODEL``
naming a tiny random-init Llama; Python blocks run in a fresh interpreter with the same environment.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# Documented before they exist. Each entry names something the docs describe that has not landed
# yet; delete the entry when it lands. Meant to be empty.
PENDING_COMMANDS: set[str] = set()  # e.g. {"fingerprint"}: `poslens fingerprint`, documented before it lands
PENDING_PAGES: set[str] = set()  # e.g. {"docs/python.md"}: a page linked before it is written
# ---------------------------------------------------------------------------------------------

#: pages whose runnable blocks other tests run (the Python API's and the fingerprint's own tests)
RUN_ELSEWHERE = {"docs/python.md", "docs/fingerprint.md"}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- parsing ---------------------------------------------------------------------------------

FENCE = re.compile(r"^( {0,3})(```+|~~~+)\s*([\w+-]*)")  # indented 4 or more: an indented code block's text


def blocks(text: str) -> list[dict]:
    """Fenced code blocks: ``{"lang", "start" (1-based line of the fence), "lines", "run"}``."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        out.append({"lang": lang, "start": start + 1, "lines": lines[start + 1:j], "run": prev == "<!-- run -->"})
        i = j + 1
    return out


def prose(text: str) -> str:
    """The text outside fenced blocks and indented code (fenced lines blanked, line numbers kept)."""
    lines = text.split("\n")
    for b in blocks(text):
        for k in range(b["start"] - 1, b["start"] + len(b["lines"]) + 1):
            if k < len(lines):
                lines[k] = ""
    return "\n".join(lines)


#: a paragraph naming one of these describes another program's flags (torchrun's, a benchmark script's)
OTHER_PROGRAM = re.compile(r"\.py\b|\.sh\b|\btorchrun\b|\bpytest\b|\bpip\b|\bmutmut\b")


def code_snippets(text: str) -> list[tuple[int, str, bool]]:
    """``(line, snippet, own)``: inline code spans of the prose, and logical lines of shell-like
    fenced blocks (continued by a trailing backslash or an indented next line). ``own`` marks an
    inline span in a paragraph that names no other program: a flag named there alone is poslens'."""
    out = []
    lines = prose(text).split("\n")
    para_other, k = [False] * len(lines), 0
    while k < len(lines):
        j = k
        while j < len(lines) and lines[j].strip():
            j += 1
        other = any(OTHER_PROGRAM.search(ln) for ln in lines[k:j])
        para_other[k:j] = [other] * (j - k)
        k = j + 1
    for n, line in enumerate(lines, 1):
        for m in re.finditer(r"(`+)(.+?)\1", line):
            out.append((n, m.group(2), not para_other[n - 1]))
    for b in blocks(text):
        if b["lang"] in ("python", "py", "json", "mermaid"):
            continue
        logical: list[tuple[int, str]] = []
        for k, line in enumerate(b["lines"]):
            n = b["start"] + 1 + k
            if logical and (logical[-1][1].rstrip().endswith("\\") or (line[:1].isspace() and line.strip())):
                logical[-1] = (logical[-1][0], logical[-1][1].rstrip().rstrip("\\") + " " + line.strip())
            else:
                logical.append((n, line))
        out += [(n, s, False) for n, s in logical]
    return out


# --- the command tree ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tree():
    from poslens.cli import command

    return command()


def option_names(cmd) -> set[str]:
    names = {"--help"}
    for p in cmd.params:
        if getattr(p, "param_type_name", "") == "option":
            names.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return names


def all_options(group) -> set[str]:
    from poslens.cli import walk

    return set().union(*(option_names(c) for c in walk(group)))


INVOCATION = re.compile(r"(?<![\w./-])poslens\s+([a-z][a-z0-9-]*)((?:\s+[a-z][a-z0-9-]*)?)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?<!-)(?![\w-])")


def resolve(group, words: list[str]):
    """The click command that ``poslens WORDS...`` names (group, then subcommand), or None."""
    cmd = group.commands.get(words[0])
    if cmd is not None and hasattr(cmd, "commands") and len(words) > 1 and words[1] in cmd.commands:
        cmd = cmd.commands[words[1]]
    return cmd


def invocations(snippet: str):
    """``(command words, flags after them up to the next shell separator)`` for each ``poslens CMD``."""
    for m in INVOCATION.finditer(snippet):
        tail = re.split(r"\|\||&&|[|;]|\$\(|\bposlens\s+[a-z]", snippet[m.end():])[0]
        yield [m.group(1), *m.group(2).split()], FLAG.findall(tail)


def command_problems(name: str, text: str, tree, known: set[str]) -> list[str]:
    problems = []
    for line, snippet, own in code_snippets(text):
        found = False
        for words, flags in invocations(snippet):
            found = True
            if words[0] in PENDING_COMMANDS:
                continue
            cmd = resolve(tree, words)
            if cmd is None:
                problems.append(f"{name}:{line}: `poslens {words[0]}` is not a command")
                continue
            opts = option_names(cmd)
            problems += [f"{name}:{line}: `poslens {' '.join(words)}` has no option {f}" for f in flags if f not in opts]
        if not found and own and snippet.strip().startswith("--"):  # a flag named on its own
            problems += [f"{name}:{line}: {f} is no option of any poslens command"
                         for f in FLAG.findall(snippet) if f not in known]
    return problems


def test_named_commands_and_flags_exist(tree):
    known = all_options(tree)
    problems = [p for path in doc_files() for p in command_problems(rel(path), path.read_text(), tree, known)]
    assert not problems, "\n".join(problems)


def test_the_command_check_catches_wrong_names(tree):
    text = ("Run `poslens scann DIR`, then `poslens scan DIR --no-such-flag --out x` and `--seq-lenn`.\n\n"
            "```bash\nposlens theory kim --alpha 0 \\\n    --betta 1\nposlens models fetch --quiet\n```\n"
            "`torchrun --nnodes 2` and `--nnodes` (torchrun's) are not poslens'; `poslens scan --stats all`.\n")
    problems = command_problems("x.md", text, tree, all_options(tree))
    assert len(problems) == 4, problems
    for bad in ("scann", "--no-such-flag", "--seq-lenn", "--betta"):
        assert sum(bad in p for p in problems) == 1, (bad, problems)


# --- links -----------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", prose(path.read_text()), re.M)}


def link_problems(path: Path, text: str) -> list[str]:
    problems = []
    for n, line in enumerate(prose(text).split("\n"), 1):
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if dest.is_relative_to(ROOT) and rel(dest) in PENDING_PAGES:
                continue
            if not dest.exists():
                problems.append(f"{rel(path)}:{n}: {target} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel(path)}:{n}: {target}: no heading with anchor #{anchor}")
    return problems


def test_relative_links_resolve():
    problems = [p for path in doc_files() for p in link_problems(path, path.read_text())]
    assert not problems, "\n".join(problems)


def test_the_link_check_catches_broken_links():
    text = ("[ok](scan.md), [anchor](scan.md#outputs), [gone](nope.md), [bad anchor](scan.md#no-such-heading), "
            "![img](report-30-layers.png), [web](https://example.org/x.md), `[code](not-checked.md)`\n")
    problems = link_problems(ROOT / "docs" / "x.md", text)
    assert len(problems) == 2 and "nope.md" in problems[0] and "no-such-heading" in problems[1], problems


# --- runnable blocks -------------------------------------------------------------------------

def runnable() -> list:
    out = []
    for path in doc_files():
        if rel(path) in RUN_ELSEWHERE:
            continue
        for b in blocks(path.read_text()):
            if b["run"]:
                out.append(pytest.param(path, b, id=f"{rel(path)}:{b['start']}"))
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny random-init Llama (2 layers, hidden 32, 64 positions) with a byte-level tokenizer."""
    from tests.capture.test_scan import save_tokenized_tiny

    return save_tokenized_tiny(tmp_path_factory.mktemp("docs") / "tiny")


def test_some_blocks_are_runnable():
    """The marker is in use (a typo in it would silently run nothing)."""
    assert len(runnable()) >= 3


@pytest.mark.parametrize("path,block", runnable())
def test_runnable_block_runs(path, block, tiny_model, tmp_path):
    code = "\n".join(block["lines"]) + "\n"
    env = dict(os.environ, TINY_MODEL=str(tiny_model), OMP_NUM_THREADS="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if block["lang"] in ("bash", "sh", "shell", "console"):
        argv = ["bash", "-e", "-c", code]
    elif block["lang"] in ("python", "py"):
        argv = [sys.executable, "-c", code]
    else:
        pytest.fail(f"{rel(path)}:{block['start']}: a runnable block must be bash or python, not {block['lang']!r}")
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (f"{rel(path)}:{block['start']} exited {r.returncode}\n--- block\n{code}"
                               f"--- stdout\n{r.stdout[-2000:]}\n--- stderr\n{r.stderr[-3000:]}")


# --- benchmark results -----------------------------------------------------------------------

def test_one_results_file_per_benchmark():
    """benchmarks/results_NAME.json belongs to the script NAME (bench_NAME.py, NAME.py or NAME.sh), which
    overwrites it; no file is named after a run."""
    bench = ROOT / "benchmarks"
    names = [p.name[len("results_"):-len(".json")] for p in sorted(bench.glob("results_*.json"))]
    assert names, "no results files"
    orphans = [n for n in names if not any((bench / f).exists() for f in (f"bench_{n}.py", f"{n}.py", f"{n}.sh"))]
    assert not orphans, f"results files without a benchmark of that name: {orphans}"


# --- the generated results page --------------------------------------------------------------

def _results_script():
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("poslens_results_script", str(ROOT / "scripts" / "results"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_results_page_equals_its_generated_form():
    """docs/results.md is scripts/results' rendering of docs/results.json, never edited by hand."""
    page, data = ROOT / "docs" / "results.md", ROOT / "docs" / "results.json"
    if not page.exists() and not data.exists():
        pytest.skip("no docs/results.md yet: run `poslens reproduce all` and `scripts/results RUN_DIR`")
    assert page.exists() and data.exists(), "docs/results.md and docs/results.json come together"
    import json

    assert page.read_text() == _results_script().render(json.loads(data.read_text())), \
        "docs/results.md differs from its generated form: regenerate it with scripts/results"


def test_results_render_says_what_each_verdict_is():
    render = _results_script().render
    data = {"meta": {"samples": 1000, "seed": 0},
            "experiments": [{"name": "a", "paper": "P", "claim": "c | d", "measured": "x = 1\ny = 2",
                             "reproduced": True, "note": "criterion"},
                            {"name": "b", "paper": "P", "claim": "c", "measured": "z", "reproduced": None, "note": None},
                            {"name": "c", "paper": "P", "claim": "c", "measured": "w", "reproduced": False, "note": ""}]}
    page = render(data)
    rows = [ln for ln in page.splitlines() if ln.startswith("| `")]
    assert [r.split("|")[-2].strip() for r in rows] == ["reproduced", "not decided", "**not reproduced**"]
    assert "c \\| d" in rows[0] and "x = 1<br>y = 2" in rows[0] and "- `a`: criterion" in page
    assert "Not part of this run" in page  # no real-model record


def test_the_set_up_says_what_it_costs_and_how_to_undo_it():
    """Where the README's two commands are, and in docs/development.md: the download of triton, the
    size of the cache the real models leave, and the command that removes it."""
    readme = (ROOT / "README.md").read_text()
    setup = readme[: readme.index("poslens measures")]
    dev = (ROOT / "docs" / "development.md").read_text()
    for text in (setup, dev):
        assert "triton" in text and "286 MB" in text and "1.9 GB" in text and "poslens models clean" in text
    demo = (ROOT / "docs" / "demo.md").read_text()
    assert "about a minute and a half" not in demo and "two and a half minutes" in demo
