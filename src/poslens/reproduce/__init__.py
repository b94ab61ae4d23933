"""``poslens reproduce``: the papers' figures as experiments, in one explicit registry.

- :mod:`.simulated`: the simulator experiments (:class:`Experiment`, :class:`ReproContext` live there);
- :mod:`.models`: trained-model experiments (the zoo or random-init stand-ins);
- :mod:`.real`: ``real``, the three papers' analyses on the real pretrained models;
- :mod:`.ablations`: the papers' interventions on the real models (``poslens ablate``).

:data:`EXPERIMENTS` lists them all in the order ``reproduce all`` runs them; nothing registers itself
by being imported. :func:`run_reproduction` runs one (or ``all``) into a staged directory with
``index.json``, ``index.md`` and ``index.html``.
"""

from __future__ import annotations

from pathlib import Path

from poslens.errors import PoslensError, require_fits
from poslens.reporting import write_index_html
from poslens.reproduce import ablations, models, real, simulated
from poslens.reproduce.simulated import Experiment, ReproContext
from poslens.rundir.io import _atomic_write_bytes, write_json
from poslens.rundir.staging import staged_dir

#: every experiment by name, simulator first
EXPERIMENTS: dict[str, Experiment] = {**simulated.EXPERIMENTS, **models.EXPERIMENTS, **real.EXPERIMENTS,
                                         **ablations.EXPERIMENTS}

__all__ = ["EXPERIMENTS", "Experiment", "ReproContext", "names", "run_reproduction"]


def names() -> list[str]:
    return list(EXPERIMENTS) + ["all"]


def run_reproduction(name: str, out: str | Path, ctx: ReproContext) -> list[dict]:
    """Run one experiment (or ``all``); writes ``out/index.json`` and ``out/index.md``."""
    if name not in EXPERIMENTS and name != "all":
        raise PoslensError(f"unknown experiment {name!r}; choose one of: {', '.join(names())}.")
    if ctx.samples < 1:
        raise PoslensError(f"--samples {ctx.samples}: must be a positive integer.")
    require_fits("--samples", ctx.samples)
    chosen = [e for e in EXPERIMENTS.values() if e.available is None or e.available()] if name == "all" \
        else [EXPERIMENTS[name]]
    records = []
    with staged_dir(out) as stage:
        for exp in chosen:
            rec = exp.run(ctx, stage / exp.name)
            records.append({"name": exp.name, "paper": exp.paper, "claim": exp.claim, **rec})
        _write_index(stage, records, ctx)
    return records


def _write_index(out: Path, records: list[dict], ctx: ReproContext) -> None:
    write_json(out / "index.json", {"samples": ctx.samples, "seed": ctx.seed, "experiments": records})
    lines = ["# poslens reproduction", "", f"Monte Carlo samples per simulation: {ctx.samples:,} (seed {ctx.seed}).", ""]
    for r in records:
        verdict = {True: "reproduced", False: "NOT reproduced"}.get(r["reproduced"], "not decided")
        lines += [f"## {r['name']} — {verdict}", "", f"**Paper** ({r['paper']}): {r['claim']}", "",
                  "**Measured**:", "", *[f"- {m}" for m in str(r["measured"]).splitlines()], "",
                  f"Files: `{r['name']}/`", ""]
        if r.get("note"):
            lines += [f"Note: {r['note']}", ""]
    _atomic_write_bytes(out / "index.md", "\n".join(lines).encode())
    write_index_html(out)
