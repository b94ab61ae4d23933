"""``poslens report``: structure of the HTML, robustness to odd run directories, the reproduction
page, and a render in headless Chromium (no console errors, every image loads, no network).

The Chromium test needs Debian's ``chromium`` package (``apt-get install -y chromium``); it is
skipped, saying why, only where ``/usr/bin/chromium`` is absent. Where it is installed, a page that
does not render (or a Chromium that cannot start) fails the test: a broken page must not pass as
a skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from poslens.errors import PoslensError
from poslens.reporting import collect, render_report, write_index_html, write_report
from poslens.rundir.io import write_json

CHROMIUM = "/usr/bin/chromium"
_IMG = re.compile(r'<img\b[^>]*\bsrc="([^"]*)"')


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Tiny real runs: two simulations (NoPE causal, RoPE causal), two scans (NoPE, RoPE micro
    models), an analysis run dir per the contract, a model dir, and a reproduction folder."""
    import torch

    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.models.families import build_model
    from poslens.reproduce import ReproContext, run_reproduction
    from poslens.simulator import SimConfig, run_simulation, save_result

    root = tmp_path_factory.mktemp("runs")
    out: dict[str, Path] = {}
    for name, kw in (("sim_nope", {}), ("sim_rope", {"rope": True, "alpha": 0.5})):
        res = run_simulation(SimConfig(samples=500, seq_len=10, dim=16, layers=3, **kw))
        save_result(res, root / name)
        out[name] = root / name
    for pe in ("none", "rope"):
        mdir = root / f"model_{pe}"
        build_model(pe, "micro").save_pretrained(str(mdir))
        write_json(mdir / "summary.json", {"pe": pe, "data": "stdlib", "steps": 3, "initial_loss": 5.5,
                                           "final_loss": 5.1, "eval_loss": 5.2})
        (mdir / "train_log.jsonl").write_text("".join(
            json.dumps({"kind": "train", "step": s, "loss": 5.5 - 0.1 * s}) + "\n" for s in range(4))
            + json.dumps({"kind": "eval", "step": 3, "eval_loss": 5.2}) + "\n")
        out[f"model_{pe}"] = mdir
        sdir = root / f"scan_{pe}"
        torch.manual_seed(0)
        run_scan(ScanConfig(model_dir=str(mdir), out=str(sdir), data="random", seq_len=12, num_seqs=2,
                            batch_size=2), progress=False)
        out[f"scan_{pe}"] = sdir
    ana = root / "panels_run"
    ana.mkdir()
    shutil.copy(out["sim_nope"] / "scores_raw.png", ana / "panels.png")
    write_json(ana / "config.json", {"command": "panels", "model_dir": "somewhere", "whatever": [1, 2]})
    write_json(ana / "summary.json", {
        "experiment": "kim-panels", "title": "Layer-1 Gram panels <b>bold?</b>", "paper": "kim",
        "tables": [{"title": "Panel statistics", "columns": ["panel", "relativity", "locality"],
                    "rows": [["(a) YYᵀ", 0.91234, 0.1], ["(b) QKᵀ", None, -0.5]]},
                   {"title": "broken table", "rows": "not a list"}],
        "readings": ["Panel (b) favours nearby keys."],
        "figures": [{"file": "panels.png", "caption": "The nine panels"}, {"file": "missing.png", "caption": "x"},
                    {"file": "../../etc/passwd", "caption": "escape"}],
        "unknown_key": {"ignored": True},
    })
    out["analysis"] = ana
    repro = root / "repro"
    run_reproduction("kim-fig1", repro, ReproContext(figures=True))
    out["repro"] = repro
    return out


def _images(html: str) -> list[str]:
    return _IMG.findall(html)


def _sections(html: str) -> list[str]:
    return re.findall(r'<section class="paper" id="([^"]+)"', html)


def _notes(html: str) -> list[str]:
    return re.findall(r'<p class="notes">([^<]*)</p>', html)


def _card(html: str, card_id: str) -> str:
    i = html.index(f'id="{card_id}"')
    return html[i:html.index("</article>", i)]


