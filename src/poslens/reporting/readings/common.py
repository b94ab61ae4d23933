"""What every reading shares: numbers read from summaries, phrases for layer lists and series, p-value
counts (with their false discovery rate) and the noise a reading was judged against."""

from __future__ import annotations

import math
from typing import Any, Iterable

from poslens.conventions import (FEW_GROUPS_MARGIN, NOISE_P, SLASH_MAX_DELTA)
from poslens.fmt import fmt


def num(v: Any) -> float | None:
    """``v`` as a finite float, else None."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def f2(v: Any) -> str:
    """A number in the one format (:func:`poslens.fmt.fmt`); kept under its old name."""
    return fmt(num(v))


def layer_aps(l: dict) -> tuple[float | None, float | None]:
    """``(APS, std)`` of one scan layer: the per-sequence APS (arXiv 2501.00073's, mean ± std over
    sequences) where the summary has it, else ``(mean-map APS, None)``."""
    if num(l.get("aps_mean")) is not None:
        return num(l.get("aps_mean")), num(l.get("aps_std"))
    return num(l.get("mean_map_aps", l.get("aps"))), None


def layer_slash_head(l: dict, max_delta: int = SLASH_MAX_DELTA) -> dict | None:
    """The layer's strongest head at offsets 1..max_delta among its listed top heads
    (:func:`poslens.metrics.slash.strongest_listed`), or None."""
    from poslens.metrics.slash import strongest_listed  # lazily: the readings need no torch until here

    return strongest_listed(l.get("top_slash_heads"), max_delta)


def _layers_phrase(ids: list) -> str:
    if len(ids) > 3 and all(isinstance(i, int) for i in ids) and list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return f"layers {ids[0]} … {ids[-1]}"
    if len(ids) > 6:
        return f"{len(ids)} layers ({', '.join(str(i) for i in ids[:3])}, …, {ids[-1]})"
    ids = [str(i) for i in ids]
    if len(ids) == 1:
        return f"layer {ids[0]}"
    if len(ids) == 2:
        return f"layers {ids[0]} and {ids[1]}"
    return f"layers {', '.join(ids[:-1])} and {ids[-1]}"


def _series(vals: Iterable) -> str:
    return " → ".join(f2(v) for v in vals)


def _series_short(vals: Iterable, max_items: int = 6) -> str:
    """A per-layer series; long ones (30 layers) as first → … → last with the range."""
    vals = [num(v) for v in vals]
    if len(vals) <= max_items:
        return _series(vals)
    fin = [v for v in vals if v is not None]
    rng = f" (range {fmt(min(fin))} … {fmt(max(fin))})" if fin else ""
    return f"{f2(vals[0])} → {f2(vals[1])} → … → {f2(vals[-1])}{rng}"


def _decoder_layers(layers: list) -> tuple[dict | None, list[dict]]:
    """``(embeddings entry or None, decoder-layer entries in order)`` of a summary's ``layers``."""
    layers = [l for l in layers or [] if isinstance(l, dict)]
    emb = next((l for l in layers if l.get("layer") == "embeddings"), None)
    return emb, [l for l in layers if isinstance(l.get("layer"), int) and not isinstance(l.get("layer"), bool)]


def _pvalues(live: list[dict], key: str) -> list[float]:
    """The layers' p-values ``key``, where they have one."""
    return [num(l.get(key)) for l in live if num(l.get(key)) is not None]


def _tested(live: list[dict], key: str) -> tuple[int, int]:
    """``(significant, tested)``: layers whose p-value ``key`` is below NOISE_P, of those with one."""
    ps = _pvalues(live, key)
    return sum(p < NOISE_P for p in ps), len(ps)


def fdr_count(ps: list[float], q: float = NOISE_P) -> int:
    """How many of the layers' p-values stay significant when the false discovery rate over all of them
    is held at ``q``: Benjamini–Hochberg adjusted p-values (``scipy.stats.false_discovery_control``)
    below ``q``. Each layer is its own test on the same sequences; counting layers at p < q each would
    expect ``q`` × the number of layers false calls."""
    if not ps:
        return 0
    from scipy.stats import false_discovery_control  # lazily: scipy.stats costs a fifth of a second to import

    return int((false_discovery_control([min(max(p, 0.0), 1.0) for p in ps], method="bh") < q).sum())


