"""The CLI conventions of docs/cli.md, checked over every registered command.

The commands are found by introspection (``poslens.cli.command()``, the click tree typer builds), so
a new command fails ``test_every_command_is_classified`` until it is placed in the tables below —
which say, from each command's own description, what it does (computes on a device, draws
figures, writes a run directory, ...). The flags each property requires are then checked from
the command's parameters and from its real ``--help`` output; the existing-output rule and the
one-line errors are checked by running the commands (in-process through ``poslens.cli.main``, and
twice as real subprocesses).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from poslens.cli import FLOW_ORDER, command, walk

SRC = Path(__file__).resolve().parents[2] / "src"

# What each command does (by its description, not by its flags).
COMPUTES = {"simulate", "train", "zoo", "scan", "neighborhood", "sweep", "probes", "panels", "slash-dynamics",
            "fingerprint", "ablate", "compare", "reproduce", "demo"}  # runs a model or the simulator: --device auto
DRAWS = {"simulate", "scan", "neighborhood", "sweep", "probes", "panels", "kim-maps", "slash", "slash-dynamics",
         "fingerprint", "ablate", "compare", "reproduce", "demo"}  # writes PNG figures: --no-figures
WRITES_DIR = {"simulate", "train", "zoo", "scan", "neighborhood", "sweep", "probes", "panels", "kim-maps", "slash",
              "slash-dynamics", "fingerprint", "ablate", "compare", "reproduce", "demo"}  # writes an output directory:
#                                                                                        --overwrite
WRITES_FILE = {"report", "explore"}  # writes one output file: --overwrite
RESUMES = {"train", "zoo", "scan"}  # can continue an interrupted run: --resume
PRINTS_ONLY = {"theory kim", "models list"}  # the printed text is the result: no --quiet
OTHER = {"models fetch", "models clean"}  # fills or empties the model cache (idempotent): --quiet only
ALL = COMPUTES | DRAWS | WRITES_DIR | WRITES_FILE | RESUMES | PRINTS_ONLY | OTHER


def _leaves():
    group = command()
    out = {}

    def visit(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                visit(sub, path + [name])
        else:
            out[" ".join(path)] = cmd

    visit(group, [])
    return out


LEAVES = _leaves()


def _options(cmd) -> dict:
    """``--flag`` -> click parameter, for every option of ``cmd``."""
    return {o: p for p in cmd.params if p.param_type_name == "option" for o in p.opts if o.startswith("--")}


def test_every_command_is_classified():
    assert set(LEAVES) == ALL, f"classify new commands here: {set(LEAVES) ^ ALL}"
    assert [c for c in walk(command())][1:]  # the walk reaches the commands


def test_top_level_help_lists_the_flow_in_order(cli):
    code, out, _ = cli("--help")
    assert code == 0
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(FLOW_ORDER)
    assert "..." not in out.split("Commands:")[1]  # each one-line summary is shown whole at 80 columns
    for group in ("theory", "models"):
        code, sub, _ = cli(group, "--help")
        assert code == 0 and "..." not in sub.split("Commands:")[1], sub
    assert FLOW_ORDER.index("simulate") < FLOW_ORDER.index("scan") < FLOW_ORDER.index("report") \
        < FLOW_ORDER.index("demo")


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_help_reads_cleanly(cli, name):
    code, out, err = cli(*name.split(), "--help")
    assert code == 0, err
    assert "<bool>" not in out and "{" not in out.splitlines()[0], out[:300]
    usage = out.splitlines()[0]
    # MODEL_DIR-style positional names: upper case, optional ones in brackets
    assert re.fullmatch(rf"Usage: poslens {name} \[OPTIONS\]( [A-Z_]+(\.\.\.)?| \[[A-Z_]+\](\.\.\.)?)*", usage), usage
    assert all(len(line) <= 80 for line in out.splitlines()), "help wider than 80 columns"


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_flags_follow_the_convention(name):
    opts = _options(LEAVES[name])
    assert ("--quiet" in opts) == (name not in PRINTS_ONLY), name
    assert "--no-progress" not in opts
    if name in COMPUTES:
        assert "--device" in opts and opts["--device"].default == "auto", name
    else:
        assert "--device" not in opts, name
    assert ("--no-figures" in opts) == (name in DRAWS), name
    if "--out" in opts:  # every output can be replaced, and only on request
        assert name in WRITES_DIR | WRITES_FILE, name
    assert ("--overwrite" in opts) == (name in WRITES_DIR | WRITES_FILE), name
    assert ("--resume" in opts) == (name in RESUMES), name
    for flag, p in opts.items():
        # one name per concept: a count of token sequences is --num-seqs (--num-train-seqs when two sets)
        if "seqs" in flag or flag in ("--num-train", "--num-test"):
            assert re.fullmatch(r"--num(-[a-z]+)?-seqs", flag), flag
        # --layers/--heads select layers/heads (text like 0,3,5); sizes are --num-layers/--num-heads
        if flag in ("--layers", "--heads", "--kv-heads"):
            desc = getattr(p, "type_descriptor", None)  # typer's annotation; older typer: the click type
            ann = desc.annotation if desc is not None else getattr(p.type, "name", None)
            assert ann in (str, "text", "str"), (name, flag, ann)
    if "--samples" in opts:  # Monte Carlo samples of the simulator (a different concept than sequences)
        assert name in ("simulate", "reproduce", "demo"), name


def _tiny_model(path: Path) -> Path:
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: archs.py
    from archs import save_tiny

    return save_tiny("llama", path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _tiny_model(tmp_path_factory.mktemp("conv") / "m")


# Minimal arguments each output-writing command needs to reach its output check.
def _args(name: str, model: Path, tmp: Path) -> list:
    return {"scan": [model], "neighborhood": [model], "probes": [model], "panels": [model], "fingerprint": [model],
            "ablate": [model], "compare": [model],
            "kim-maps": [tmp / "some_scan"], "slash": [tmp / "some_scan"], "reproduce": ["kim-fig1"],
            "demo": ["--quick"], "train": ["--task", "copy", "--steps", 1], "zoo": ["--scale", "micro"],
            "report": [tmp / "some_run"], "explore": [tmp / "some_run"]}.get(name, [])


@pytest.mark.parametrize("name", sorted(WRITES_DIR | WRITES_FILE))
def test_existing_output_is_refused_with_the_fix_named(cli, tmp_path, model_dir, name):
    if name in WRITES_FILE:
        out = tmp_path / "existing.html"
        out.write_text("keep")
        keep = out
    else:
        out = tmp_path / "existing"
        out.mkdir()
        keep = out / "keep.txt"
        keep.write_text("keep")
    code, stdout, err = cli(*name.split(), *_args(name, model_dir, tmp_path), "--out", out)
    assert code == 2, (name, err)
    assert len(err.splitlines()) == 1 and err.startswith("poslens: error: ") and "--overwrite" in err, err
    if name in RESUMES:
        assert "--resume" in err, err
    assert keep.read_text() == "keep"
    if out.is_dir():
        assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_overwrite_replaces_and_contradicts_resume(cli, tmp_path):
    out = tmp_path / "sim"
    args = ["simulate", "--samples", 8, "--seq-len", 4, "--num-layers", 1, "--dim", 4, "--no-figures", "--quiet",
            "--device", "cpu", "--out", out]
    assert cli(*args)[0] == 0
    first = (out / "summary.json").read_text()
    code, _, err = cli(*args)
    assert code == 2 and "--overwrite" in err and (out / "summary.json").read_text() == first
    code, _, err = cli(*args[:-2], "--seed", 1, "--overwrite", "--out", out)
    assert code == 0, err
    assert (out / "summary.json").read_text() != first
    code, _, err = cli("scan", tmp_path / "m", "--out", tmp_path / "s", "--resume", "--overwrite")
    assert code == 2 and "contradict" in err


def test_no_figures_writes_no_png(cli, tmp_path, model_dir):
    """The commands that gained --no-figures (panels, kim-maps, slash) and scan: no PNG, and the
    summary lists no figure; without the flag the same commands draw."""
    import json

    common = ["--quiet", "--no-figures"]
    scan = tmp_path / "scan"
    assert cli("scan", model_dir, "--out", scan, "--data", "random", "--seq-len", 8, "--num-seqs", 2,
               "--device", "cpu", *common)[0] == 0
    runs = {"scan": scan}
    for name, argv in (("kim-maps", ["kim-maps", scan]), ("slash", ["slash", scan, "--max-delta", 4]),
                       ("panels", ["panels", model_dir, "--data", "random", "--seq-len", 8, "--num-seqs", 2,
                                   "--batch-size", 2, "--device", "cpu"])):
        runs[name] = tmp_path / name
        code, _, err = cli(*argv, "--out", runs[name], *common)
        assert code == 0, (name, err)
    for name, run in runs.items():
        assert not list(run.rglob("*.png")), name
        assert json.loads((run / "summary.json").read_text()).get("figures", []) == [], name
    code, _, err = cli("kim-maps", scan, "--out", tmp_path / "drawn", "--quiet")
    assert code == 0 and list((tmp_path / "drawn").glob("*.png")), err


@pytest.mark.parametrize("argv,expect", [
    (["simulate", "--samples", "1O0"], "Invalid value for '--samples'"),
    (["simulate", "--sample", "3"], "No such option: --sample"),
    (["train", "--num-layers", "two", "--out", "x"], "'--num-layers'"),
    (["scan"], "Missing argument 'MODEL_DIR'"),
    (["simulate", "--device", "tpu", "--samples", "2"], "--device 'tpu'"),
])
def test_bad_values_are_one_line(cli, tmp_path, argv, expect):
    code, out, err = cli(*argv)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("poslens: error: ") and expect in err, err
    assert "╭" not in err and "Usage:" not in err


def test_real_process_errors_are_one_line(tmp_path):
    """The same through ``python -m poslens``: a typo'd number, and an existing --out."""
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("keep")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "COLUMNS": "80"}
    cases = [(["simulate", "--samples", "1e5x"], "'--samples'"),
             (["simulate", "--samples", "4", "--out", str(existing)], "pass --overwrite")]
    procs = [subprocess.Popen([sys.executable, "-m", "poslens", *argv], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for argv, _ in cases]
    for p, (argv, expect) in zip(procs, cases):
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 2, (argv, stderr)
        assert stdout == "" and len(stderr.splitlines()) == 1, stderr
        assert stderr.startswith("poslens: error: ") and expect in stderr, stderr
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
