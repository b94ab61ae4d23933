"""The explorer in a real browser: Playwright (Python) driving Debian's chromium by its executable path,
headless, every request off the file itself blocked and recorded.

Skipped, saying why, only where ``/usr/bin/chromium`` or the ``playwright`` package is absent
(``scripts/test`` installs both); where both are there, a page that fails to start fails the test.
The screenshots of ``docs/explore.md`` are taken here: ``POSLENS_DOCS_SCREENSHOTS=1`` writes them into
``docs/`` (otherwise into the test's temporary folder).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from real_models import real_model_file

CHROMIUM = "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (install Debian's chromium package: apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is absent (pip install playwright; scripts/test installs it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


class Page:
    """One explorer page open in the browser, with its console messages and the requests it tried."""

    def __init__(self, browser, path: Path):
        self.ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.requests: list[str] = []
        self.console: list[str] = []

        def route(r):
            if r.request.url.startswith(("file:", "data:", "blob:")):
                return r.continue_()
            self.requests.append(r.request.url)
            return r.abort()

        self.ctx.route("**/*", route)
        self.page = self.ctx.new_page()
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        t0 = time.perf_counter()
        self.page.goto(path.as_uri())
        self.page.wait_for_function("document.body.dataset.ready !== '0'", timeout=60_000)
        self.seconds = time.perf_counter() - t0
        assert self.page.evaluate("document.body.dataset.ready") == "1", self.page.inner_text("#error")

    def js(self, expr: str, arg=None):
        return self.page.evaluate(expr, arg)

    def close(self):
        self.ctx.close()


def shot(page: Page, name: str, tmp: Path) -> None:
    where = DOCS if os.environ.get("POSLENS_DOCS_SCREENSHOTS") else tmp
    page.page.screenshot(path=str(where / f"explore-{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def smollm2_runs(tmp_path_factory):
    """SmolLM2-135M (30 layers, 9 heads): a text scan and a random-token scan with every head's map."""
    import poslens

    model = real_model_file("smollm2")
    root = tmp_path_factory.mktemp("explore_real")
    runs = {}
    for data in ("stdlib", "random"):
        runs[data] = poslens.scan(str(model), data=data, seq_len=128, num_seqs=2, batch_size=2, heads="all",
                                  out=root / f"scan_{data}", progress=False)
    return runs


@pytest.fixture(scope="module")
def smollm2_page(smollm2_runs, tmp_path_factory):
    import poslens

    out = tmp_path_factory.mktemp("explore_page") / "explore.html"
    page = poslens.explore(smollm2_runs["stdlib"], smollm2_runs["random"], out=out)
    return out, page


@pytest.mark.real_model
def test_smollm2_page_loads_clean_and_shows_the_clicked_head(browser, smollm2_runs, smollm2_page, tmp_path):
    out, _ = smollm2_page
    size = out.stat().st_size
    print(f"\nexplorer page of SmolLM2 (30 x 9 heads, 128 x 128 maps): {size / 1e6:.2f} MB")
    assert size <= 10e6
    p = Page(browser, out)
    try:
        print(f"explorer page of SmolLM2: loaded and drawn in {p.seconds:.2f} s "
              f"(in the page: {p.js('document.body.dataset.unpackMs')} ms to unpack Plotly and the data, "
              f"{p.js('document.body.dataset.loadMs')} ms to the first view drawn)")
        assert p.console == [] and p.requests == []
        # click layer 16, head 0 on the grid (rows are layers from 0 at the top, columns heads)
        box = p.page.locator("#head-grid .nsewdrag").first.bounding_box()
        L, H = 30, 9
        p.page.mouse.click(box["x"] + box["width"] * (0 + 0.5) / H, box["y"] + box["height"] * (16 + 0.5) / L)
        p.page.wait_for_function("document.getElementById('head-numbers').dataset.layer === '16'")
        assert p.js("document.getElementById('head-numbers').dataset.head") == "0"
        assert p.page.inner_text("#head-title") == "layer 16, head 0"
        # the map the page draws for it equals the run's tensor, to float16
        shown = np.array(p.js("document.getElementById('head-map').data[0].z"), dtype=np.float64)
        r = smollm2_runs["stdlib"]
        want = r.maps["head_maps"][16, 0].half().double().numpy()
        visible = np.tril(np.ones_like(want, dtype=bool))
        assert np.isnan(np.where(visible, 0.0, shown)[~visible].astype(float)).all()
        np.testing.assert_array_equal(shown[visible], want[visible])
        # the sink value shown is heads()'s
        row = r.heads().query("layer == 16 and head == 0").iloc[0]
        cell = p.page.locator("#head-numbers td[data-key='sink']")
        assert float(cell.get_attribute("data-value")) == pytest.approx(row["sink"], rel=1e-5)
        assert float(cell.inner_text()) == pytest.approx(row["sink"], rel=1e-3)
        # the random-token control's profile is drawn beside the head's
        names = p.js("document.getElementById('head-profile').data.map(t => t.name)")
        assert "random-token control" in names
        shot(p, "heads", tmp_path)
        # arrow keys move the selection
        p.page.locator("#head-grid").focus()
        p.page.keyboard.press("ArrowDown")
        p.page.keyboard.press("ArrowRight")
        assert (p.js("poslens.state.layer"), p.js("poslens.state.head")) == (17, 1)
        assert p.js("document.getElementById('head-numbers').dataset.layer") == "17"
        p.page.keyboard.press("ArrowUp")
        p.page.keyboard.press("ArrowLeft")
        p.page.keyboard.press("ArrowLeft")  # stops at head 0
        assert (p.js("poslens.state.layer"), p.js("poslens.state.head")) == (16, 0)
        # switching the reading sets the legend's range to that reading's range
        df = r.heads()
        for key, column in (("slash_score", "slash_score"), ("sink", "sink")):
            p.page.select_option("#head-reading", key)
            trace = p.js("(() => { const t = document.getElementById('head-grid').data[0]; return [t.zmin, t.zmax]; })()")
            assert trace == pytest.approx([df[column].min(), df[column].max()], rel=1e-5)
        p.page.click("#tab-layers")
        p.page.wait_for_timeout(200)
        shot(p, "layers", tmp_path)
        assert p.console == [] and p.requests == []
    finally:
        p.close()


