"""The findings of ``poslens ablate`` in words, rendered from its ``summary.json``: per condition the paired
change of the loss (``delta``), whether it is beyond the noise (``beyond_noise``, Benjamini–Hochberg over an
intervention's layers), whether the intervention applies (``applies``), and the readings and probes under it."""

from __future__ import annotations

from poslens.fmt import fmt, layers_text


def ablate_readings(summary: dict) -> list[str]:
    """Every finding of an ablation: the loss per intervention, the scans' readings, the probes."""
    return findings(summary) + readings_findings(summary) + probe_findings(summary)


def probe_findings(summary: dict) -> list[str]:
    """How well the residual stream of the last layer still gives position under each intervention."""
    base = summary.get("probe_base")
    if not base:
        return []
    out, last = [], base[-1]
    for iv in summary["interventions"]:
        recs = [c for c in summary["conditions"] if c["intervention"] == iv and c.get("probe")]
        if not recs:
            continue
        worst = min(recs, key=lambda r: r["probe"][-1]["r"] if r["probe"][-1]["r"] == r["probe"][-1]["r"] else 1.0)
        p = worst["probe"][-1]
        d = p["delta_mse"]
        where = "in every layer" if len(recs) == 1 and worst["layers"] == list(range(summary["num_layers"])) else \
            f"in {layers_text(worst['layers'])}"
        out.append(f"A linear probe reads absolute position from layer {last['layer']}'s residual stream with r = "
                   f"{fmt(last['r'])}; with {iv} {where}, r = {fmt(p['r'])} (squared error {fmt(p['mse'])} against "
                   f"{fmt(last['mse'])}, change {fmt(d['mean'])} ± {fmt(d['se'])} positions², held-out sequences).")
    return out


_WHAT = {"rope-off": "switching RoPE off", "sink-off": "removing the attention sink (key 0)",
         "massive-qk": "replacing the massive q/k dimensions by their mean",
         "random-qk": "replacing as many random non-massive q/k dimensions by their mean"}


def _what(iv: str) -> str:
    if iv.startswith("rope-band:"):
        return f"leaving RoPE's {iv.split(':')[1]}-frequency pairs unrotated"
    if iv.startswith("window:"):
        return f"masking keys more than {iv.split(':')[1]} positions back"
    return _WHAT.get(iv, iv)


def findings(summary: dict) -> list[str]:
    """One plain sentence per intervention: how much the loss changes, where, and against the noise."""
    out = []
    L = summary["num_layers"]
    for iv in summary["interventions"]:
        recs = [c for c in summary["conditions"] if c["intervention"] == iv]
        if not recs:
            continue
        base = f"{_what(iv)}"
        idle = [l for r in recs if not r["applies"] for l in r["layers"]]
        if idle:
            why = "no massive q/k dimension" if iv in ("massive-qk", "random-qk") else "no RoPE"
            out.append(f"{iv}: {why} in {layers_text(idle)}, nothing to switch off there.")
            recs = [r for r in recs if r["applies"]]
            if not recs:
                continue
        if len(recs) == 1:
            r = recs[0]
            where = "in every layer" if r["layers"] == list(range(L)) else f"in {layers_text(r['layers'])}"
            out.append(f"{base[0].upper()}{base[1:]} {where} {_change(r)}.")
            continue
        sig = [r for r in recs if r["beyond_noise"]]
        quiet = [r["layers"][0] for r in recs if not r["beyond_noise"]]
        top = max(sig or recs, key=lambda r: abs(r["delta"]["mean"]))
        level = f"false discovery rate {summary['level']} over the layers"
        if not sig:
            out.append(f"{base[0].upper()}{base[1:]} one layer at a time changes the loss by less than the noise in "
                       f"every layer (largest: {layers_text(top['layers'])}, {_change(top, noise=False)}; {level}).")
            continue
        text = f"{base[0].upper()}{base[1:]} one layer at a time: in {layers_text(top['layers'])} alone it {_change(top)}"
        text += (f"; of the {len(recs)} layers it was applied to, one at a time, {len(sig)} change the loss beyond "
                 "the noise")
        if quiet:
            text += f"; {layers_text(quiet)} by less than the noise"
        out.append(text + f" ({level}).")
    return out


def _reading_text(base: dict, r: dict) -> str:
    """``slash heads 12 → 3, sink weight 0.61 → 0.02, median relativity index 0.77 → 0.81``."""
    rd = r["readings"]
    return (f"slash heads {base['slash_heads']} → {rd['slash_heads']}, sink weight {fmt(base['sink_weight'])} → "
            f"{fmt(rd['sink_weight'])}, median relativity index {fmt(base['relativity_median'])} → "
            f"{fmt(rd['relativity_median'])}")


def readings_findings(summary: dict) -> list[str]:
    """What the scans under each intervention show beside the unmodified model's."""
    base = summary.get("readings_base")
    if not base:
        return []
    out = []
    for iv in summary["interventions"]:
        recs = [c for c in summary["conditions"] if c["intervention"] == iv and c.get("readings")]
        if len(recs) == 1:
            out.append(f"Scanned under {recs[0]['name']} (the unmodified model first): {_reading_text(base, recs[0])}.")
        elif recs:
            low = min(recs, key=lambda r: r["readings"]["slash_heads"])
            out.append(f"Scanned under {iv} one layer at a time: the fewest slash heads ({low['readings']['slash_heads']} "
                       f"of the unmodified model's {base['slash_heads']}) with {layers_text(low['layers'])} ablated "
                       f"({_reading_text(base, low)}).")
    return out


def _change(r: dict, noise: bool = True) -> str:
    d = r["delta"]
    if d["mean"] == 0.0 and not d["se"]:
        return "leaves the loss unchanged on every sequence"
    se = f" ± {fmt(d['se'])}" if d["se"] is not None else ""
    verb = "raises" if d["mean"] > 0 else "lowers"
    text = f"{verb} the loss by {fmt(abs(d['mean']))}{se} nats per token"
    b = [x for x in r["buckets"] if x["mean"] is not None]
    if b and abs(d["mean"]) > 0:
        big = max(b, key=lambda x: x["mean"] if d["mean"] > 0 else -x["mean"])
        text += f", most at positions {big['positions'][0]}–{big['positions'][1]} ({fmt(big['mean'])})"
    if noise and not r.get("beyond_noise"):
        text += ", within the noise"
    return text
