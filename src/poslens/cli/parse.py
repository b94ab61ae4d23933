"""Parsers of the CLI's list-valued options (the library takes lists, never option strings)."""

from __future__ import annotations

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


def parse_int_list(text: str | None, flag: str) -> list[int] | None:
    """``"0,2,5-7"`` -> ``[0, 2, 5, 6, 7]``; None/empty -> None."""
    if text is None or str(text).strip() in ("", "all"):
        return None
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise PoslensError(f"{flag} {text!r}: expected comma-separated integers or ranges like 0,2,5-7.") from None
    return sorted(set(out))


def parse_heads(text: str | None) -> list[tuple[int, int]]:
    """``"3.5,10.2"`` -> ``[(3, 5), (10, 2)]`` (layer.head)."""
    if not text:
        return []
    out = []
    for part in str(text).split(","):
        try:
            l, h = part.strip().split(".")
            out.append((int(l), int(h)))
        except ValueError:
            raise PoslensError(f"--heads {text!r}: expected LAYER.HEAD pairs separated by commas, e.g. 3.5,10.2.") from None
    return sorted(set(out))