def _readings(block: str) -> list[str]:
    """The items of the block's first readings list."""
    ul = block.split('<ul class="readings">', 1)[1].split("</ul>", 1)[0]
    return re.findall(r"<li>(.*?)</li>", ul, re.S)


def _table_heads(html: str) -> list[list[str]]:
    """The column headers of every table."""
    return [re.findall(r'<th scope="col">(.*?)</th>', t) for t in re.findall(r"<table>(.*?)</table>", html, re.S)]


def _badges(block: str) -> list[str]:
    """The classes of the block's badges beside the plain ``badge``."""
    return [c.replace("badge", "").strip() for c in re.findall(r'<span class="(badge[^"]*)">', block)]


def _per_layer_tables(html: str) -> list[list[str]]:
    return [h for h in _table_heads(html) if h[:1] == ["layer"]]


def _csp(html: str) -> dict[str, str]:
    from html import unescape

    content = unescape(re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html).group(1))
    return dict((d.strip().split(None, 1) + [""])[:2] for d in content.split(";") if d.strip())


def _findings(html: str) -> dict[str, list[str]]:
    """The key findings' items by the section each block links to."""
    kf = html.index('id="key-findings"')
    block = html[kf:html.index("</section>", kf)]
    return {sec: re.findall(r"<li>(.*?)</li>", ul, re.S)
            for sec, ul in re.findall(r'<h3><a href="#([^"]+)">.*?</h3>\s*<ul>(.*?)</ul>', block, re.S)}


