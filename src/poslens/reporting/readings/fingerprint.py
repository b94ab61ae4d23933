"""The fingerprint's findings and its one line per model in words, rendered from the verdict records of
:mod:`poslens.metrics.judge.fingerprint` and the model records of ``fingerprint.json``.

:func:`render_findings` turns ``fingerprint.json``'s ``findings`` (per claim, per model: the numbers,
the verdict code and its reason) into the key findings block of the fingerprint page and the report:
per paper its claim and, per model, the measured sentence (``text``), the verdict in words and why.
:func:`summary_line` writes a model's headline numbers as one line.
"""

from __future__ import annotations

from poslens.fmt import fmt
from poslens.metrics import verdicts as V
from poslens.metrics.judge.fingerprint import FAST_BANDS, RANK_ONE
from poslens.reporting.readings.common import few_groups, sink_chance


def pct(x) -> str:
    """A share as a whole percentage (``—`` when missing); a share strictly between 0 and 1 never reads
    as 0 % or 100 % (235 of 236 is ">99%", not "100%")."""
    if x is None:
        return "—"
    if 0 < x < 0.005:
        return "<1%"
    if 0.995 <= x < 1:
        return ">99%"
    return f"{100 * x:.0f}%"


_p = pct

#: the verdict codes in words, and the page's class for each
VERDICT_WORDS = {V.REPRODUCED: "reproduced", V.NOT_REPRODUCED: "not reproduced", V.NOT_JUDGED: "cannot be judged here"}
VERDICT_CLASS = {V.REPRODUCED: "reproduced", V.NOT_REPRODUCED: "not-reproduced", V.NOT_JUDGED: "cannot-judge"}

#: per claim: the paper and its claim in plain words (the fingerprint page's and the report's key findings)
CLAIMS = {
    "sink": ("Gu et al., ICLR 2025: attention sinks", "Language models put a large share of their attention on the "
             "first token, in many heads, whatever that token is."),
    "kim": ("Kim et al., arXiv 2509.21042: the causal mask and RoPE", "The causal mask alone makes attention depend "
            "on position, and together with RoPE it bends RoPE's purely distance-based pattern into one that also "
            "depends on where the query sits."),
    "slash": ("Cheng et al., arXiv 2601.08297: slash heads", "Some heads attend to a fixed offset back; they keep "
              "doing so on random tokens, and arise when queries and keys point in nearly one direction before RoPE "
              "and RoPE's medium and high frequencies dominate."),
    "zuo": ("Zuo et al., COLING 2025: position without positional encoding", "Without any positional encoding, the "
            "causal mask makes nearby tokens' hidden states more alike than distant ones."),
    "barbero": ("Barbero et al., ICLR 2025: which RoPE frequencies are used", "Models put most query-key energy in "
                "the slowly turning RoPE pairs (meaning), and build positional heads from the fast ones."),
    "jin": ("Jin et al., ICML 2025: massive values in Q and K", "Queries and keys carry a few very large dimensions, "
            "concentrated in the slowly turning RoPE pairs."),
}


def _against(n: dict, share: bool = True) -> str:
    """The numbers a verdict is held to, in words: " [measured 64%; chance 62%, noise floor 67%; the verdict
    needs 10 percentage points beyond both]" (``share=False``: plain numbers, as for APS)."""
    f = _p if share else fmt
    fl = n["floor"] if n["floor"] > n["chance"] + 5e-4 else None
    need = f"{100 * n['threshold']:.0f} percentage points" if share else fmt(n["threshold"])
    return (f" [measured {f(n['value']) if n['value'] is not None else '—'}; chance {f(n['chance'])}"
            + (f", noise floor {f(fl)}" if fl is not None else "") + f"; the verdict needs {need} beyond both]")


