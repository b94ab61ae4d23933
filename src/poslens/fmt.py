"""One number format for every table, reading and report page, and 80-column terminal tables.

``fmt(0.98431) == "0.984"``, ``fmt(21651.977) == "21,652"``, ``fmt(0.000897) == "8.97e-4"``,
``fmt(None) == "–"``: three significant digits, thousands separators from 1,000 on, scientific
notation only below 0.001, and a dash for missing or masked (NaN) entries; ``fmt(0.96, signed=True)
== "+0.96"`` where the sign is the point (trends); ``fmt(None, missing="flat") == "flat"`` where a
missing value has a meaning (the relativity index of a flat map).

This is the only number formatter for display. Numbers that are stored (``summary.json``
tables, records) stay numbers at full precision: the terminal and the report format them.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

#: what a missing, masked (NaN) or non-finite entry reads as
MISSING = "–"


def fmt(v: Any, *, signed: bool = False, missing: str = MISSING) -> str:
    """A number (or anything) as text, in the one format used everywhere (``signed``: a ``+`` on
    positive numbers; ``missing``: the text of None, NaN and infinities)."""
    if signed:
        text = fmt(v, missing=missing)
        return "+" + text if text[:1].isdigit() and text != "0" else text
    if v is None:
        return missing
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float) or hasattr(v, "item") and not isinstance(v, str):
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v)
        if not math.isfinite(f):
            return missing
        if f == 0:
            return "0"
        a = abs(f)
        if a >= 1000:
            return f"{f:,.0f}"
        if a >= 1e-3:
            text = f"{f:.3g}"
            return text if "e" not in text else f"{f:,.0f}"
        mant, exp = f"{f:.2e}".split("e")
        return f"{mant}e{int(exp)}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x, missing=missing) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, default=str)
    return str(v)


def fmt_pm(mean: Any, std: Any) -> str:
    """``mean ± std`` in the one format (just the mean when the std is missing)."""
    m = fmt(mean)
    return m if std is None or fmt(std) == MISSING else f"{m} ± {fmt(std)}"


def layers_text(ls: list[int]) -> str:
    """``[3]`` -> "layer 3"; ``[20, ..., 29]`` -> "layers 20–29"; ``[1, 4]`` -> "layers 1, 4"."""
    if len(ls) == 1:
        return f"layer {ls[0]}"
    runs, start = [], ls[0]
    for a, b in zip(ls, ls[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}–{a}")
            start = b
    return "layers " + ", ".join(runs)


#: the terminal width every table is made to fit
TERMINAL_WIDTH = 80


def _one_table(title, cols: list, rows: list, show_header: bool):
    from rich import box
    from rich.table import Table

    t = Table(title=title, show_header=show_header, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
              title_justify="left")

    def numeric_cell(v: Any) -> bool:
        return v is None or isinstance(v, (int, float)) and not isinstance(v, bool) or \
            isinstance(v, str) and v in ("flat", MISSING)

    for i, c in enumerate(cols):
        numeric = bool(rows) and all(numeric_cell(r[i]) for r in rows if i < len(r))
        # a header is never cut: every column is at least as wide as its header
        t.add_column(str(c), justify="right" if numeric else "left", overflow="fold", no_wrap=bool(numeric),
                     min_width=len(str(c)))
    for r in rows:
        t.add_row(*[fmt(x) for x in r])
    return t


def _width(cols: list, rows: list, i: int) -> int:
    """Column ``i``'s width with its header on one line and its cells (long text folded at 24), with its
    padding (one space each side) and the box's divider."""
    cells = [len(fmt(r[i])) for r in rows if i < len(r)]
    return max([len(str(cols[i]))] + [min(c, 24) for c in cells]) + 3


def rich_table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]], *, show_header: bool = True,
               width: int = TERMINAL_WIDTH):
    """A rich renderable that fits a ``width``-column terminal: cells in :func:`fmt`, long text folded
    over lines (never cut to "…"), numbers right-aligned and kept on one line, headers never cut. A
    table too wide for one block is split into blocks of columns, each repeating the first (the row's
    name: ``layer.head``, a layer); the title is printed once above them, folded, never cut."""
    from rich.console import Group
    from rich.text import Text

    rows = [list(r) for r in rows]
    cols = list(columns)
    widths = [_width(cols, rows, i) for i in range(len(cols))]
    width -= 1  # the box's outer edge
    if sum(widths) <= width or len(cols) <= 2:
        return _one_table(title, cols, rows, show_header)
    blocks, cur = [], [0]
    for i in range(1, len(cols)):
        if sum(widths[j] for j in cur) + widths[i] > width and len(cur) > 1:
            blocks.append(cur)
            cur = [0]
        cur.append(i)
    blocks.append(cur)
    parts = [Text(title, style="italic")] if title else []
    for b in blocks:
        parts.append(_one_table(None, [cols[i] for i in b], [[r[i] if i < len(r) else None for i in b] for r in rows],
                                show_header))
    return Group(*parts)


def print_table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]], *, console=None, **kw) -> None:
    """Print :func:`rich_table` on ``console`` (default: stdout, its own width)."""
    from rich.console import Console

    (console or Console()).print(rich_table(title, columns, rows, **kw))
