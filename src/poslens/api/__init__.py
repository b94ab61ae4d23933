"""poslens from Python: functions that take a model (loaded, or a path), return a :class:`Result`.

Every command of the CLI is a thin layer over the same library function; here each is a function
that returns the run as an object instead of printing it::

    import poslens
    r = poslens.scan(model, data="stdlib", seq_len=256, num_seqs=64)
    r.maps["probs"]          # torch tensors, the names and shapes of maps.safetensors
    r.summary                # dict, the content of summary.json
    r.heads(); r.layers()    # pandas DataFrames
    r.plot("scores", layer=3)
    r.save("runs/x"); poslens.load("runs/x")

A result not given ``out=`` lives in a temporary directory that is removed when the result is
garbage-collected (or the interpreter exits); :meth:`Result.save` copies it to a lasting place.
A CLI run directory and a saved result are the same thing: :func:`load` reads either.

Nothing here changes the process beyond the call: torch's thread count (``threads=``) is set for
the call and restored after it, and a model passed in is handed back as it was
(:mod:`poslens.capture.model.borrow`).

Modules: :mod:`.result` (``Result``, ``load``), :mod:`.commands` (one function per command),
:mod:`.calls` (what they share).
"""

from poslens.runtime import random_state_kept

with random_state_kept():  # rich draws from Python's global random stream when first imported: put it back
    import rich.style  # noqa: F401

from poslens.api.commands import (ablate, compare, explore, fingerprint, kim_maps, neighborhood, panels, probes,
                                  report, scan, simulate, slash, sweep)
from poslens.api.result import CompareResult, Result, load

__all__ = ["CompareResult", "Result", "ablate", "compare", "explore", "fingerprint", "kim_maps", "load", "neighborhood", "panels",
           "probes", "report", "scan", "simulate", "slash", "sweep"]