def sink_text(r: dict) -> tuple[str, str]:
    rnd = f", {_p(r['sink_rate_random'])} on random tokens" if r.get("sink_rate_random") is not None else ""
    m = r.get("sink_mean")  # beside the chance level, in the same format where it is small
    mean = "" if m is None else f"; their mean weight on it is {f'{100 * m:.1f}%' if m < 0.1 else _p(m)}"
    even = sink_chance(r["seq_len"]) if r.get("seq_len") else _p(r["even"])
    text = (f"{_p(r['sink_rate'])} of its {r['heads']} heads put more than {_p(r['eps'])} of their "
            f"attention on the first token of running text{rnd}{mean}. A head that spread its attention evenly "
            f"over the keys it sees would put {even} there.")
    if r["verdict"] == V.REPRODUCED:
        return text, "Many heads use the first position as a resting place, on text and on meaningless tokens alike."
    return text, ("The sequences are cut from one long stream of text, so they do not begin with the model's "
                  "start-of-text token; models such as Gemma keep their sink on that token, not on whatever comes "
                  "first.")


def _kim_nope_text(r: dict) -> tuple[str, str]:
    ps = ", ".join(f"layer {l}: p {fmt(p)}" for l, p in r["flat_p"])
    text = (f"without RoPE, in {r['moved']} of {r['later']} layers after the first the average attention score "
            f"varies with position beyond what sequence-to-sequence noise explains ({ps}; p-values held at a false "
            f"discovery rate of {r['level']:g} over the layers)." + _against(r))
    if r["reason"] == "no_noise_floor":
        return text, "The scan had too few sequences for a noise floor, or the model has a single layer."
    if r["verdict"] == V.REPRODUCED:
        return text, "The causal mask alone gives the scores a position signal after the first layer, as the paper " \
                     "predicts."
    return text, (f"The position signal the causal mask builds is carried from the second layer on by the running "
                  f"mean of earlier tokens; in a model of {r['num_layers']} layers and small width, briefly "
                  "trained, it stays below the noise floor of this many sequences. Position-dependent scores in the "
                  "first layer come from the text itself (nearby tokens are alike), not from the mask. The "
                  "parameter-free simulator (poslens simulate) shows the mask's effect far above its noise floor.")


def kim_text(r: dict) -> tuple[str, str]:
    if not r["rope"]:
        return _kim_nope_text(r)
    text = (f"in {r['nonrelative']} of {r['layers']} layers the average attention score depends on where the query "
            f"sits, not only on its distance to the key, beyond what sequence-to-sequence noise explains "
            f"(p-values held at a false discovery rate of {r['level']:g} over the layers); the relativity index "
            f"(1 = distance alone) has median {fmt(r['relativity_median'])} over the layers that are not flat."
            + _against(r))
    if r["reason"] == "no_noise_floor":
        return text, "The scan had too few sequences for a noise floor."
    if r["verdict"] == V.REPRODUCED:
        return text, ("With RoPE and the causal mask together, most layers are not purely relative, as the paper "
                      "finds in Llama, Phi and Qwen.")
    if r["reason"] == "few_groups":
        few = few_groups([{"noise_groups": r["groups"]}])
        return text, few[0].upper() + few[1:] + "; scan more sequences."
    if r["reason"] == "not_most":
        return text, ("Some layers depart from a purely relative pattern beyond their noise floor, but not most; more "
                      "or longer sequences would sharpen the test.")
    return text, "No more layers depart from a purely relative pattern than noise alone would make depart."


