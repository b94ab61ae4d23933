"""What every reading shares: numbers read from summaries, phrases for layer lists and series, p-value
counts (with their false discovery rate) and the noise a reading was judged against, rendered from the
judges of :mod:`poslens.metrics.judge.papers`."""

from __future__ import annotations

from typing import Any, Iterable

from poslens.conventions import NOISE_P, SLASH_MAX_DELTA
from poslens.fmt import fmt
from poslens.metrics.judge.papers import noise_source, num, too_few_groups
from poslens.metrics.verdicts import SINK_CHANCE_FORMULA, uniform_sink_weight


def f2(v: Any) -> str:
    """A number in the one format (:func:`poslens.fmt.fmt`); kept under its old name."""
    return fmt(num(v))


def sink_chance(S: int) -> str:
    """The attention sink's chance level in words, one value with its formula wherever it is quoted:
    "3.5% (the mean over queries i = 1 … S − 1 of 1/(i + 1), at S = 128)"
    (:func:`poslens.metrics.verdicts.uniform_sink_weight`)."""
    return f"{100 * uniform_sink_weight(S):.1f}% ({SINK_CHANCE_FORMULA}, at S = {S})"


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


def _count_phrase(counts: dict | None, what: str) -> str:
    """``"<what> (p < 0.01) in S of T layers, F at a false discovery rate of 0.01 over the T
    (Benjamini–Hochberg)"`` from :func:`poslens.metrics.judge.papers.p_counts`: the correction only with
    more than one layer tested; "" with none."""
    if not counts:
        return ""
    sig, n = counts["significant"], counts["tested"]
    text = f"{what} (p < {NOISE_P}) in {sig} of {n} layer{'s' if n > 1 else ''}"
    if n > 1:
        text += f", {counts['fdr']} at a false discovery rate of {NOISE_P} over the {n} (Benjamini–Hochberg)"
    return text


def _span(vals: list) -> str:
    fin = [v for v in (num(x) for x in vals) if v is not None]
    if not fin:
        return "–"
    return fmt(fin[0]) if len(fin) == 1 else f"{fmt(min(fin))} … {fmt(max(fin))}"


def _pct_span(shares: list[float]) -> str:
    return _span([100 * s for s in shares])


def few_phrase(few: dict) -> str:
    """The clause of :func:`poslens.metrics.judge.papers.too_few_groups`: that the layers' sign-flip tests had
    too few sequence groups to call a trend or a departure from relativity ("" where they had enough)."""
    if few["few"] is None:
        return ""
    where = "not below" if few["few"] == "not_below" else "barely below"
    return (f"only {few['groups']} independent groups of sequences: the smallest p-value the sign-flip test can "
            f"give is {fmt(few['p_min'])}, {where} the {NOISE_P} threshold, too few sequences to call a trend or a "
            "departure from relativity")


def few_groups(layers: list[dict]) -> str:
    """:func:`few_phrase` of these layers."""
    return few_phrase(too_few_groups(layers))


# --------------------------------------------------------------------------------------------
# one run's readings for one paper, whatever command wrote it
# --------------------------------------------------------------------------------------------
def noise_phrase(layers: list[dict]) -> str:
    """What "flat" was judged against in these layers (:func:`poslens.metrics.judge.papers.noise_source`;
    "" where they carry no noise estimate)."""
    src = noise_source(layers)
    base = "Monte Carlo noise" if src["source"] == "monte_carlo" else ""
    if src["groups"] is not None:
        on = f", on a {src['grid']}-position grid" if src["grid"] is not None else ""
        return f"{base or 'sampling noise'} (the noise floor of {src['groups']} independent groups of samples{on})"
    return base
