"""Render run directories into one self-contained HTML report.

``render_report(run_dirs, title)`` collects the runs (expanding folders that hold runs) and renders
every run the same way, from the common summary shape (:func:`poslens.rundir.summary.envelope`): one card
per paper it measures (:mod:`poslens.reporting.cards`), holding its readings (written from the numbers
by :mod:`poslens.reporting.readings`, which also holds the papers' prose), its per-layer quantities as
line plots with error bars, its per-head quantities as head × layer heat maps, its own figures in a
readable grid, and only the short tables a reader quotes (page elements:
:mod:`poslens.reporting.elements`). The page opens with key findings, one block per paper. Several runs
of one command are overlaid in one set of line plots. Every figure is embedded as a base64
``data:`` URI; the page loads nothing from anywhere (its Content-Security-Policy forbids every
fetch but ``data:`` images) and has no scripts.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from poslens.errors import PoslensError
from poslens.reporting.cards import cards_for, compared_ids, comparisons, findings, reproduction_block
from poslens.rundir.load import Run, classify, load_run
from poslens.reporting.collect import collect
from poslens.reporting.page import CSP, template_env  # CSP: every report's policy, re-exported by poslens.report
from poslens.reporting.readings.papers import PAPERS

SECTION_ORDER = ["reproduction", "kim", "slash", "neighborhood", "models", "other"]


# --------------------------------------------------------------------------------------------
# assembling the page
# --------------------------------------------------------------------------------------------
def build_context(runs: list[Run], title: str, skipped: list[str] | None = None) -> dict:
    sections: dict[str, dict] = {}

    def section(key: str) -> dict:
        if key not in sections:
            if key in PAPERS:
                p = PAPERS[key]
                sections[key] = {"id": f"sec-{key}", "title": p["title"], "ref": p["ref"], "intro": p["intro"],
                                 "cards": [], "comparisons": [], "repro": []}
            else:
                titles = {"reproduction": ("Reproduction: what the papers showed and what we measured", ""),
                          "models": ("Models", "Models trained here (or given as Hugging Face directories)."),
                          "other": ("Other results", "")}
                t, intro = titles[key]
                sections[key] = {"id": f"sec-{key}", "title": t, "ref": "", "intro": intro, "cards": [],
                                 "comparisons": [], "repro": []}
        return sections[key]

    compared = compared_ids(runs)
    for run in runs:
        if run.kind == "reproduce":
            section("reproduction")["repro"].append(reproduction_block(run))
            continue
        for key, card in cards_for(run, compared=id(run) in compared):
            section(key)["cards"].append(card)
    for key, blocks in comparisons(runs).items():
        section(key)["comparisons"] += blocks
    ordered = [sections[k] for k in SECTION_ORDER if k in sections]
    from poslens import __version__ as version

    return {
        "title": title, "csp": CSP, "sections": ordered, "findings": findings(runs),
        "plain_findings": plain_findings(runs),
        "runs": [{"name": r.name, "path": str(r.path), "kind": r.command} for r in runs],
        "skipped": list(skipped or []), "generated": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "version": version,
    }


def plain_findings(runs) -> list[dict]:
    """The key findings in plain words, where a run holds them (a fingerprint: per paper its claim and, per
    model, the number against its noise floor, a verdict and why; :mod:`poslens.reporting.readings.fingerprint`)."""
    import json

    from poslens.reporting.readings.fingerprint import render_findings

    out = []
    for r in runs:
        f = r.path / "fingerprint.json"
        if r.kind != "command" or r.command != "fingerprint" or not f.is_file():
            continue
        try:
            blocks = json.loads(f.read_text()).get("findings") or []
        except (OSError, ValueError):
            continue
        blocks = blocks if isinstance(blocks, list) else []
        # the verdict records, rendered; a fingerprint.json that holds its findings in words is shown as it is
        for b in render_findings(blocks) or [b for b in blocks if isinstance(b, dict) and "paper" in b]:
            if isinstance(b, dict) and isinstance(b.get("models"), list):
                out.append({"paper": str(b.get("paper", "")), "claim": str(b.get("claim", "")),
                            "run": f"the positional fingerprint ({r.name})",
                            "models": [m for m in b["models"] if isinstance(m, dict)]})
        break  # one fingerprint's findings (the first given)
    if not out:  # no fingerprint: the scans' own plain findings, in the fingerprint's words
        from poslens.reporting.plain import scan_findings

        out = scan_findings(runs)
    return out


def _env():
    return template_env()


def render_runs(runs: list[Run], title: str = "poslens report", skipped: list[str] | None = None,
                links: list[tuple[str, str]] | None = None) -> str:
    """Render already-loaded runs (see :func:`poslens.reporting.collect.collect`); ``links``: ``(href, text)``
    of pages beside the report (the demo's explorer), listed at its top."""
    ctx = {**build_context(runs, title, skipped), "links": [{"href": h, "text": t} for h, t in links or []]}
    return _env().get_template("template.html.j2").render(**ctx)


def render_report(run_dirs: list[str | Path], title: str = "poslens report", *, allow_many: bool = False) -> str:
    """One self-contained HTML page for ``run_dirs`` (folders holding runs are expanded; see
    :func:`poslens.reporting.collect.collect` for ``allow_many``)."""
    runs, skipped = collect(list(run_dirs), allow_many=allow_many)
    return render_runs(runs, title, skipped)


def write_runs(runs: list[Run], out: str | Path, title: str = "poslens report",
               skipped: list[str] | None = None, links: list[tuple[str, str]] | None = None, *,
               new: bool = False) -> Path:
    """Render loaded runs and atomically write the page to ``out``; returns the path. ``new``: ``out`` must
    not exist when the page is put in place (a report another process wrote there meanwhile is kept, and
    this one refused), else an existing page is replaced. ``links``: see :func:`render_runs`."""
    from poslens.rundir.io import _atomic_write_bytes

    out = Path(out)
    if out.exists() and out.is_dir():
        raise PoslensError(f"--out {out} is a directory; pass a file name such as {out / 'report.html'}.")
    html = render_runs(runs, title, skipped, links)  # everything is validated before anything is written
    try:
        _atomic_write_bytes(out, html.encode("utf-8"), exclusive=new)
    except FileExistsError:
        raise PoslensError(f"--out {out} was written by another process while this report was made; it is kept: "
                           "pass --overwrite to replace it, or choose a new file name.") from None
    return out


def write_report(run_dirs: list[str | Path], out: str | Path, title: str = "poslens report", *,
                 allow_many: bool = False, links: list[tuple[str, str]] | None = None) -> Path:
    """Collect, render and atomically write the report to ``out``; returns the path."""
    out = Path(out)
    if out.exists() and out.is_dir():
        raise PoslensError(f"--out {out} is a directory; pass a file name such as {out / 'report.html'}.")
    runs, skipped = collect(list(run_dirs), allow_many=allow_many)
    return write_runs(runs, out, title, skipped, links)


def write_index_html(out_dir: str | Path, title: str = "poslens reproduction") -> Path:
    """Write ``out_dir/index.html``: the reproduction page of a folder holding ``index.json``."""
    from poslens.rundir.io import _atomic_write_bytes

    out_dir = Path(out_dir)
    if classify(out_dir) != "reproduce":
        raise PoslensError(f"{out_dir} holds no reproduction index.json; run `poslens reproduce` first.")
    run = load_run(out_dir)
    run.name = title
    run.display_path = ""  # the page lives in the folder it describes (which may still be a staging copy)
    html = render_runs([run], title)
    path = out_dir / "index.html"
    _atomic_write_bytes(path, html.encode("utf-8"))
    return path
