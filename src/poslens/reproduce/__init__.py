"""``poslens reproduce``: the papers' figures as experiments. Simulator experiments live in
:mod:`.simulated`, trained- and real-model experiments in :mod:`.models`."""
