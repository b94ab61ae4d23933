"""One progress-bar style for every long-running poslens command (rich).

The convention: a library function that runs long takes ``progress: bool`` and draws its bar with
:func:`task_progress` (on stderr); a caller that draws its own bar (the demo, ``reproduce``) passes a
callback ``progress(done, total)`` instead and the function stays silent."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def make_progress(transient: bool = False) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), transient=transient, console=Console(stderr=True),
    )


@contextlib.contextmanager
def task_progress(description: str, total: int, enabled: bool = True, *, done: int = 0
                  ) -> Iterator[Callable[..., None]]:
    """Context manager yielding ``update(done, total=None, info="")`` that drives one progress bar
    (``done``: where a resumed run starts)."""
    if not enabled:
        yield lambda done, total=None, info="": None
        return
    with make_progress() as prog:
        tid = prog.add_task(description, total=total, completed=done, info="")

        def update(done: int, total_: int | None = None, info: str = "") -> None:
            prog.update(tid, completed=done, total=total_ or total, info=info)

        yield update