def test_report_structure(runs):
    from html import escape

    from poslens.fmt import fmt
    from poslens.metrics.judge.papers import judge_kim, judge_model, judge_neighborhood, kim_finding
    from poslens.reporting.readings.common import layer_aps, layer_slash_head
    from poslens.rundir.io import read_json

    title = "NoPE vs RoPE"
    html = render_report([runs["sim_nope"], runs["sim_rope"], runs["scan_none"], runs["scan_rope"],
                          runs["analysis"], runs["model_none"]], title=title)
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert re.search(r"<title>(.*?)</title>", html).group(1) == title
    # a section per paper, plus the models
    assert _sections(html) == ["sec-kim", "sec-slash", "sec-neighborhood", "sec-models"]
    for ref in ("arXiv 2509.21042", "arXiv 2601.08297", "arXiv 2501.00073"):
        assert ref in html
    # every image embedded: sims 2 each (raw, diagonal-normalised; probs.png is a detail kept in the run
    # directory and named), scans 2 each (12 positions: no zoom), analysis 1 (missing/escaping ones dropped),
    # loss curve 1; drawn here: a head x layer map per scan, overlaid per-layer plots for the 2 sims (kim) and
    # the 2 scans (kim, neighbourhood). Overlaid runs get no per-layer table (the line plots carry it).
    imgs = _images(html)
    assert len(imgs) == 2 + 2 + 2 + 2 + 1 + 1 + 2 + 3
    assert sum("probs.png" in n for n in _notes(html)) == 2  # one note per sim naming the kept-back figure
    assert _per_layer_tables(html) == []
    assert all(src.startswith("data:image/png;base64,") for src in imgs)
    panels = _card(html, "kim-panels-run")
    assert any(n.startswith("figure missing.png ") for n in _notes(panels))  # named in a note, not drawn
    assert "missing.png" not in "".join(re.findall(r'<img [^>]*>', panels))
    assert "etc/passwd" in html and "root:" not in html  # named as missing, never read
    # self-contained: no external resources, no scripts
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "url(" not in html and "<script" not in html and "<link" not in html
    csp = _csp(html)  # the CSP that forbids every fetch: images only as data: URIs
    assert csp["img-src"] == "data:" and csp["default-src"] == csp["script-src"] == "'none'"
    # analysis contract rendered, escaped: its title, its one well-formed table, its readings
    contract = read_json(runs["analysis"] / "summary.json")
    assert re.search(r"<h3>(.*?)<span", panels).group(1) == escape(contract["title"])
    assert "<b>" not in panels
    good = contract["tables"][0]
    assert re.findall(r"<caption>(.*?)</caption>", panels) == [good["title"]]  # rows that are not a list: no table
    assert _table_heads(panels) == [good["columns"]] and "<td>0.912</td>" in panels
    assert _readings(panels) == contract["readings"]
    # comparisons overlay like runs in one set of line plots: kim: sims + scans; neighbourhood: scans
    cmp = dict(re.findall(r'<div class="comparison" id="([^"]+)">\s*<h3>.*?</h3>\s*<p class="subtitle">(.*?)</p>',
                          html, re.S))
    assert list(cmp) == ["sec-kim-cmp-1", "sec-kim-cmp-2", "sec-neighborhood-cmp-1"]
    compared = {k: [part.split(":")[0] for part in v.split("; ")] for k, v in cmp.items()}
    assert sorted(compared.values()) == [["scan_none", "scan_rope"]] * 2 + [["sim_nope", "sim_rope"]]
    # key findings first, one block per paper, before every section
    kf = html.index('id="key-findings"')
    assert kf < html.index('<section class="paper"')
    block = html[kf:html.index("</section>", kf)]
    for ref in ("arXiv 2509.21042", "arXiv 2601.08297", "arXiv 2501.00073"):
        assert ref in block
    found = _findings(html)
    assert list(found) == ["sec-kim", "sec-slash", "sec-neighborhood"]
    sim = read_json(runs["sim_nope"] / "summary.json")
    kim = kim_finding(sim["layers"])
    first = found["sec-kim"][0]
    assert first.startswith("sim_nope: ")
    assert fmt(min(kim["relativity"])) in first and fmt(max(kim["relativity"])) in first
    scan = read_json(runs["scan_none"] / "summary.json")
    top = max((t for t in map(layer_slash_head, scan["layers"]) if t), key=lambda t: t["score"])
    slash = next(x for x in found["sec-slash"] if x.startswith("scan_none: "))
    assert f"Δ = {top['offset']}, SlashScore {fmt(top['score'])}" in slash
    # readings derived from the numbers: the simulation's layer 0 is judged flat (layers count from 0) ...
    assert judge_kim(sim["layers"])["flat"] == [0]
    assert "Layer 0 is flat within Monte Carlo noise" in html  # ... and the page says so
    assert re.search(r"relativity index [0-9.]+ → [0-9.]+", html)
    # the scans now write the paper's per-sequence APS: the readings use it
    nb = [l for l in scan["layers"] if layer_aps(l)[0] is not None]
    assert judge_neighborhood(scan, nb, [layer_aps(l)[0] for l in nb])["per_seq"] is True
    assert _readings(_card(html, "neighborhood-scan-none"))
    model = judge_model(read_json(runs["model_none"] / "summary.json"))
    assert (model["trained"], model["initial_loss"], model["final_loss"], model["steps"]) == ("trained", 5.5, 5.1, 3)
    assert any(fmt(5.5) in r and fmt(5.1) in r for r in _readings(_card(html, "run-model-none")))
    # one number format
    text = re.sub(r'src="[^"]*"|arXiv \d+\.\d+', "", html)
    too_precise = re.findall(r"(?<![\d.])(?:0\.0*[1-9]\d{3,}|[1-9]\d*\.\d{4,})", text)  # > 3 significant digits
    assert not too_precise, too_precise
    # a run on its own (no like run to overlay) keeps its short per-layer table, integer layer labels
    alone = render_report([runs["sim_nope"]], title="one")
    assert len(_per_layer_tables(alone)) == 1 and "<td>1</td>" in alone
    assert 'class="comparison"' not in alone


