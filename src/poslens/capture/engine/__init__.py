"""The capture engine: :mod:`.attention` (the attention function registered with transformers),
:mod:`.context` (which capture takes a call), :mod:`.capture` (``Capture``: one scan's capture and
its sums), :mod:`.spec` (``CaptureSpec`` and the ``--stats`` values), :mod:`.intervene` (what
``poslens ablate`` switches off) and :mod:`.loop` (the one loop that drives a model, and the hooks
at named points)."""
