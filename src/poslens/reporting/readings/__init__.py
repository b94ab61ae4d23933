"""Plain-language readings of the numbers in run summaries: the one place prose is written.

Modules: :mod:`.common` (number helpers and shared phrases), :mod:`.kim`, :mod:`.slash`,
:mod:`.neighborhood` (per paper, on any run's per-layer numbers), :mod:`.commands` (per analysis
command, on its summary), :mod:`.findings` (the page's key findings, a model directory, one run's
readings for one paper) and :mod:`.papers` (the papers' titles and introductions).

Each function takes the numbers a command wrote and returns short sentences that say what its
figures show, quoting the numbers that support the sentence (in the one number format of
:mod:`poslens.fmt`). Thresholds are stated in the sentences' wording ("purely relative" =
relativity index >= 0.98) so a reader can check them. :func:`key_findings` writes the page's
summary, one entry per paper.

- per paper, on any run's per-layer numbers: :func:`kim_readings`, :func:`slash_readings`,
  :func:`neighborhood_readings` (scans and simulations), :func:`model_readings` (model directories);
- per analysis command, on its summary (:data:`COMMAND_READINGS`): :func:`neighborhood_command_readings`,
  :func:`panels_readings`, :func:`score_maps_readings` (kim-maps), :func:`slash_command_readings`,
  :func:`dynamics_readings` (slash-dynamics), :func:`sweep_readings`, :func:`probes_readings`; the
  commands write these into ``summary.json`` and the report uses the same functions;
- :func:`run_readings`: one run's readings for one paper, whatever command wrote it;
- :data:`PAPERS`: the papers' titles, references and introductions for the report's sections.
"""
