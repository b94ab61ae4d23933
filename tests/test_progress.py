"""The one progress convention (poslens.progress): bars nest into a live display, finished bars are
removed, the display stack is restored even when the work fails, and a bar fits 80 columns."""

import io

import pytest
from rich.console import Console

from poslens import progress as P


def test_inner_bars_join_the_live_display_and_leave_when_done():
    with P.live_display() as outer:
        outer_task = outer.add_task("step", total=3, info="")
        with P.task_progress("train rope/corpus/micro", 10) as update:
            assert P._LIVE == [outer]  # no second live display (rich allows one)
            inner = [t for t in outer.tasks if t.id != outer_task]
            assert [t.description for t in inner] == ["train rope/corpus/micro"]
            update(4, info="loss 3.210")
            assert inner[0].completed == 4 and inner[0].fields["info"] == "loss 3.210"
            update(5, 20)
            assert inner[0].total == 20
        assert [t.id for t in outer.tasks] == [outer_task]  # the finished bar is gone
    assert P._LIVE == []


def test_a_bar_alone_starts_and_clears_its_own_display():
    with P.task_progress("scan", 4) as update:
        assert len(P._LIVE) == 1
        prog = P._LIVE[0]
        update(2)
        assert prog.tasks[0].completed == 2
    assert P._LIVE == [] and prog.tasks == [] and prog.live.transient


def test_the_stack_is_restored_when_the_work_fails():
    with pytest.raises(KeyboardInterrupt):
        with P.task_progress("train", 5):
            raise KeyboardInterrupt
    assert P._LIVE == []


def test_a_resumed_run_starts_where_it_stopped():
    with P.task_progress("train", 10, done=4):
        assert P._LIVE[-1].tasks[0].completed == 4


def test_disabled_is_a_no_op():
    with P.task_progress("x", 3, enabled=False) as update:
        update(1, info="ignored")
        assert P._LIVE == []


def test_a_bar_fits_80_columns():
    buf = io.StringIO()
    prog = P.make_progress(console=Console(file=buf, width=80, force_terminal=False))
    prog.add_task("a very long description of a training run that goes on", total=100000, info="loss 12345.6789 acc")
    lines = [seg for seg in Console(file=io.StringIO(), width=80).render_lines(prog.get_renderable())]
    assert len(lines) == 1  # never wrapped onto a second line
    text = "".join(s.text for s in lines[0]).rstrip()
    # the long description and info are cut, so the counts and the time left stay visible
    assert len(text) <= 80 and text.startswith("a very long desc") and "…" in text
    assert "0/100000" in text and text.endswith("-:--:--"), text
