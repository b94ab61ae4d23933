"""Parsers of the CLI's list-valued options. Those of a scan's options (layers, heads) are declared with
the options, in :mod:`poslens.capture.scan.options`, since :func:`poslens.scan` takes the same text."""

from __future__ import annotations

from poslens.capture.scan.options import parse_heads, parse_int_list  # noqa: F401
from poslens.errors import PoslensError


def parse_floats(text: str, flag: str) -> list[float]:
    """``"0.1,0.3"`` -> ``[0.1, 0.3]``; a one-line error naming ``flag`` for anything else or nothing."""
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise PoslensError(f"{flag} {text!r}: expected comma-separated numbers, e.g. 0.002,0.02,0.2.") from None
    if not vals:
        raise PoslensError(f"{flag}: give at least one value.")
    return vals
