"""``poslens demo``: the whole flow in compact form, and its refusal to overwrite foreign folders."""

from poslens.rundir import read_json


def test_demo_quick(cli, tmp_path):
    out = tmp_path / "demo"
    code, stdout, _ = cli("demo", "--quick", "--out", out, "--device", "cpu")
    assert code == 0
    assert (out / "sim_rope_causal" / "summary.json").exists()
    assert read_json(out / "demo.json")["finished"] is True
    for run in ("model_nope", "model_rope", "scan_nope", "scan_rope", "scan_rope_random", "slash_rope",
                "neighborhood_nope"):
        assert (out / run / "summary.json").exists(), run
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") or html.lower().startswith("<!doctype html>")
    assert "data:image/png;base64," in html


def test_demo_refuses_foreign_directory(cli, tmp_path):
    (tmp_path / "precious.txt").write_text("x")
    code, _, err = cli("demo", "--quick", "--out", tmp_path)
    assert code == 2 and "--overwrite" in err
    code, _, err = cli("demo", "--quick", "--out", tmp_path, "--overwrite")  # only an earlier demo is replaced
    assert code == 2 and "demo.json" in err
    assert (tmp_path / "precious.txt").read_text() == "x"