def slash_text(r: dict) -> tuple[str, str]:
    kappa = r["kappa"]
    if r["reason"] == "no_slash_heads":
        return (f"no head puts {_p(kappa)} of its attention on one fixed offset (1 … 16 tokens back).",
                "Without slash heads there is nothing to test for persistence.")
    top = r["strongest"]
    head = (f"{r['heads']} heads put at least {_p(kappa)} of their attention a fixed number of tokens back "
            f"(strongest: layer {top['layer']}, head {top['head']}, {_p(top['score'])} at {top['delta']} back, "
            f"against {100 * r['uniform']:.1f}% for even attention)")
    if r["reason"] == "no_random_scan":
        return head + ".", ("No scan of the same model on random tokens is given, so whether these heads keep the "
                            "pattern without meaningful text is not tested (scan with --data random at the same "
                            "--seq-len and report both).")
    text = head + f"; {r['persist']} of them keep it on random tokens." + _against(r)
    for c in r["conditions"]:
        if c["condition"] == RANK_ONE:
            text += (f" Condition 1, queries close to one direction: median {_p(c['value'])} of the energy in the "
                     f"first component (an isotropic head: {_p(c['chance'])}), {'met' if c['met'] else 'not met'}.")
        elif c["condition"] == FAST_BANDS:
            text += (f" Condition 2, medium and high RoPE frequencies dominate: they carry {_p(c['value'])} of these "
                     f"heads' energy, where {_p(c['chance'])} of the dimensions lie; "
                     + ("met." if c["met"] else "not met (under half), though above their share of dimensions."
                        if c["value"] > c["chance"] else "not met."))
    if r["predicted"]:
        text += f" The RoPE frequencies predict the right offset for {r['predicted_match']} of {r['predicted']}."
    if r["same_offset"] is not None:
        text += (f" All {r['heads']} sit at the same offset ({r['same_offset']}), so the prediction tells that offset "
                 f"apart from the other offsets, not one head's offset from another's.")
    if r["verdict"] == V.REPRODUCED:
        return text, ("These heads do not need meaningful text: the pattern is built into the model, as the paper "
                      "claims (the verdict is on persistence; the two conditions are stated beside it).")
    return text, "Most of these heads lose the pattern on random tokens, so here it depends on the text."


def zuo_text(r: dict) -> tuple[str, str]:
    nope = r["nope_layers"]
    text = (f"nearby tokens' hidden states are more alike than distant ones: the adjacency probability score of "
            f"the residual stream (not of the head outputs) is "
            f"{fmt(r['value'])} on average over {'its ' + str(nope) + ' layers without RoPE' if nope else 'its layers'}"
            f" (0.5 = no order, 1 = every token most like its nearest; range {fmt(r['aps_min'])} … "
            f"{fmt(r['aps_max'])})." + _against(r, share=False))
    if r["reason"] == "all_rope":
        return text, ("The paper's claim concerns models without positional encoding; every layer of this model "
                      "rotates its queries and keys, so the number is context only.")
    if r["verdict"] == V.REPRODUCED:
        return text, "The layers without RoPE show the adjacency pattern."
    return text, ("The order is beyond noise but small: the residual stream carries little adjacency pattern."
                  if r["reason"] == "small" else "The hidden states show no order beyond noise.")


def barbero_text(r: dict) -> tuple[str, str]:
    if r["reason"] == "no_rope":
        return "the model has no RoPE layer.", "Nothing rotates."
    text = (f"{_p(r['value'])} of the query-key energy sits in the slowest-turning RoPE pairs (those that turn less "
            f"than once over {r['seq_len']} tokens), where {_p(r['chance'])} of the dimensions lie; {_p(r['high'])} "
            f"in the fastest." + _against(r))
    if r["slash_fast"] is not None:
        text += (f" Its slash heads put {_p(r['slash_fast'])} in the faster pairs, against {_p(r['all_fast'])} for "
                 "all heads.")
    else:
        text += " It has no slash head, so the claim's second half (positional heads on the fast pairs) is not tested."
    if r["verdict"] == V.REPRODUCED:
        why = "The slow pairs carry more energy than their share of dimensions" + (
            " and the positional heads lean on the fast ones" if r["slash_lean_fast"] else "") + \
            ", as the paper describes."
        return text, why + (" The bands are measured against the scanned length: over a longer scan more pairs "
                            "complete a turn and leave the slow band.")
    return text, ("The slow pairs carry about their share of the dimensions, no more." if r["reason"] == "low_not_first"
                  else "The positional heads do not lean on the fast pairs.")


