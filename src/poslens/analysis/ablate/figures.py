"""The figures of ``poslens ablate``: what each intervention costs the model, by layer and position.

One figure per intervention. Layer by layer: a map of decoder layers (from 0) x position buckets,
each cell the paired change of the mean next-token loss, on a diverging colour scale centred on 0,
a dot where the change is beyond the noise. One condition (all layers, or a list): the change per
position bucket with its standard error.
"""

from __future__ import annotations

from pathlib import Path


def _bucket_labels(summary: dict) -> list[str]:
    return [f"{lo}" if lo == hi else f"{lo}–{hi}" for lo, hi in summary["buckets"]]


def intervention_figure(summary: dict, intervention: str):
    """The figure of one intervention (see the module docstring), or None when it has no condition."""
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    from poslens.rundir.figures import new_figure

    recs = [c for c in summary["conditions"] if c["intervention"] == intervention]
    if not recs:
        return None
    labels = _bucket_labels(summary)
    single = [r for r in recs if len(r["layers"]) == 1]
    if len(single) > 1:
        layers = [r["layers"][0] for r in single]
        d = np.array([[b["mean"] for b in r["buckets"]] for r in single], dtype=float)
        sig = np.array([[bool(b.get("beyond_noise")) for b in r["buckets"]] for r in single])
        lim = float(np.nanmax(np.abs(d))) if np.isfinite(d).any() else 1.0
        lim = lim or 1.0
        fig, ax = new_figure(figsize=(8.0, max(2.4, 0.9 + 0.22 * len(layers))))
        im = ax.imshow(d, aspect="auto", cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -lim, lim), interpolation="nearest")
        yy, xx = np.nonzero(sig)
        ax.scatter(xx, yy, s=6, c="black", marker="o", linewidths=0)
        ax.set_yticks(range(len(layers)))
        ax.set_yticklabels([str(l) for l in layers], fontsize=7)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=8, rotation=30)
        ax.set_xlabel("position of the predicted token")
        ax.set_ylabel("decoder layer ablated (from 0)")
        cb = fig.colorbar(im, ax=ax, shrink=0.9)
        cb.set_label("Δ loss (nats per token)")
        ax.set_title(f"{intervention}, one layer at a time: change of next-token loss (dot: beyond the noise)",
                     fontsize=9)
        return fig
    fig, ax = new_figure(figsize=(8.0, 3.2))
    x = np.arange(len(labels))
    width = 0.8 / len(recs)
    for i, r in enumerate(recs):
        m = [b["mean"] for b in r["buckets"]]
        se = [b["se"] or 0.0 for b in r["buckets"]]
        ax.bar(x + (i - (len(recs) - 1) / 2) * width, m, width, yerr=se, capsize=2, label=r["name"])
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8, rotation=30)
    ax.set_xlabel("position of the predicted token")
    ax.set_ylabel("Δ loss (nats per token)")
    ax.set_title(f"{intervention}: change of next-token loss by position (± SE from sequence groups)", fontsize=9)
    if len(recs) > 1:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def ablate_figures(summary: dict, out: Path) -> list[dict]:
    """Save one figure per intervention into ``out``; returns the ``summary["figures"]`` entries."""
    from poslens.rundir.figures import save_figures

    figs = []
    for iv in summary["interventions"]:
        fig = intervention_figure(summary, iv)
        if fig is None:
            continue
        name = "ablate_" + iv.replace(":", "_") + ".png"
        figs.append((name, fig, f"{iv}: the paired change of next-token loss against the unmodified model, by "
                                "decoder layer ablated (from 0) and position bucket; diverging scale centred on 0."))
    return save_figures(out, figs)
