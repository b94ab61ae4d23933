"""``poslens report``: one self-contained HTML page from run directories.

- :func:`render_report` ``(run_dirs, title) -> str``: collect, group by paper, render;
- :func:`write_report` ``(run_dirs, out, title) -> Path``: render and write atomically;
- :func:`write_index_html` ``(out_dir) -> Path``: the reproduction page of a ``poslens reproduce`` folder;
- :func:`write_runs` ``(runs, out, title, skipped) -> Path``: the same for runs already collected;
- :func:`collect` ``(paths, allow_many=False) -> (runs, skipped)``: load run directories, expanding folders
  that hold them (an ambiguous search is refused); :func:`load_run` (from :mod:`poslens.rundir.load`) loads one.
"""

from poslens.rundir.load import Run, load_run
from poslens.reporting.collect import collect
from poslens.reporting.page import CSP
from poslens.reporting.render import render_report, render_runs, write_index_html, write_report, write_runs

__all__ = ["CSP", "Run", "collect", "load_run", "render_report", "render_runs", "write_index_html", "write_report",
           "write_runs"]