def jin_text(r: dict) -> tuple[str, str]:
    chance = r["dims_share"]
    text = (f"{r['massive_q']} query and {r['massive_k']} key dimensions are more than {r['massive_lambda']:g} times "
            f"as large as their layer's average; {_p(r['q_low_share'] or 0)} of the query ones and "
            f"{_p(r['k_low_share'] or 0)} of the key ones sit in slowly turning RoPE pairs"
            + (f", where {_p(chance)} of all dimensions lie." if chance is not None else "."))
    if r["reason"] == "no_massive_or_rope":
        return text, "No massive dimension, or no RoPE, to place."
    text += _against(r)
    if r["verdict"] == V.REPRODUCED:
        return text, "The very large values concentrate where RoPE turns slowly, as the paper finds."
    return text, "The very large values are not concentrated in the slowly turning pairs beyond their share of the " \
                 "dimensions."


#: per claim: its record's sentences, ``(text, why)``
TEXTS = {"sink": sink_text, "kim": kim_text, "slash": slash_text, "zuo": zuo_text, "barbero": barbero_text,
         "jin": jin_text}


def render_finding(key: str, r: dict) -> dict:
    """One model's finding on claim ``key`` for the page: its record with ``text``, ``why``, the verdict
    in words (``verdict``), its code (``code``) and the page's class (``verdict_class``)."""
    text, why = TEXTS[key](r)
    return {"text": text, "why": why, **r, "code": r["verdict"], "verdict": VERDICT_WORDS[r["verdict"]],
            "verdict_class": VERDICT_CLASS[r["verdict"]]}


def render_findings(blocks: list[dict]) -> list[dict]:
    """The key findings block from ``fingerprint.json``'s ``findings``: per claim the paper, the claim in
    words and one rendered finding per model (:func:`render_finding`); a block without a known ``claim``
    key is left out."""
    out = []
    for b in blocks:
        if not isinstance(b, dict) or b.get("claim") not in CLAIMS or not isinstance(b.get("models"), list):
            continue
        title, claim = CLAIMS[b["claim"]]
        out.append({"paper": title, "claim": claim,
                    "models": [render_finding(b["claim"], m) for m in b["models"] if isinstance(m, dict)]})
    return out


def scans_label(records: list[dict]) -> str:
    """Where a report's plain findings come from: "the scans a, b (random tokens: c)"."""
    return "the scans " + ", ".join(m["name"] + (f" (random tokens: {m['random_scan']})" if m["random_scan"] else "")
                                    for m in records)


def summary_line(record: dict) -> str:
    """One line per model: the headline number of every trait (a model record's ``name`` and ``overall``)."""
    o = record["overall"]
    f = o["freq"]
    rel = f"relativity {fmt(o['relativity_median'])} median over {o['nonflat_layers']}/{o['layers']} layers" \
        if o["relativity_median"] is not None else "relativity: every layer flat"
    massive = f"massive dims Q {o['massive_q']} ({_p(o['massive_q_low_share'])} low-frequency), " \
              f"K {o['massive_k']} ({_p(o['massive_k_low_share'])})"
    return (f"{record['name']}: sink heads {_p(o['sink_rate'])} (random tokens {_p(o['sink_rate_random'])}); "
            f"{o['slash_heads']} slash heads, {o['slash_persist']} persist on random tokens; {rel}, "
            f"trend {fmt(o['trend_mean'], signed=True)}; residual-stream APS {fmt(o['aps_min'])}–{fmt(o['aps_max'])}; "
            + (f"RoPE energy high/medium/low {_p(f['high'])}/{_p(f['medium'])}/{_p(f['low'])}; {massive}"
               if o.get("rope_layers") else "no RoPE"))


def fingerprint_readings(summary: dict) -> list[str]:
    """The readings of a fingerprint: one line per model (``summary["models"]``: records with ``name`` and
    ``overall``, as ``fingerprint.json`` and the run's ``summary.json`` hold them)."""
    return [summary_line(m) for m in summary.get("models") or [] if isinstance(m, dict) and "overall" in m]
