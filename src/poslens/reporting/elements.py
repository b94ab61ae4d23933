"""Page elements of the report: short tables in the one number format (empty and all-zero tables
said in a sentence instead), and figures embedded as ``data:`` URIs."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any, Iterable

from poslens.fmt import fmt
from poslens.rundir.figures import figure_png

_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".svg": "image/svg+xml", ".webp": "image/webp"}


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
_NUMERIC = re.compile(r"^[-+−–]?[\d.,]+(e[-+]?\d+)?( ± [\d.,e+-]+)?$|^(–|flat|yes|no)$")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "x"


#: a numeric table with at least this many entries, this fraction of them 0, is said in a sentence
SPARSE_MIN_ENTRIES, SPARSE_ZERO_FRACTION = 8, 0.9


def _numeric_body(rows: list[list]) -> list[tuple[int, int, float]] | None:
    """``(row, column, value)`` of a table whose cells after the first column are all numbers."""
    out = []
    for i, r in enumerate(rows):
        for j, c in enumerate(r[1:], 1):
            if c is None:
                continue
            if isinstance(c, bool) or not isinstance(c, (int, float)):
                return None
            out.append((i, j, float(c)))
    return out


def sparse_sentence(title: str, columns: list, rows: list) -> str | None:
    """One sentence for a numeric table that is (almost) all zeros, or None for any other table:
    "t: every entry 0" / "t: all 40 entries 0 except κ 0.3, Δ 1: 2"."""
    rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in rows]
    if not rows:
        return f"{title or 'a table'}: no rows"
    body = _numeric_body(rows)
    if not body or len(body) < SPARSE_MIN_ENTRIES:
        return None
    nonzero = [(i, j, v) for i, j, v in body if v != 0]
    if len(nonzero) > (1 - SPARSE_ZERO_FRACTION) * len(body):
        return None
    if not nonzero:
        return f"{title or 'a table'}: all {len(body)} entries 0"
    name = lambda i, j: f"{columns[0]} {fmt(rows[i][0])}, {columns[j] if j < len(columns) else j}"  # noqa: E731
    return (f"{title or 'a table'}: all {len(body)} entries 0 except "
            + "; ".join(f"{name(i, j)}: {fmt(v)}" for i, j, v in nonzero))


def table(title: str, columns: list[str], rows: Iterable[Iterable[Any]], note: str = "",
          definitions: dict | None = None) -> dict | None:
    """A table for the page, or None when it would say nothing: no rows, or a numeric table that
    is (almost) all zeros (a κ × Δ count table; :func:`sparse_sentence` says it in words). Its
    columns' definitions (``defs``, shown under it): ``definitions`` first, then
    :mod:`poslens.reporting.columns`."""
    from poslens.reporting.columns import definitions as _definitions

    def cell(c):
        text = fmt(c)
        return {"v": text, "num": bool(_NUMERIC.match(text))}

    rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in rows]
    if sparse_sentence(title, list(columns), rows) is not None:
        return None
    return {"title": title, "columns": [str(c) for c in columns], "rows": [[cell(c) for c in r] for r in rows],
            "note": note, "defs": _definitions([str(c) for c in columns], definitions)}


#: colours of an embedded PNG's palette: a matplotlib colour map has 256 entries, so a heat map's
#: colours survive (every channel within a few levels of 255); the page weighs a quarter as much
PALETTE_COLOURS = 256


def compact_png(data: bytes) -> bytes:
    """A PNG re-encoded with a palette of :data:`PALETTE_COLOURS` colours (transparency composited
    on white, as the page shows it), or the bytes as given when that is not smaller or not a PNG."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format != "PNG" or im.mode == "P":
                return data
            im = im.convert("RGBA")
            flat = Image.new("RGB", im.size, (255, 255, 255))
            flat.paste(im, mask=im.getchannel("A"))
            buf = io.BytesIO()
            flat.quantize(PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE).save(buf, "PNG", optimize=True)
    except (OSError, ValueError, Image.DecompressionBombError):
        return data
    out = buf.getvalue()
    return out if len(out) < len(data) else data


def embed_file(path: Path) -> str | None:
    """``data:`` URI of an image file (a PNG with a palette: :func:`compact_png`), or None if it
    is missing or not an image."""
    mime = _MIME.get(path.suffix.lower())
    if mime is None or not path.is_file():
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data:
        return None
    return embed_bytes(data, mime)


def png_width(uri: str) -> int | None:
    """Pixel width of a ``data:image/png`` URI (from its IHDR chunk), else None."""
    head = "data:image/png;base64,"
    if not uri.startswith(head):
        return None
    try:
        raw = base64.b64decode(uri[len(head): len(head) + 44])
    except ValueError:
        return None
    return int.from_bytes(raw[16:20], "big") if raw[12:16] == b"IHDR" else None


def embed_bytes(data: bytes, mime: str = "image/png") -> str:
    """``data:`` URI of image bytes; a PNG is re-encoded with a palette (:func:`compact_png`)."""
    if mime == "image/png":
        data = compact_png(data)
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def embed_figure(fig, dpi: int = 100) -> str:
    """A matplotlib figure as a ``data:`` PNG URI (the figure is closed)."""
    return embed_bytes(figure_png(fig, dpi))


def _inside(base: Path, rel: str) -> Path | None:
    """``base / rel`` if it stays inside ``base`` (summary files never point elsewhere)."""
    try:
        p = (base / rel).resolve()
        p.relative_to(base.resolve())
    except (ValueError, OSError):
        return None
    return p