def test_flat_and_relative_readings():
    from poslens.reporting.readings.kim import kim_readings
    from poslens.metrics.judge.papers import judge_kim
    from poslens.metrics.verdicts import uniform_slash

    layers = [{"layer": 1, "relativity_index": 0.999, "locality": 0.0},
              {"layer": 2, "relativity_index": 0.41, "locality": 0.68}]
    noise = "Monte Carlo noise"
    rel = judge_kim(layers)["relativity"]  # layer 1 purely relative, then a drop to 0.41 in layer 2
    assert (rel["code"], rel["first_layer"], rel["drop_layer"], rel["drop"]) == ("drop", 1, 2, 0.41)
    assert "0.41" in " ".join(kim_readings(layers, noise=noise))
    layers = [{"layer": 1, "relativity_index": None, "locality": None},
              {"layer": 2, "relativity_index": 0.41, "locality": 0.68},
              {"layer": 3, "relativity_index": 0.5, "locality": 0.7}]
    j = judge_kim(layers)  # layer 1 flat; from layer 2 on position-dependent, 0.41 → 0.5; nearby keys favoured
    assert j["flat"] == [1] and j["live"] == [2, 3] and j["series"]["tail"] is True
    assert j["series"]["relativity"] == [0.41, 0.5] and j["relativity"]["code"] == "partial"
    assert j["locality"]["code"] == "near"
    text = " ".join(kim_readings(layers, noise=noise))
    assert text.startswith("Layer 1 is flat within Monte Carlo noise") and "0.41 → 0.5" in text
    # uniform causal attention: SlashScore(d) = mean over i = d+1..N of 1/i
    assert uniform_slash(3, 0) == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert uniform_slash(3, 2) == pytest.approx(1 / 3)


def test_folder_expansion_and_reproduction_page(runs, tmp_path):
    html = render_report([runs["repro"].parent], allow_many=True)  # the whole folder: every run below it
    secs = _sections(html)
    assert secs[0] == "sec-reproduction" and "sec-kim" in secs and "sec-models" in secs
    from html import unescape

    from poslens.rundir.io import read_json

    rec = read_json(runs["repro"] / "index.json")["experiments"][0]
    assert rec["name"] == "kim-fig1" and rec["reproduced"] is True
    exp = html[html.index('<article class="experiment" id="exp-kim-fig1">'):]
    exp = exp[:exp.index("</article>")]
    # its verdict badge, the paper's claim and what was measured, and the experiment's own figure
    assert _badges(exp) == ["verdict-ok"]
    assert exp.count('<p class="claim">') == 2 and rec["claim"] in unescape(exp)
    assert _readings(exp) == rec["measured"].splitlines()
    assert len(_images(exp)) == 1 and "(kim-fig1/kim_fig1.png)" in exp
    assert all(src.startswith("data:") for src in _images(html))
    path = write_index_html(runs["repro"])
    page = path.read_text()
    assert path.name == "index.html" and "1 of 1" in page and "(2,1) = 0.15" in page
    assert len(_images(page)) == 1


