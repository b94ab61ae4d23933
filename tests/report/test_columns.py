"""Every table column the report can show is defined on the page: the column names commands write
(found in the source, so a new column without a definition fails here) and the tables of a rendered
page, each followed by its definition list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from poslens.reporting.columns import COLUMNS, definition, definitions
from poslens.reporting.elements import table

SRC = Path(__file__).resolve().parents[2] / "src" / "poslens"


#: modules whose tables go to the terminal only (their short headers are explained in the readings printed
#: with them), never onto a page
TERMINAL_ONLY = {"reporting/terminal.py"}


def _string_items(node) -> list[str]:
    """The plain string constants of a list literal or a sum of lists (f-strings are columns named after
    a parameter: :data:`poslens.reporting.columns.PATTERNS`, checked by example below)."""
    if isinstance(node, ast.BinOp):
        return _string_items(node.left) + _string_items(node.right)
    if not isinstance(node, ast.List):
        return []
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def written_columns() -> dict[str, str]:
    """Column name -> the file that writes it: list literals under a ``"columns"`` key, assigned to a
    name ending in ``cols`` or ``COLUMNS``, or given as the columns of the report's ``table(...)``."""
    out: dict[str, str] = {}
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).as_posix() in TERMINAL_ONLY:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            lists = []
            if isinstance(node, ast.Dict):
                lists += [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "columns"]
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id.lower().endswith(("cols", "columns")) for t in targets):
                    lists.append(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "table" \
                    and len(node.args) >= 2:
                lists.append(node.args[1])
            for lst in lists:
                for v in _string_items(lst):
                    out.setdefault(v, str(path.relative_to(SRC)))
    return out


def test_every_column_a_command_writes_is_defined():
    cols = written_columns()
    # the scan found the tables of the commands that write them
    for c in ("layer.head", "SlashScore", "q σ1²/Σσ²", "APS causal (mean ± std)", "delta_loss", "verdict",
              "shape (layers x width)", "trait", "best cosine r (layer)", "non-relativity with key 0"):
        assert c in cols, c
    missing = {c: f for c, f in cols.items() if c.strip() and definition(c) is None}
    assert not missing, missing


def test_columns_named_after_a_parameter_are_defined():
    from poslens.metrics.probes import FEATURES, PROBES

    for c in ["κ=0.1", "κ=0.35", "heads at κ=0.1", "SlashScore(1) in-dist.", "SlashScore(12) random"] + [
            f"{f} {p} r / MSE" for f in FEATURES for p in PROBES]:
        d = definition(c)
        assert d, c
        assert "{" not in d, d
    assert "0.35" in definition("κ=0.35") and "12" in definition("SlashScore(12) random")
    assert definition("no such column") is None


def test_a_table_carries_its_definitions_its_own_first():
    t = table("t", ["layer.head", "own", "nothing known"], [["0.1", 1, 2]], definitions={"own": "my column"})
    assert t["defs"] == [("layer.head", definition("layer.head")), ("own", "my column")]
    assert definitions(["layer"], {"layer": 3}) == [("layer", definition("layer"))]  # a definition must be text


_TABLE = re.compile(r'<div class="tablewrap">\s*<table>(.*?)</table>\s*</div>\s*(?:<p class="tnote">.*?</p>\s*)?'
                    r'(?:<dl class="coldefs">(.*?)</dl>)?', re.S)


def page_tables(html: str) -> list[tuple[list[str], list[str]]]:
    """``(column headers, defined columns)`` of every table of a report page."""
    return [(re.findall(r'<th scope="col">(.*?)</th>', body), re.findall(r"<dt>(.*?)</dt>", defs or ""))
            for body, defs in _TABLE.findall(html)]


def test_page_defines_every_column_of_every_table(tmp_path):
    """A report of a slash run and two trained models (their tables: κ × Δ counts, top heads,
    persistence; models side by side) defines each column right under its table."""
    import torch

    from poslens.analysis.slash import SlashConfig, run_slash
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.models.families import build_model
    from poslens.reporting import render_report
    from poslens.rundir.io import write_json

    runs = []
    for pe in ("none", "rope"):
        mdir = tmp_path / f"model_{pe}"
        build_model(pe, "micro").save_pretrained(str(mdir))
        write_json(mdir / "summary.json", {"pe": pe, "data": "stdlib", "steps": 3, "final_loss": 5.1})
        runs.append(mdir)
    for name, seed in (("scan", 0), ("scan_random", 1)):
        torch.manual_seed(0)
        run_scan(ScanConfig(model_dir=str(tmp_path / "model_rope"), out=str(tmp_path / name), data="random",
                            seq_len=16, num_seqs=2, batch_size=2, seed=seed), progress=False)
    run_slash(SlashConfig(scan_dir=str(tmp_path / "scan"), random_scan=str(tmp_path / "scan_random"),
                          out=str(tmp_path / "slash"), kappa=(0.01, 0.05), max_delta=4, figures=False))
    html = render_report([tmp_path / "slash", *runs], title="columns")
    tables = page_tables(html)
    assert len(tables) >= 3 and html.count("<table>") == len(tables)
    for cols, defined in tables:
        assert cols and cols == defined, (cols, defined)
    # the contents name the micro model by its name, not by its architecture (model_type smollm3)
    nav = html[html.index("<nav"): html.index("</nav>")]
    assert "model_rope" in nav and "smollm3" not in nav


def _fingerprint_summary() -> dict:
    """A fingerprint summary with every table of the page filled: one model with five layer types (the four
    named ones and a kind no table knows), a slash head and a massive dim of each of Q and K."""
    overall = {"layers": 4, "rope_layers": 3, "sink_rate": 0.5, "sink_rate_random": 0.25, "slash_heads": 1,
               "slash_persist": 1, "relativity_median": 0.9, "nonflat_layers": 3, "trend_mean": 0.1, "aps_min": 0.5,
               "aps_max": 0.7, "freq": {"high": 0.2, "medium": 0.3, "low": 0.5}, "massive_q": 1,
               "massive_q_low_share": 1.0, "massive_k": 1, "massive_k_low_share": 0.0}
    dim = {"layer": 0, "head": 1, "dim": 7, "pair": 3, "band": "low", "ratio": 6.5}
    head = {"layer": 0, "head": 1, "delta": 2, "score": 0.6, "score_random": 0.5, "persists": True,
            "q_top1_energy": 0.9, "k_top1_energy": 0.8, "predicted_delta": 2}
    model = {"name": "m & co", "overall": overall, "slash_heads": [head], "massive": {"q": [dim], "k": [dict(dim, pair=None)]},
             "layer_types": {t: overall for t in ("rope", "no_rope", "sliding_attention", "full_attention", "yarn")}}
    return {"num_seqs": 2, "seq_len": 16, "models": [model]}


def test_every_fingerprint_column_is_defined():
    """The fingerprint page's tables (traits, traits per layer type, slash heads, massive dims) define every
    column: a model's column by the table itself, a layer type by columns.LAYER_TYPES, every other by
    columns.COLUMNS."""
    from poslens.reporting.columns import LAYER_TYPES, layer_type
    from poslens.reporting.fingerprint import page_tables

    s = _fingerprint_summary()
    sections = page_tables(s)
    assert [len(v) for v in sections.values()] == [1, 1, 1, 1]
    for ts in sections.values():
        for t in ts:
            assert [c for c, _ in t["defs"]] == t["columns"], t["title"]
    overview, by_type = sections["overview"][0], sections["by_type"][0]
    assert overview["columns"][1:] == ["m & co"] and "m & co" in dict(overview["defs"])["m & co"]
    types = by_type["columns"][1:]
    assert dict(by_type["defs"])["yarn"] == layer_type("yarn") and "'yarn'" in layer_type("yarn")
    assert all(dict(by_type["defs"])[t] == LAYER_TYPES[t] for t in types if t != "yarn")
    named = {c for ts in sections.values() for t in ts for c in t["columns"]} - {"m & co", *types}
    assert {"trait", "layer.head", "Q/K", "RMS / mean", "persists"} <= named
    missing = [c for c in named if c not in COLUMNS]
    assert not missing, missing
    # the trait column's definition explains each row of the table
    from poslens.reporting.fingerprint import TRAIT_ROWS

    for label, _ in TRAIT_ROWS:
        assert label in COLUMNS["trait"], label
