"""One-command reproduction of the papers' figures that can be made here.

Each :class:`Experiment` knows what the paper showed and how to measure it; running one writes
its run directories under ``DIR/NAME/`` and returns a record with the numbers that decide whether
the paper's claim was reproduced. ``reproduce all`` writes ``DIR/index.json`` and ``DIR/index.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from poslens.conventions import NOISE_P
from poslens.fmt import fmt
from poslens.rundir.figures import new_figure, save_figure
from poslens.rundir.io import write_json
from poslens.simulator import SimConfig, run_simulation, save_result
from poslens.theory import kim_theory

PAPER_SETTING = SimConfig(alpha=0.0, layers=4, seq_len=50, dim=64, samples=100_000)


@dataclass
class Experiment:
    name: str
    paper: str
    claim: str
    run: Callable[["ReproContext", Path], dict]
    available: Callable[[], bool] | None = None  # None: always; else `all` runs it only when this says True


@dataclass
class ReproContext:
    samples: int = PAPER_SETTING.samples
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda[:N]; resolved by poslens.runtime.parse_device
    seed: int = 0
    figures: bool = True
    #: the project's progress convention (:mod:`poslens.progress`): ``update(done, total=None, info="")``,
    #: e.g. the callable :func:`poslens.progress.task_progress` yields; ``info`` names the run in progress
    progress: Callable[..., None] | None = None
    records: list = field(default_factory=list)


def _sig(p) -> bool:
    """Significant at the stated false-positive rate (a group p-value; None = no noise estimate; with
    fewer than 8 groups no p-value reaches the rate)."""
    return p is not None and p < NOISE_P


#: layer numbers: ours count from 0, the paper's from 1
LAYERS_NOTE = "layers counted from 0 (the paper's layer 2 = our layer 1)"


def _sim(ctx: ReproContext, out: Path, name: str, **kw) -> dict:
    cfg = replace(PAPER_SETTING, samples=ctx.samples, device=ctx.device, seed=ctx.seed, **kw)
    cb = (lambda d, t: ctx.progress(d, t, name)) if ctx.progress else None
    res = run_simulation(cfg, progress=cb)
    save_result(res, out / name, figures=ctx.figures)
    return {"run": name, "label": cfg.label(), "layers": res.summary["layers"]}


def _kim_fig1(ctx: ReproContext, out: Path) -> dict:
    from poslens.figures import heatmap

    t = kim_theory(0.0, 3)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "theory.json", t.to_json())
    if ctx.figures:
        fig, ax = new_figure(figsize=(3.4, 3.0))
        heatmap(ax, t.scores, title="layer-2 scores, alpha = 0 (closed form)", annotate=True)
        save_figure(fig, out / "kim_fig1.png")
    got = {"(2,1)": float(t.scores[1, 0]), "(3,1)": float(t.scores[2, 0]), "(3,2)": float(t.scores[2, 1])}
    want = {"(2,1)": 0.154, "(3,1)": 0.132, "(3,2)": 0.150}
    ok = all(abs(got[k] - want[k]) < 1e-3 for k in want)

    def how(v: float, w: float) -> str:
        if round(v, 3) == w:
            return "rounded"
        return "truncated" if math.floor(v * 1000) / 1000 == w else "differs"

    # four decimals on purpose (not fmt's three digits): the fourth says whether the paper rounded or truncated
    note = ("the paper prints " + ", ".join(f"{got[k]:.4f} as {want[k]:.3f} ({how(got[k], want[k])})" for k in want)
            if ok else "values differ from the paper")
    return {"measured": ", ".join(f"{k} = {v:.4f}" for k, v in got.items()), "reproduced": ok, "note": note}


def _locality_line(r: dict) -> tuple[str, bool]:
    """The nearby-favouring claim on one run: our layer 0 (the paper's layer 1) flat, every later
    layer not flat (group sign-flip test) with scores rising towards the query (locality > 0)."""
    L = r["layers"]
    flat0 = L[0]["relativity_index"] is None
    local = all((l["locality"] or 0) > 0 and _sig(l.get("flat_p")) for l in L[1:])
    text = (f"{r['label']}: layer 0 (the paper's layer 1) {'flat' if flat0 else 'NOT flat'}; locality by layer "
            + " / ".join(fmt(l["locality"], missing="flat") for l in L)
            + "; relativity " + " / ".join(fmt(l["relativity_index"], missing="flat") for l in L))
    return text, flat0 and local


def _locality_claim(runs: list[dict]) -> tuple[str, bool]:
    lines, ok = [], True
    for r in runs:
        text, good = _locality_line(r)
        ok &= good
        lines.append(text)
    return "\n".join(lines), ok


def _alpha_runs(alphas, **kw):
    def run(ctx: ReproContext, out: Path) -> dict:
        runs = [_sim(ctx, out, f"alpha{a:g}" + "".join(f"_{k}{v}" for k, v in kw.items()), alpha=a, **kw)
                for a in alphas]
        text, ok = _locality_claim(runs)
        return {"measured": text, "reproduced": ok, "runs": runs}

    return run


def _kim_layernorm(ctx: ReproContext, out: Path) -> dict:
    """Per setting. With 1/sqrt(d) scaling at alpha = 0 the self-score (sqrt(d)) dominates the softmax
    and the paper's own appendix figure is flat in every layer (one off-diagonal colour): flat there
    is what the paper shows. Elsewhere the nearby-favouring pattern of Figure 2 is expected."""
    runs = [_sim(ctx, out, f"layernorm_{s}_alpha{a:g}", alpha=a, norm="layernorm", scale=s)
            for s in ("sqrt-d", "d") for a in (0.0, 0.2)]
    lines, ok = [], True
    for r in runs:
        if "sqrt-d" in r["run"] and r["run"].endswith("alpha0"):
            flat = all(l["relativity_index"] is None for l in r["layers"])
            ok &= flat
            lines.append(f"{r['label']}: {'flat in every layer' if flat else 'NOT flat'} (flat p by layer "
                         + " / ".join(fmt(l.get("flat_p"), missing="n/a") for l in r["layers"])
                         + "), as in the paper's own figure for this setting")
        else:
            text, good = _locality_line(r)
            ok &= good
            lines.append(text)
    return {"measured": "\n".join(lines), "reproduced": ok, "runs": runs}


#: the signed diagonal trend read from the paper's Figure 4 (its layers 2-4 = our layers 1-3), by alpha
KIM_FIG4_TREND = {0.0: (-0.83, -0.61, -0.14), 0.5: (0.96, 0.96, 0.94)}


def _kim_fig4(ctx: ReproContext, out: Path) -> dict:
    """Direction and significance per setting. Causal: our layer 0 is relative (flat or Toeplitz within
    noise); layers 1-3 are significantly non-relative and their diagonal trend has the sign of the
    paper's figure at that alpha (positive = "left columns lower" at alpha = 0.5, negative at
    alpha = 0), significantly. Non-causal: every layer relative (index >= 0.98)."""
    runs = [_sim(ctx, out, f"rope_{'causal' if c else 'noncausal'}_alpha{a:g}", alpha=a, rope=True, causal=c)
            for c in (True, False) for a in (0.0, 0.5)]
    lines, ok = [], True
    for r, (c, a) in zip(runs, [(c, a) for c in (True, False) for a in (0.0, 0.5)]):
        L = r["layers"]
        ri = [l["relativity_index"] for l in L]
        ri_n = [1.0 if v is None else v for v in ri]  # flat maps are trivially relative
        trend = [l.get("diagonal_trend") for l in L]
        if not c:
            good = all(v >= 0.98 for v in ri_n)
            lines.append(f"{r['label']}: relativity index by layer " + " / ".join(fmt(v, missing="flat") for v in ri)
                         + (" (relative in every layer)" if good else " (NOT relative in every layer)"))
        else:
            want = KIM_FIG4_TREND[a]
            rel0 = ri_n[0] >= 0.98 or not _sig(L[0].get("nonrelative_p"))
            signs = [t is not None and (t > 0) == (w > 0) and _sig(l.get("trend_p"))
                     for t, w, l in zip(trend[1:], want, L[1:])]
            nonrel = all(_sig(l.get("nonrelative_p")) for l in L[1:])
            good = rel0 and nonrel and all(signs)
            direction = "right higher (left columns lower)" if want[0] > 0 else "right lower (left columns higher)"
            lines.append(f"{r['label']}: layer 0 {'relative' if rel0 else 'NOT relative'}; layers 1-3 "
                         f"{'non-relative' if nonrel else 'NOT all non-relative'} (p < {NOISE_P:g}); diagonal trend "
                         + " / ".join(fmt(t, signed=True, missing="n/a") for t in trend[1:])
                         + f" vs the paper's figure {' / '.join(f'{w:+.2f}' for w in want)}: {direction} "
                         + ("as in the paper" if all(signs) else "NOT matching the paper in every layer")
                         + "; relativity index by layer " + " / ".join(fmt(v, missing="flat") for v in ri))
        ok &= good
    lines.append(LAYERS_NOTE)
    return {"measured": "\n".join(lines), "reproduced": ok, "runs": runs}


KIM = "Behind RoPE (arXiv 2509.21042)"
EXPERIMENTS: dict[str, Experiment] = {
    "kim-fig1": Experiment("kim-fig1", KIM + ", Figure 1",
                           "Closed form, alpha = 0, length 3: the paper's layer-2 scores (our layer 1) (2,1) = 0.154, "
                           "(3,1) = 0.132, (3,2) = 0.150.",
                           _kim_fig1),
    "kim-fig2": Experiment("kim-fig2", KIM + ", Figure 2",
                           "Parameter-free causal layers, L2 norm, alpha in {0, 0.2}: the paper's layer 1 (our layer 0) "
                           "carries no position; from its layer 2 (our layer 1) on, scores depend on position and rise "
                           "as the key approaches the query.",
                           _alpha_runs((0.0, 0.2))),
    "kim-alpha": Experiment("kim-alpha", KIM + ", appendix",
                            "The same nearby-favouring pattern for alpha in {0.4, 0.6, 0.8}.",
                            _alpha_runs((0.4, 0.6, 0.8))),
    "kim-layernorm": Experiment("kim-layernorm", KIM + ", appendix",
                                "With LayerNorm instead of L2 the nearby-favouring pattern persists, except with 1/sqrt(d) "
                                "scaling at alpha = 0, where the paper's own figure is flat in every layer (the "
                                "self-score dominates the softmax).",
                                _kim_layernorm),
    "kim-fig4": Experiment("kim-fig4", KIM + ", Figure 4",
                           "With RoPE, causal attention distorts RoPE's relative pattern into a non-relative one from "
                           "the paper's layer 2 (our layer 1) on. Its sign depends on alpha: along each diagonal the "
                           "entry further right is higher at alpha = 0.5 (left columns lower; trend about +0.96 / "
                           "+0.96 / +0.94 in the paper's figure) and lower at alpha = 0 (about -0.83 / -0.61 / -0.14). "
                           "The non-causal control stays relative in every layer.",
                           _kim_fig4),
}