def _count_phrase(live: list[dict], key: str, what: str) -> str:
    """``"<what> (p < 0.01) in S of T layers, F at a false discovery rate of 0.01 over the T
    (Benjamini–Hochberg)"``: the correction only with more than one layer tested; "" with none."""
    ps = _pvalues(live, key)
    if not ps:
        return ""
    sig, n = sum(p < NOISE_P for p in ps), len(ps)
    text = f"{what} (p < {NOISE_P}) in {sig} of {n} layer{'s' if n > 1 else ''}"
    if len(ps) > 1:
        text += f", {fdr_count(ps)} at a false discovery rate of {NOISE_P} over the {len(ps)} (Benjamini–Hochberg)"
    return text


def noise_shares(layers: list[dict]) -> list[float]:
    """Per scan layer whose full-map index is computed without the noise groups (one with
    ``noise_positions`` but neither a grid index nor ``relativity_index_noise_corrected``): the share of the observed within-diagonal mean
    square that sampling noise alone gives, ``(within_diag_rms_noise / within_diag_rms)^2`` capped at 1
    (the noise estimate can exceed what is observed)."""
    out = []
    for l in layers:
        rms, noise = num(l.get("within_diag_rms")), num(l.get("within_diag_rms_noise"))
        if ("noise_positions" in l and num(l.get("grid_relativity_index")) is None
                and not l.get("relativity_index_noise_corrected") and rms and noise is not None):
            out.append(min((noise / rms) ** 2, 1.0))
    return out


def _span(vals: list) -> str:
    fin = [v for v in (num(x) for x in vals) if v is not None]
    if not fin:
        return "–"
    return fmt(fin[0]) if len(fin) == 1 else f"{fmt(min(fin))} … {fmt(max(fin))}"


def _pct_span(shares: list[float]) -> str:
    return _span([100 * s for s in shares])


def smallest_p(layers: list[dict]) -> tuple[int, float | None]:
    """``(G, 2 / 2^G)``: the layers' largest number of noise groups and the smallest p-value a sign-flip
    test over that many groups can give (every flip pattern and its mirror image tie); ``(G, None)``
    with fewer than two groups."""
    groups = [int(num(l.get("noise_groups"))) for l in layers if num(l.get("noise_groups")) is not None]
    g = max(groups, default=0)
    return g, (2.0 / 2**g if g >= 2 else None)


def few_groups(layers: list[dict]) -> str:
    """A clause saying that the layers' sign-flip tests had too few sequence groups to call a trend or a
    departure from relativity ("" where they had enough): with ``G`` groups the smallest p-value the
    test can give is 2 / 2^G, which must lie well under NOISE_P (by FEW_GROUPS_MARGIN)."""
    g, p_min = smallest_p(layers)
    if p_min is None or p_min * FEW_GROUPS_MARGIN <= NOISE_P:
        return ""
    where = "not below" if p_min >= NOISE_P else "barely below"
    return (f"only {g} independent groups of sequences: the smallest p-value the sign-flip test can give is "
            f"{fmt(p_min)}, {where} the {NOISE_P} threshold, too few sequences to call a trend or a departure "
            "from relativity")


# --------------------------------------------------------------------------------------------
# one run's readings for one paper, whatever command wrote it
# --------------------------------------------------------------------------------------------
def noise_phrase(layers: list[dict]) -> str:
    """What "flat" was judged against in these layers ("" where they carry no noise estimate)."""
    layers = [l for l in layers if isinstance(l, dict)]
    groups = [int(num(l.get("noise_groups"))) for l in layers if num(l.get("noise_groups")) is not None]
    base = "Monte Carlo noise" if any(num(l.get("max_stderr")) is not None for l in layers) else ""
    pos = [int(num(l.get("noise_positions"))) for l in layers if num(l.get("noise_positions")) is not None]
    on = f", on a {max(pos)}-position grid" if pos and any(str(k).startswith("grid_") for l in layers for k in l) \
        else ""
    if groups and max(groups) >= 2:
        return f"{base or 'sampling noise'} (the noise floor of {max(groups)} independent groups of samples{on})"
    return base
