"""``poslens explore`` (:func:`poslens.explore`): an interactive page of heads, layers, maps and comparisons, one offline HTML file.

:func:`poslens.explore` takes run directories (or results) of ``poslens scan`` and ``poslens compare``
and returns an :class:`Explorer` (made by :func:`build`): its ``html``, written to ``out`` when given, shown inline in Jupyter.
The page holds its data (float16 maps, block-averaged to at most 128 x 128; :mod:`poslens.explorer.data`)
and Plotly's offline bundle (:mod:`poslens.explorer.page`); it never needs the model.
"""

from __future__ import annotations

import html as _html
import os
from pathlib import Path

from poslens.errors import OptionError, PoslensError


class Explorer:
    """One explorer page: ``html`` (the whole self-contained file), ``path`` once written, ``notes``
    (what the runs lack, with the option that adds it), ``runs`` (their directories)."""

    def __init__(self, html: str, runs: list[Path], notes: list[str], path: Path | None = None):
        self.html, self.runs, self.notes, self.path = html, runs, notes, path

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the page to ``path`` (a new file, or an existing one with ``overwrite=True``), atomically."""
        self.path = write_page(self.html, Path(path), overwrite=overwrite)
        return self.path

    def __repr__(self) -> str:
        where = str(self.path) if self.path else "not saved (see save())"
        return f"<poslens.Explorer of {len(self.runs)} run{'s' if len(self.runs) != 1 else ''}, " \
               f"{len(self.html) / 1e6:.1f} MB; {where}>"

    def _repr_html_(self) -> str:
        """Jupyter's inline view: the page in a sandboxed frame of its own."""
        return (f'<iframe srcdoc="{_html.escape(self.html, quote=True)}" style="width:100%;height:900px;border:0" '
                'sandbox="allow-scripts" title="poslens explorer"></iframe>')


def check_out(out: Path, *, overwrite: bool = False) -> None:
    """Refuse an output that is not a new ``.html`` file (or, with ``overwrite``, an existing one)."""
    shown = str(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise OptionError("--out", str(out), "the explorer is an HTML page; pass a file name ending in .html.",
                          shown=shown)
    if out.is_dir():
        raise OptionError("--out", str(out), f"is a directory; pass a file name such as {out / 'explore.html'}.",
                          shown=shown, sep=" ")
    if out.exists() and not overwrite:
        raise OptionError("--out", str(out), "already exists; pass {overwrite!} to replace it, or choose a new file "
                          "name.", shown=shown, sep=" ")


def write_page(html: str, out: Path, *, overwrite: bool = False) -> Path:
    """Write ``html`` to ``out`` atomically: through a temporary file beside it, linked into place
    only if ``out`` does not exist yet (``overwrite``: replacing it)."""
    from poslens.rundir.io import _atomic_write_bytes

    check_out(out, overwrite=overwrite)
    try:
        _atomic_write_bytes(out, html.encode("utf-8"), exclusive=not overwrite)
    except FileExistsError:  # another process made it meanwhile: it is kept
        raise OptionError("--out", str(out), "was written by another process meanwhile; pass {overwrite!} to replace "
                          "it, or choose a new file name.", shown=str(out), sep=" ") from None
    return out


def build(results: list, *, title: str = "poslens explorer") -> Explorer:
    """The page of loaded results (:class:`poslens.Result` objects of scan and compare runs): every run is
    read and checked before the page is made (:func:`poslens.explore`, the public face, loads run
    directories and writes the file)."""
    from poslens.explorer.data import page_data
    from poslens.explorer.page import render_page

    data, blob = page_data(results)
    notes = [f"{r['label']}: {n}" for r in data["runs"] for n in r["notes"]]
    return Explorer(render_page(data, blob, title=title), [r.path for r in results], notes)
