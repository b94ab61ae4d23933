"""What every fault test checks: one ``poslens: error:`` line and exit 2, and a tree of files
compared byte for byte before and after."""

from __future__ import annotations

from pathlib import Path

#: a scan of the tiny model small enough for a test
SCAN = ["--data", "random", "--seq-len", "8", "--num-seqs", "2", "--quiet", "--threads", "1", "--no-figures"]


def one_error(code: int, err: str, *expect: str) -> str:
    """Exit 2, one ``poslens: error:`` line, no traceback; each of ``expect`` in it."""
    lines = err.strip().splitlines()
    assert code == 2, (code, err[-3000:])
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("poslens: error: "), err[-3000:]
    for e in expect:
        assert e in lines[0], lines[0]
    return lines[0]


def tree(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` (dotfiles included, the run lock excluded) and its bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*"))
            if p.is_file() and p.name != ".poslens.lock"}
