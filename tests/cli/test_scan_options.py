"""A scan's options are declared once (``ScanConfig`` in poslens.capture.scan.options): every field is a
flag of ``poslens scan`` and a keyword of ``poslens.scan``, with the same default and help text, and
neither face has an option the other lacks beyond its own short, named list."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

import poslens
from poslens.capture.scan.options import ScanConfig, scan_options
from poslens.cli import command

#: the CLI's own options (the process: progress bars, torch's threads) and Python's own keywords
#: (what a notebook passes that a command line cannot)
CLI_ONLY = {"--quiet", "--threads", "--help"}
PYTHON_ONLY = {"model", "tokenizer", "progress", "threads"}
#: fields given to poslens.scan another way: the model directory is its `model`, which also takes a loaded model
NOT_KEYWORDS = {"model_dir"}
#: keywords whose default in a notebook differs from the CLI's (None: from the data / a temporary directory)
NOTEBOOK_DEFAULTS = {"out": None, "seq_len": None, "num_seqs": None, "figures": False}

OPTIONS = scan_options()


def _squash(text: str) -> str:
    """``text`` without whitespace: help as the terminal wraps it compares with help as declared."""
    return re.sub(r"\s+", "", text)


@pytest.fixture(scope="module")
def scan_command():
    return command().commands["scan"]


def test_the_table_is_scan_config():
    assert [o.name for o in OPTIONS] == [f.name for f in dataclasses.fields(ScanConfig)]
    assert all(o.help.strip() for o in OPTIONS), "every option says what it means"
    flags = [o.flag for o in OPTIONS]
    assert len(set(flags)) == len(flags)


def test_every_option_is_a_flag_with_its_default_and_help(scan_command):
    params = {p.name: p for p in scan_command.params}
    spelled = set()
    for o in OPTIONS:
        p = next((p for p in params.values() if o.flag in p.opts or (o.argument and p.metavar == o.flag)), None)
        assert p is not None, f"{o.name}: no {o.flag} in `poslens scan`"
        spelled.update(p.opts)
        assert p.help == o.flag_help, o.name
        if o.default is dataclasses.MISSING:
            assert p.required, o.name
        else:
            assert not p.required and o.from_flag(p.default) == o.default, o.name
    others = {opt for p in params.values() for opt in p.opts if opt not in spelled}
    assert others == CLI_ONLY - {"--help"}, \
        f"declare scan options in ScanConfig, not in cli/scan.py: {others - CLI_ONLY}"


def test_every_option_is_a_keyword_with_its_default():
    sig = inspect.signature(poslens.scan)
    for o in OPTIONS:
        if o.name in NOT_KEYWORDS:
            assert o.name not in sig.parameters
            continue
        p = sig.parameters[o.name]
        assert p.default == o.python_default and p.annotation == o.python_type, o.name
        if o.name in NOTEBOOK_DEFAULTS:
            assert p.default == NOTEBOOK_DEFAULTS[o.name] != o.default, o.name
        else:
            assert o.from_keyword(p.default) == o.default, o.name
    assert {o.name for o in OPTIONS if not o.python} == NOT_KEYWORDS
    extra = set(sig.parameters) - {o.name for o in OPTIONS}
    assert extra == PYTHON_ONLY, f"declare scan options in ScanConfig, not in poslens.scan: {extra - PYTHON_ONLY}"
    assert list(sig.parameters)[:2] == ["model", "data"]  # poslens.scan(model, "random") still reads


def test_help_lists_every_option(cli):
    code, out, err = cli("scan", "--help")
    assert code == 0, err
    for o in OPTIONS:
        assert o.flag in out, o.flag
        assert _squash(o.flag_help) in _squash(out), o.flag


def test_docstring_says_every_keyword():
    doc = _squash(inspect.getdoc(poslens.scan))
    for o in OPTIONS:
        if o.python:
            assert _squash(f"{o.name}:") in doc and _squash(o.help) in doc, o.name
    assert "seq_len" in str(inspect.signature(poslens.scan))


def test_an_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="seq_lenn"):
        poslens.scan("some/model", seq_lenn=8)


def test_flags_and_keywords_make_the_same_config(cli, tmp_path, monkeypatch):
    """The same options given as flags and as keywords reach the scan as equal ``ScanConfig``s."""
    import poslens.capture.scan.run

    seen = []
    monkeypatch.setattr(poslens.capture.scan.run, "run_scan", lambda cfg, **kw: seen.append(cfg) or {})
    model, out = str(tmp_path / "m"), str(tmp_path / "r")
    code, _, err = cli("scan", model, "--out", out, "--data", "random", "--seq-len", 16, "--layers", "0,2-3",
                       "--heads", "2.1,0.3", "--no-rope-layers", 1, "--stats", "scores,probs", "--no-figures",
                       "--chunk-elems", 512, "--quiet")
    assert code == 0, err
    poslens.scan(model, "random", out=out, seq_len=16, layers=[0, 2, 3], heads=[(0, 3), (2, 1)], no_rope_layers=[1],
                 stats=["scores", "probs"], chunk_elems=512, progress=False)
    assert len(seen) == 2 and dataclasses.asdict(seen[0]) == dataclasses.asdict(seen[1])
    assert seen[0].figures is False and seen[0].num_seqs == 64 and seen[0].heads == [(0, 3), (2, 1)]
    # the defaults alike: all layers and statistics, no heads; the text forms reach Python too
    seen.clear()
    assert cli("scan", model, "--out", tmp_path / "r2", "--quiet")[0] == 0
    poslens.scan(model, out=tmp_path / "r2", figures=True, progress=False)
    poslens.scan(model, out=tmp_path / "r2", figures=True, progress=False, layers="all", heads="", stats="all")
    assert dataclasses.asdict(seen[0]) == dataclasses.asdict(seen[1]) == dataclasses.asdict(seen[2])
    assert seen[0].layers is None and seen[0].stats is None and seen[0].heads == [] and seen[0].seq_len == 256


def test_bad_list_values_name_the_option_in_each_face(cli, tmp_path):
    code, _, err = cli("scan", tmp_path / "m", "--out", tmp_path / "r", "--heads", "3")
    assert code == 2 and "--heads" in err and len(err.splitlines()) == 1
    with pytest.raises(poslens.PoslensError, match="layers"):
        poslens.scan(str(tmp_path / "m"), layers=["x"])