@pytest.fixture(scope="module")
def compare_page(tiny, tmp_path_factory):
    """A comparison of a tiny random Llama with key 0 masked in layer 1: its heads change, layer 0's do not."""
    import poslens

    root = tmp_path_factory.mktemp("explore_compare")
    r = poslens.compare(str(tiny), variants=["sink-off@1"], data="random", seq_len=[32, 48], num_seqs=16,
                        noise_groups=16, progress=False, out=root / "cmp")
    return r, poslens.explore(r, out=root / "explore.html").path


def test_compare_greyed_cells_are_the_unchanged_ones(browser, compare_page, tmp_path):
    r, path = compare_page
    p = Page(browser, path)
    try:
        assert p.console == [] and p.requests == []
        assert p.js("poslens.state.view") == "compare"
        seen_changed = seen_unchanged = 0
        for reading in ("sink", "entropy", "distance"):
            for S in (32, 48):
                p.page.select_option("#compare-reading", reading)
                p.page.select_option("#compare-length", str(S))
                grey = p.js("document.getElementById('change-grid').data[0].z")  # the grey trace: unchanged cells
                greyed = {(l, h) for l, row in enumerate(grey) for h, v in enumerate(row) if v is not None}
                df = r.changes(reading, seq_len=S)
                cells = df[df["head"].notna()]
                unchanged = {(int(c.layer), int(c.head)) for c in cells.itertuples() if c.verdict == "unchanged"}
                assert greyed == unchanged, (reading, S)
                seen_changed += len(cells) - len(unchanged)
                seen_unchanged += len(unchanged)
        assert seen_changed > 0 and seen_unchanged > 0  # the test saw both kinds of cell
        p.page.locator("#change-grid").focus()
        p.js("poslens.selectCell(1, 2)")
        assert p.page.inner_text("#compare-title").startswith("layer 1, head 2")
        maps = p.js("['compare-a', 'compare-b', 'compare-diff'].map(id => document.getElementById(id).data[0].z.length)")
        assert maps == [48, 48, 48]
        shot(p, "compare", tmp_path)
        p.page.click("#tab-lengths")
        p.page.wait_for_timeout(200)
        assert p.js("document.getElementById('length-plot').data.length") == 2
        assert p.console == [] and p.requests == []
    finally:
        p.close()


def test_a_scan_without_per_head_maps_shows_what_it_has(browser, tiny, tmp_path):
    import poslens

    r = poslens.scan(str(tiny), data="random", seq_len=16, num_seqs=2, progress=False, out=tmp_path / "scan")
    longer = poslens.scan(str(tiny), data="random", seq_len=32, num_seqs=2, progress=False)
    page = poslens.explore(r, longer, out=tmp_path / "explore.html")
    assert len(page.notes) == 2
    msg = page.notes[0]
    assert "--heads all" in msg
    p = Page(browser, page.path)
    try:
        assert p.console == [] and p.requests == []
        note = p.page.inner_text("#notes")
        assert note and msg.endswith(note.rstrip("."))  # the page shows the run's note
        assert p.js("document.getElementById('head-grid').data[0].z.length") == 2  # the grid is there
        assert p.js("document.getElementById('head-map').hidden") is True  # no map to draw
        # two lengths of one model: the lengths view, one point per length, the trained context marked
        p.page.click("#tab-lengths")
        assert p.js("document.getElementById('length-plot').data[0].x") == [16, 32]
        assert p.js("document.getElementById('length-plot').layout.shapes[0].x0") == 64
        assert p.console == []
    finally:
        p.close()


def test_the_inline_view_starts_in_its_frame(browser, tiny, tmp_path):
    """Jupyter's view (``_repr_html_``): the page in a sandboxed frame, drawn without errors."""
    import poslens

    r = poslens.scan(str(tiny), data="random", seq_len=16, num_seqs=2, progress=False)
    host = tmp_path / "notebook.html"
    host.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><title>cell</title></head><body>"
                    + r.explore()._repr_html_() + "</body></html>")
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(host.as_uri())
        frame = next(f for f in page.frames if f is not page.main_frame)
        frame.wait_for_function("document.body.dataset.ready !== '0'", timeout=60_000)
        assert frame.evaluate("document.body.dataset.ready") == "1" and errors == []
        assert frame.evaluate("document.getElementById('head-grid').data[0].z.length") == 2
    finally:
        ctx.close()
