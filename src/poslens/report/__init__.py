"""``poslens report``: one self-contained HTML page from run directories.

- :func:`render_report` ``(run_dirs, title) -> str``: collect, group by paper, render;
- :func:`write_report` ``(run_dirs, out, title) -> Path``: render and write atomically;
- :func:`write_index_html` ``(out_dir) -> Path``: the reproduction page of a ``poslens reproduce`` folder;
- :func:`collect` ``(paths) -> (runs, skipped)``: load run directories, expanding folders that hold them.
"""

from poslens.report.collect import Run, collect, load_run
from poslens.report.render import CSP, render_report, render_runs, write_index_html, write_report

__all__ = ["CSP", "Run", "collect", "load_run", "render_report", "render_runs", "write_index_html", "write_report"]