def test_errors_name_the_bad_directory(runs, tmp_path):
    with pytest.raises(PoslensError, match="does not exist"):
        render_report([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(PoslensError, match=r"empty is not a poslens run directory"):
        render_report([tmp_path / "empty"])
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(PoslensError, match="is a file"):
        render_report([f])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"command": "scan"}')
    with pytest.raises(PoslensError, match="no summary.json"):
        render_report([bad])
    (bad / "summary.json").write_text("{not json")
    with pytest.raises(PoslensError, match=r"summary.json: not valid JSON"):
        render_report([bad])
    with pytest.raises(PoslensError, match="no run directories"):
        collect([])


def test_minimal_and_odd_run_dirs(tmp_path):
    """Unknown commands, missing optional parts and unknown keys render without errors."""
    d = tmp_path / "odd"
    d.mkdir()
    write_json(d / "config.json", {"command": "future-thing"})
    write_json(d / "summary.json", {"layers": [], "tables": [{"columns": ["a"], "rows": [[1], 2]}],
                                    "figures": "nope"})  # (layers that are no list: tests/faults/test_one_line.py)
    html = render_report([d])
    assert _sections(html) == ["sec-other"] and "future-thing" in html


def test_cli_writes_atomically_and_validates(cli, runs, tmp_path):
    out = tmp_path / "r.html"
    code, stdout, _ = cli("report", runs["sim_nope"], runs["scan_none"], "--out", out, "--title", "T")
    assert code == 0 and out.is_file() and "<title>T</title>" in out.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left
    before = out.read_bytes()
    code, _, err = cli("report", runs["sim_nope"], "--out", out)  # an existing page is replaced only when asked
    assert code == 2 and "--overwrite" in err
    code, _, err = cli("report", tmp_path / "missing", "--out", out, "--overwrite")
    assert code == 2 and "missing does not exist" in err
    assert out.read_bytes() == before  # a failed run leaves the previous report intact
    code, _, err = cli("report", runs["sim_nope"], "--out", tmp_path / "r.txt")
    assert code == 2 and ".html" in err


# --------------------------------------------------------------------------------------------
# headless Chromium
# --------------------------------------------------------------------------------------------
#: injected into a test-only copy, before the page's CSP meta (which forbids scripts after it):
#: records script errors, failed resource loads and CSP violations, then the image count after load
_PROBE = """<script>
window.__errs = [];
window.addEventListener('error', function (e) {
  window.__errs.push('error: ' + (e.message || (e.target && (e.target.tagName + ' ' + String(e.target.src).slice(0, 40)))));
}, true);
document.addEventListener('securitypolicyviolation', function (e) {
  window.__errs.push('csp: ' + e.violatedDirective + ' ' + e.blockedURI);
});
var __ce = console.error;
console.error = function () { window.__errs.push('console: ' + [].join.call(arguments, ' ')); __ce.apply(console, arguments); };
window.addEventListener('load', function () {
  var imgs = [].slice.call(document.images);
  var broken = imgs.filter(function (i) { return !i.complete || i.naturalWidth === 0; }).length;
  var d = document.createElement('div');
  d.id = 'poslens-status';
  d.textContent = JSON.stringify({images: imgs.length, broken: broken, errors: window.__errs});
  document.body.appendChild(d);
});
</script>"""


def chromium_status(html: str, tmp: Path) -> tuple[dict, str]:
    """Load ``html`` in headless Chromium; returns (probe status, Chromium's console log lines)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (install Debian's chromium package: apt-get install -y chromium)")
    page = tmp / "page.html"
    page.write_text(html.replace("<head>", "<head>" + _PROBE, 1))
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
           "--dump-dom", page.as_uri()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"{CHROMIUM} is installed but could not run: {e}")
    m = re.search(r'<div id="poslens-status">([^<]*)</div>', proc.stdout)
    if proc.returncode != 0 or m is None:
        pytest.fail(f"{CHROMIUM} is installed but the page did not render (exit {proc.returncode}): {proc.stderr[-400:]}")
    import html as _html

    console = "\n".join(l for l in proc.stderr.splitlines() if ":CONSOLE" in l)
    return json.loads(_html.unescape(m.group(1))), console


def test_chromium_probe_detects_problems(tmp_path):
    """The probe itself must catch a broken image, a network fetch and a script error."""
    html = ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>x</title></head><body>'
            '<img src="data:image/png;base64,AAAA"><img src="http://127.0.0.1:9/x.png">'
            '<script>undefinedFunction()</script></body></html>')
    status, _ = chromium_status(html, tmp_path)
    assert status["images"] == 2 and status["broken"] == 2
    assert any("undefinedFunction" in e for e in status["errors"])


def test_report_renders_in_chromium(runs, tmp_path):
    html = render_report([runs["repro"].parent], title="browser check", allow_many=True)
    n_img = len(_images(html))
    status, console = chromium_status(html, tmp_path)
    assert status["errors"] == [], status["errors"]
    assert status["images"] == n_img and n_img >= 12
    assert status["broken"] == 0
    assert console == "", console  # the page has no scripts: any console message is a problem


def test_trained_model_experiments_registered_and_run(tmp_path, monkeypatch):
    """The zoo-model experiments register into the reproduce registry and write a reproduction page."""
    import poslens.reproduce.models as rm
    from poslens.models.families import build_model
    from poslens.reproduce import EXPERIMENTS, ReproContext, run_reproduction

    assert {"zuo-adjacency", "kim-trained-panels", "slash-sdh"} <= set(EXPERIMENTS)
    zoo = tmp_path / "zoo"
    build_model("none", "micro").save_pretrained(str(zoo / "nope-random"))
    write_json(zoo / "nope-random" / "summary.json", {"pe": "none", "steps": 0})
    monkeypatch.setenv("POSLENS_ZOO", str(zoo))
    monkeypatch.setattr(rm, "SEQ_LEN", 16)
    monkeypatch.setattr(rm, "NUM_SEQS", 4)
    rec = run_reproduction("zuo-adjacency", tmp_path / "out", ReproContext(figures=False))[0]
    assert isinstance(rec["reproduced"], bool)
    assert {r["model"] for r in rec["runs"]} == {str(zoo / "nope-random")}  # the zoo's model, not a fresh one
    page = write_index_html(tmp_path / "out").read_text()
    assert "zuo-adjacency" in page and "APS" in page


def test_zuo_sweep_experiment_is_registered():
    from poslens.reproduce import EXPERIMENTS

    assert "zuo-sweep" in EXPERIMENTS and "zuo-adjacency" in EXPERIMENTS


_RECTS = """<script>
window.addEventListener('load', function () {
  var rects = [].slice.call(document.images).map(function (i) {
    var r = i.getBoundingClientRect();
    return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height];
  });
  var d = document.createElement('div');
  d.id = 'poslens-rects';
  d.textContent = JSON.stringify({rects: rects, height: document.documentElement.scrollHeight});
  document.body.appendChild(d);
});
</script>"""


def test_report_screenshot_shows_every_figure(runs, tmp_path):
    """Photograph the page in headless Chromium and check, in the pixels, that every figure is drawn
    (not blank) and large enough to read, and that key findings come first."""
    from PIL import Image, ImageStat

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (install Debian's chromium package: apt-get install -y chromium)")
    html = render_report([runs["sim_nope"], runs["scan_rope"], runs["analysis"]], title="screenshot check")
    page = tmp_path / "page.html"
    page.write_text(html.replace("<head>", "<head>" + _RECTS, 1))
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--force-device-scale-factor=1", f"--user-data-dir={tmp_path / 'profile'}"]
    try:
        dom = subprocess.run(common + ["--window-size=1400,1000", "--virtual-time-budget=5000", "--dump-dom",
                                       page.as_uri()], capture_output=True, text=True, timeout=90)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"{CHROMIUM} is installed but could not run: {e}")
    m = re.search(r'<div id="poslens-rects">([^<]*)</div>', dom.stdout)
    if dom.returncode != 0 or m is None:
        pytest.fail(f"{CHROMIUM} is installed but the page did not render (exit {dom.returncode}): {dom.stderr[-400:]}")
    import html as _html

    info = json.loads(_html.unescape(m.group(1)))
    height = min(int(info["height"]), 16000)
    shot = tmp_path / "shot.png"
    subprocess.run(common + [f"--window-size=1400,{height}", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, text=True, timeout=90, check=True)
    im = Image.open(shot).convert("L")
    rects = info["rects"]
    assert len(rects) == len(_images(html)) >= 6
    for x, y, w, h in rects:
        assert w >= 300 and h >= 100, (x, y, w, h)  # readable size, not a thumbnail
        if y + h > im.height:
            continue
        crop = im.crop((int(x), int(y), int(x + w), int(y + h)))
        dark = sum(crop.histogram()[:200]) / (crop.width * crop.height)
        assert ImageStat.Stat(crop).stddev[0] > 10 and dark > 0.01, (x, y, w, h)  # drawn, not blank
    # the page is not blank outside figures either: the key-findings box sits at the top
    top = im.crop((0, 0, im.width, 600))
    assert ImageStat.Stat(top).stddev[0] > 10
    assert html.index('id="key-findings"') < html.index("<figure>")


_SIZES = """<script>
window.addEventListener('load', function () {
  var col = document.querySelector('.content').clientWidth;
  var rects = [].slice.call(document.images).map(function (i) {
    var r = i.getBoundingClientRect();
    return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height, i.naturalWidth];
  });
  var d = document.createElement('div');
  d.id = 'poslens-sizes';
  d.textContent = JSON.stringify({rects: rects, column: col, height: document.documentElement.scrollHeight});
  document.body.appendChild(d);
});
</script>"""


def glyph_heights(crop) -> list[int]:
    """Heights in pixels of the glyph-like marks of a screenshot crop: connected dark grey pixels
    (text is black, antialiased) at most 40 px in either direction whose surroundings are mostly
    light (text sits on the figure's white; a dark speck inside a coloured heat map does not)."""
    import numpy as np
    from scipy import ndimage

    a = np.asarray(crop.convert("RGB"), dtype=int)
    lum, chroma = a.mean(-1), a.max(-1) - a.min(-1)
    lab, _ = ndimage.label((lum < 110) & (chroma < 25), structure=np.ones((3, 3)))
    light = lum > 215
    out = []
    for ys, xs in ndimage.find_objects(lab):
        h, w = ys.stop - ys.start, xs.stop - xs.start
        if 2 <= h <= 40 and w <= 40 and light[max(ys.start - 2, 0): ys.stop + 2,
                                               max(xs.start - 2, 0): xs.stop + 2].mean() >= 0.45:
            out.append(h)
    return out


#: a figure's text is readable on the page when the 75th percentile of its glyph heights (digits,
#: capitals and ascenders: their dark cores) is at least this many pixels, about a 9-pixel font;
#: text scaled into a thumbnail of half its size measures 3 to 4
MIN_TEXT_PX = 6


def _screenshot(page: Path, tmp: Path, width: int = 1400):
    """(sizes the page reports, the screenshot as a greyscale-capable PIL image) in headless Chromium."""
    from PIL import Image

    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--force-device-scale-factor=1", f"--user-data-dir={tmp / 'profile'}"]
    try:
        dom = subprocess.run(common + [f"--window-size={width},1000", "--virtual-time-budget=5000", "--dump-dom",
                                       page.as_uri()], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"{CHROMIUM} is installed but could not run: {e}")
    m = re.search(r'<div id="poslens-sizes">([^<]*)</div>', dom.stdout)
    if dom.returncode != 0 or m is None:
        pytest.fail(f"{CHROMIUM} is installed but the page did not render (exit {dom.returncode}): {dom.stderr[-400:]}")
    import html as _html

    info = json.loads(_html.unescape(m.group(1)))
    shot = tmp / "shot.png"
    subprocess.run(common + [f"--window-size={width},{min(int(info['height']), 16000)}", f"--screenshot={shot}",
                             page.as_uri()], capture_output=True, text=True, timeout=120, check=True)
    return info, Image.open(shot).convert("RGB")


def test_report_figures_full_width_with_readable_text(runs, tmp_path):
    """In a 1,400-pixel window every figure (score maps, per-layer plots, head maps, the fingerprint's
    sink, frequency and slash figures) is shown at its own size or the column's full width, never as a
    thumbnail, and its text measures at least MIN_TEXT_PX in the screenshot; the same page with the
    figures squeezed to 45 % measures below it (the probe sees small text)."""
    import numpy as np

    from poslens.analysis.fingerprint import fingerprint
    from poslens.reporting.fingerprint import fingerprint_page

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (install Debian's chromium package: apt-get install -y chromium)")
    fp = tmp_path / "fingerprint"
    fingerprint([runs["model_none"], runs["model_rope"]], out=fp, data="random", seq_len=16, num_seqs=4,
                progress=False, page=fingerprint_page)
    html = render_report([runs["sim_nope"], runs["scan_rope"], fp], title="figure sizes")
    page = tmp_path / "page.html"
    page.write_text(html.replace("<head>", "<head>" + _SIZES, 1))
    info, im = _screenshot(page, tmp_path)
    rects = info["rects"]
    assert len(rects) == len(_images(html)) >= 8
    measured = 0
    for x, y, w, h, natural in rects:
        assert abs(w - min(natural, info["column"])) <= 2, (w, natural, info["column"])  # own size or full width
        if y + h > im.height:
            continue
        heights = glyph_heights(im.crop((int(x), int(y), int(x + w), int(y + h))))
        assert len(heights) >= 20, (x, y, w, h)  # the figure's text is found
        assert np.percentile(heights, 75) >= MIN_TEXT_PX, (y, w, natural, np.bincount(heights))
        measured += 1
    assert measured >= 8
    # the probe itself: the same figures at 45 % of their size measure below the bar
    small = tmp_path / "small"
    small.mkdir()
    squeezed = small / "page.html"
    squeezed.write_text(page.read_text().replace("</style>", "figure img { width: 45%; }</style>", 1))
    info, im = _screenshot(squeezed, small)
    x, y, w, h, _ = max(info["rects"], key=lambda r: r[2] * r[3])
    assert np.percentile(glyph_heights(im.crop((int(x), int(y), int(x + w), int(y + h)))), 75) < MIN_TEXT_PX


#: the README quickstart's report (two scans of a 30-layer model at 256 positions and a slash run) stays
#: under this many bytes
QUICKSTART_PAGE_BUDGET = 5_000_000


def test_quickstart_page_within_budget(tmp_path):
    """The quickstart page's weight is its two scans' score-map grids (raw, diagonal-normalised and the
    first 64 positions, 30 layers of 256 positions each); the report's own plots and the slash
    figure add under 1 MB. Drawn from i.i.d. noise (the least compressible map) and embedded as the
    report embeds them, the grids leave that room within the budget."""
    import torch

    from poslens.figures import ZOOM_POSITIONS, score_map_figures
    from poslens.reporting.elements import embed_file

    S = 256
    x = torch.randn(30, S, S, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = x.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("nan"))
    files = score_map_figures(x, tmp_path, zoom=ZOOM_POSITIONS)
    sizes = {f: len(embed_file(tmp_path / f)) for f in files if f != "scores_diagnorm.png"}
    assert set(sizes) == {"scores_raw.png", "scores_zoom.png"}
    grids = 2 * (2 * sizes["scores_raw.png"] + sizes["scores_zoom.png"])  # the diagonal-normalised grid: as raw
    assert grids + 1_000_000 <= QUICKSTART_PAGE_BUDGET, sizes
    assert sizes["scores_raw.png"] < (tmp_path / "scores_raw.png").stat().st_size / 2  # the palette's saving


def test_heat_maps_leave_the_causal_triangle_blank():
    """A causal map given with zeros above the diagonal is drawn with that triangle blank (masked), as
    NaN would be; a bidirectional map keeps its upper triangle."""
    import numpy as np
    import torch

    from poslens.figures import blank_causal_triangle, heatmap
    from poslens.rundir.figures import new_figure

    causal = torch.tril(torch.rand(6, 6) + 0.1)
    fig, ax = new_figure()
    im = heatmap(ax, causal)
    mask = np.ma.getmaskarray(im.get_array())
    upper = np.triu(np.ones((6, 6), dtype=bool), 1)
    assert mask[upper].all() and not mask[~upper].any()
    full = torch.rand(6, 6) + 0.1
    assert np.isfinite(blank_causal_triangle(full.numpy())).all()
    assert np.array_equal(blank_causal_triangle(np.zeros((3, 3))), np.zeros((3, 3)))  # all zero: as given


def test_companions_of_one_line_differ_in_dash_pattern():
    """Two companions in one panel (with key 0, not noise-corrected) must not look alike: each gets the next
    dash pattern, in the colour of its line; the next run's line starts the patterns again."""
    from poslens.reporting.plots import COMPANION_STYLES, layer_lines
    from poslens.rundir.figures import close_figure

    series = [{"label": "a", "layers": [0, 1], "values": [0.9, 0.8]},
              {"label": "a: with key 0", "layers": [0, 1], "values": [0.5, 0.4], "dashed": True},
              {"label": "a: not noise-corrected", "layers": [0, 1], "values": [0.7, 0.6], "dashed": True},
              {"label": "b", "layers": [0, 1], "values": [0.3, 0.2]},
              {"label": "b: with key 0", "layers": [0, 1], "values": [0.1, 0.1], "dashed": True}]
    fig = layer_lines([{"title": "relativity index", "series": series, "ref": 0.01}])
    ax = fig.axes[0]
    lines = {l.get_label(): l for l in ax.get_lines()}
    assert [lines[s["label"]].get_linestyle() for s in series] == ["-", COMPANION_STYLES[0], COMPANION_STYLES[1],
                                                                   "-", COMPANION_STYLES[0]]
    assert COMPANION_STYLES[0] != COMPANION_STYLES[1]
    a, a_uncorrected, b = (lines[series[i]["label"]] for i in (0, 2, 3))
    assert a_uncorrected.get_color() == a.get_color() != b.get_color()
    assert [l.get_ydata()[0] for l in ax.get_lines() if l.get_label().startswith("_")] == [0.01]  # the reference
    close_figure(fig)
