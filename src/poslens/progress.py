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
``(done, total)`` alone (:func:`poslens.simulator.run_simulation`).
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

#: the live displays, innermost last (a stack, so nested displays restore the outer one)
_LIVE: list[Progress] = []


def _columns():
    return (TextColumn("{task.description}", table_column=Column(max_width=22, no_wrap=True, overflow="ellipsis")),
            BarColumn(bar_width=14), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}", table_column=Column(max_width=20, no_wrap=True, overflow="ellipsis")),
            TimeRemainingColumn())


def in_notebook() -> bool:
    """True inside a Jupyter kernel (rich's own test: an IPython ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return type(shell).__name__ == "ZMQInteractiveShell"


class NotebookProgress(Progress):
    """The same bars in a Jupyter output area, drawn as text through one IPython display handle that is
    updated in place. rich's own Jupyter display needs ipywidgets (and warns without it); a display
    handle needs nothing beyond the kernel. Refreshed on updates, at most every ``interval`` seconds."""

    interval = 0.25

    def __init__(self, transient: bool = True):
        self._buffer = io.StringIO()
        super().__init__(*_columns(), transient=transient, auto_refresh=False,
                         console=Console(file=self._buffer, width=100, force_jupyter=False, force_terminal=False,
                                         color_system=None))
        self._handle = None
        self._shown = 0.0
        self._transient_ = transient

    def _text(self) -> str:
        out = io.StringIO()
        Console(file=out, width=100, force_jupyter=False, force_terminal=False, color_system=None).print(
            self.get_renderable())
        return out.getvalue().rstrip()

    def refresh(self, force: bool = False) -> None:  # noqa: D102 - rich's refresh, drawn into the handle
        now = time.monotonic()
        if not force and now - self._shown < self.interval:
            return
        self._shown = now
        from IPython.display import display

        data = {"text/plain": self._text()}
        if self._handle is None:
            self._handle = display(data, raw=True, display_id=True)
        else:
            self._handle.update(data, raw=True)

    def stop(self) -> None:
        super().stop()
        if self._handle is not None:
            self._handle.update({"text/plain": "" if self._transient_ else self._text()}, raw=True)


def make_progress(transient: bool = True, console: Console | None = None) -> Progress:
    """A progress display that fits 80 columns: description (<= 22), bar, done/total, info (<= 20),
    time remaining. On stderr unless ``console`` is given; in a Jupyter kernel (and no ``console``
    given), a :class:`NotebookProgress`."""
    if console is None and in_notebook():
        return NotebookProgress(transient=transient)
    return Progress(*_columns(), transient=transient, console=console or Console(stderr=True))


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
            if isinstance(prog, NotebookProgress):  # no refresh thread there: draw on the update
                prog.refresh()

        try:
            yield update
        finally:
            prog.remove_task(tid)
