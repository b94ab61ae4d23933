"""Cause: ``report --out`` checked that the file was new before rendering, then renamed its page over
whatever was there: two reports to the same new file both exited 0 and the second replaced the first
without --overwrite. The page is put in place only where no file exists (a hard link); the later report
is refused in one line and the first one kept."""

from __future__ import annotations

import pytest

from faultkit import one_error

SIM = ["--samples", "4", "--seq-len", "4", "--num-layers", "1", "--dim", "4", "--quiet", "--no-figures"]


@pytest.fixture
def run(cli, tmp_path):
    code, _, err = cli("simulate", "--out", tmp_path / "sim", *SIM)
    assert code == 0, err
    return tmp_path / "sim"


def test_a_report_written_meanwhile_is_kept(cli, run, tmp_path, monkeypatch):
    import poslens.reporting.render as R

    out = tmp_path / "r.html"
    render = R.render_runs

    def racing(*a, **k):  # another `poslens report` finishes the same file while this one renders
        html = render(*a, **k)
        out.write_text("the other report")
        return html

    monkeypatch.setattr(R, "render_runs", racing)
    code, _, err = cli("report", run, "--out", out, "--quiet")
    one_error(code, err, str(out), "--overwrite")
    assert out.read_text() == "the other report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "sim"]  # no temporary file left


def test_overwrite_still_replaces(cli, run, tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    code, _, err = cli("report", run, "--out", out, "--quiet", "--overwrite")
    assert code == 0, err
    assert out.read_text() != "old"
    code, _, err = cli("report", run, "--out", tmp_path / "new.html", "--quiet")
    assert code == 0 and (tmp_path / "new.html").stat().st_size > 1000, err
