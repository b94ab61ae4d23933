"""The real CLI (``python -m poslens``) in subprocesses, one bad input per command.

Each must exit with code 2, print exactly one line on stderr starting ``poslens: error:`` that
names the bad input, print no traceback, and write nothing under ``--out`` (nor leave a staging
directory beside it). The subprocesses start together (each spends seconds importing torch and
transformers) two at a time and are awaited in one fixture; the in-process ``cli`` fixture of
conftest.py goes through the same ``poslens.cli.main`` for the many other error-path tests.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# (id, argv after `python -m poslens`, text the error line must contain); {out} = the run's --out
CASES = [
    ("scan-missing-model", ["scan", "{tmp}/nonexistent", "--out", "{out}"], "nonexistent does not exist"),
    ("scan-broken-config", ["scan", "{tmp}/badmodel", "--out", "{out}", "--data", "random"], "not valid JSON"),
    ("simulate-alpha", ["simulate", "--out", "{out}", "--alpha", "1.5"], "--alpha 1.5"),
    ("simulate-out-is-file", ["simulate", "--out", "{tmp}/afile", "--samples", "4", "--seq-len", "4", "--num-layers", "1",
                              "--dim", "4"], "is an existing file"),
    ("reproduce-name", ["reproduce", "nosuchfig", "--out", "{out}"], "unknown experiment 'nosuchfig'"),
    ("report-missing-run", ["report", "{tmp}/nonexistent", "--out", "{out}.html"], "nonexistent does not exist"),
    ("slash-not-a-scan", ["slash", "{tmp}", "--out", "{out}"], "has no maps.safetensors"),
    ("theory-alpha", ["theory", "kim", "--alpha", "2"], "--alpha 2.0"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli_errors")
    (tmp / "badmodel").mkdir()
    (tmp / "badmodel" / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2')
    (tmp / "afile").write_text("not a directory")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    out = {}

    def start(name, argv):
        cwd = tmp / f"cwd_{name}"
        cwd.mkdir()
        args = [a.format(tmp=tmp, out=tmp / f"out_{name}") for a in argv]
        return name, cwd, subprocess.Popen([sys.executable, "-m", "poslens", *args], cwd=cwd, env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    for k in range(0, len(CASES), 2):  # two at a time: the CI machine has two cores
        running = [start(name, argv) for name, argv, _ in CASES[k:k + 2]]
        for name, cwd, p in running:
            stdout, stderr = p.communicate(timeout=300)
            out[name] = (p.returncode, stdout, stderr, cwd)
    return tmp, out


@pytest.mark.parametrize("name,argv,expect", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_and_nothing_written(results, name, argv, expect):
    tmp, res = results
    code, stdout, stderr, cwd = res[name]
    lines = stderr.splitlines()
    assert code == 2, (code, stderr[-2000:])
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert len(lines) == 1 and lines[0].startswith("poslens: error: "), stderr
    assert expect in lines[0], lines[0]
    # nothing written: no --out (file or directory), no staging directory beside it, nothing in the cwd
    written = [p.name for p in tmp.iterdir() if p.name.startswith(f"out_{name}") or f".out_{name}" in p.name]
    assert written == [], written
    assert list(cwd.iterdir()) == []
    assert (tmp / "afile").read_text() == "not a directory"


def test_simulate_with_one_sample_says_so_instead_of_nan(cli, tmp_path):
    """Too few samples for a standard error: the table and summary say so; no NaN anywhere."""
    code, out, err = cli("simulate", "--out", tmp_path / "one", "--samples", 1, "--seq-len", 6, "--num-layers", 2,
                         "--dim", 8)
    assert code == 0, err
    assert "nan" not in out.lower() and "fewer than two independent groups" in " ".join(out.split())
    text = (tmp_path / "one" / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
