"""One progress convention for every long-running poslens command (rich, on stderr).

``task_progress(description, total)`` yields ``update(done, total=None, info="")``. A bar fits 80
columns (the description and the info are cut with an ellipsis, never wrapped onto a second line,
which is what leaves frozen copies of a bar on a terminal) and is cleared when it finishes: the
caller prints its result line in its place, so results never run into a bar.

Nesting: while one display is live (``live_display()``, the demo's step bar), an inner
``task_progress`` (a training run inside that step) adds its bar to the same display instead of
starting a second one — rich allows one live display at a time — and removes it when done.
A caller that prints results while its bars are live passes its console to ``live_display``:
rich coordinates bars and prints only on one console (another console's prints would land on the
bar's line and leave a frozen copy of it).

A library function that runs long takes ``progress: bool`` and draws its bar with
:func:`task_progress`; a caller that draws its own bar (the demo, ``reproduce``) passes a callback
instead and the function stays silent. A callback has the signature of ``update`` above,
``(done, total=None, info="")`` (``info``: what runs now, e.g. the experiment's name), so the
``update`` of a :func:`task_progress` block can be passed as it is; a function may call it with
``(done, total)`` alone (:func:`poslens.simulate.run_simulation`).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

#: the live displays, innermost last (a stack, so nested displays restore the outer one)
_LIVE: list[Progress] = []


def make_progress(transient: bool = True, console: Console | None = None) -> Progress:
    """A progress display that fits 80 columns: description (<= 22), bar, done/total, info (<= 20),
    time remaining. On stderr unless ``console`` is given."""
    return Progress(
        TextColumn("{task.description}", table_column=Column(max_width=22, no_wrap=True, overflow="ellipsis")),
        BarColumn(bar_width=14), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}", table_column=Column(max_width=20, no_wrap=True, overflow="ellipsis")),
        TimeRemainingColumn(), transient=transient, console=console or Console(stderr=True),
    )


@contextlib.contextmanager
def live_display(console: Console | None = None) -> Iterator[Progress]:
    """A live display that inner :func:`task_progress` calls add their bars to (cleared at the end);
    print results meanwhile on ``console`` (default: a stderr console)."""
    with make_progress(console=console) as prog:
        _LIVE.append(prog)
        try:
            yield prog
        finally:
            _LIVE.remove(prog)


@contextlib.contextmanager
def task_progress(description: str, total: int | None, enabled: bool = True, *, done: int = 0
                  ) -> Iterator[Callable[..., None]]:
    """Context manager yielding ``update(done, total=None, info="")`` that drives one progress bar
    (``done``: where a resumed run starts)."""
    if not enabled:
        yield lambda done, total=None, info="": None
        return
    with contextlib.ExitStack() as stack:
        prog = _LIVE[-1] if _LIVE else stack.enter_context(live_display())
        tid = prog.add_task(description, total=total, completed=done, info="")

        def update(done: int, total_: int | None = None, info: str = "") -> None:
            prog.update(tid, completed=done, total=total_ or total, info=info)

        try:
            yield update
        finally:
            prog.remove_task(tid)
