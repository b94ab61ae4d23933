"""The judges: numbers in, numbers and short codes out, the decisions every reading is rendered from
(:mod:`poslens.reporting.readings`): :mod:`.papers` (the three papers' measures on any run's layers),
:mod:`.commands` (one judge per analysis command) and :mod:`.fingerprint` (the fingerprint's verdict
records, by the one rule of :mod:`poslens.metrics.verdicts`)."""
