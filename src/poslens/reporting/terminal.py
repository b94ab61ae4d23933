"""Terminal summaries of runs for the CLI and the demo: rich tables in the one number format."""

from __future__ import annotations

from poslens.fmt import fmt, rich_table
from poslens.reporting.readings.notes import noise_note


def print_simulation_summary(summary: dict, console) -> None:
    """The per-layer table of a ``simulate`` run (its ``summary.json``) with a legend and noise notes."""
    has_theory = "theory_max_abs_diff" in summary["layers"][0]
    cols = ["layer", "rel.", "loc.", "trend", "p non-rel", "RMS", "noise"] + (["|sim-th|"] if has_theory else [])

    def flat(l: dict, k: str):  # null is "flat", except where listed as missing (no noise floor to judge against)
        missing = isinstance(l.get("missing"), dict) and k in l["missing"]
        return "flat" if l[k] is None and not missing else l[k]

    rows = [[l["layer"], flat(l, "relativity_index"), flat(l, "locality"), l.get("diagonal_trend"),
             l.get("nonrelative_p"), l.get("within_diag_rms"), l.get("within_diag_rms_noise")]
            + ([l["theory_max_abs_diff"]] if has_theory else []) for l in summary["layers"]]
    t = rich_table(f"{summary['label']}: {fmt(summary['samples'])} samples in {fmt(summary['seconds'])} s "
                   f"({(summary.get('layer_info') or {}).get('convention', 'layers').split(',')[0]})", cols, rows)
    console.print(t)
    console.print("rel.: relativity index; loc.: locality; trend: +1 = the entry further right on each diagonal is "
                  "higher; p non-rel: sign-flip test over sample groups; RMS: within-diagonal, beside its noise floor")
    notes = {noise_note(l["noise"], l.get("noise_groups")) for l in summary["layers"] if l.get("noise")}
    for n in notes:
        console.print(f"note: {n}")
