"""Self-describing run directories with atomic writes.

Layout shared by every command that produces results (simulate, scan, train, ...):

- ``config.json``: every option, the seed and the library versions;
- ``*.safetensors``: tensors (float32 on disk, accumulated in float64 in memory);
- ``summary.json``: scalars in one shape for every command (:func:`poslens.rundir.summary.write_summary`);
- ``*.png``: figures.

Modules: :mod:`.io` (atomic writes of JSON, tensors and bytes, and the manifest of what poslens wrote: a reader never sees a half-written
file), :mod:`.outdir` (the output directory: checked, created, staged and committed in one place),
:mod:`.lock` (one run per directory), :mod:`.staging` (what
``--overwrite`` may replace, the staged swap), :mod:`.figures` (matplotlib figures saved
atomically), :mod:`.summary` (the summary contract: one shape for every command) and :mod:`.load`
(:func:`poslens.rundir.load.load_run`: any run directory back as a ``Run``).

A run directory records the files poslens wrote into it (``.poslens-files.json``): ``--overwrite``
removes exactly those and refuses a directory holding anything else. A run that replaces another is
written into a sibling staging directory and swapped in only once it has succeeded, so a failure, a
full disk or Ctrl-C leaves the previous run as it was.
"""
