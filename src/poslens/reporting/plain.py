"""The key findings of plain scans, in the fingerprint's words.

A report of scans (no fingerprint among its runs) opens with the same plain findings the
fingerprint page gives, per model: the sink (Gu et al.), the relativity verdict (Kim et al.) and
the slash heads with their persistence where a random-token scan of the same model and shape is in
the report (Cheng et al.). Each is judged by :mod:`poslens.metrics.verdicts`' one rule, through the
fingerprint's own judges (:mod:`poslens.metrics.judge.fingerprint`), on a model record built here from
the scans' summaries and their ``sink_heads`` / ``slash`` maps, and rendered in the fingerprint's words
(:mod:`poslens.reporting.readings.fingerprint`).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from poslens.metrics.fingerprint import SINK_EPS, head_sink, sink_share
from poslens.conventions import SLASH_MAX_DELTA, SLASH_MIN_DELTA
from poslens.metrics.judge.fingerprint import judge_claims
from poslens.reporting.readings.fingerprint import render_findings, scans_label

#: a head is a slash head at SlashScore(Δ) >= this for some Δ in the slash range (as the fingerprint)
SLASH_KAPPA = 0.3

def _maps(path: Path, names: tuple[str, ...]) -> dict:
    """The named tensors of a scan's ``maps.safetensors``, read one by one (a scan's file also holds
    the score groups, which the findings do not need)."""
    from safetensors import safe_open

    f = path / "maps.safetensors"
    if not f.is_file():
        return {}
    with safe_open(str(f), framework="pt") as fh:
        keys = set(fh.keys())
        return {n: fh.get_tensor(n) for n in names if n in keys}


def _is_random(run) -> bool:
    return str((run.config.get("options") or {}).get("data", run.summary.get("data", ""))) == "random"


def _model_key(run) -> tuple:
    opts = run.config.get("options") or {}
    return (str(run.summary.get("model_dir") or opts.get("model_dir") or run.name), run.summary.get("seq_len"))


def _slash_heads(slash, slash_r, kappa: float, layer_ids: list) -> list[dict]:
    """Heads with SlashScore(Δ) >= kappa at some Δ in the slash range, at their strongest Δ there, with
    the same head's score on random tokens (None without a random-token scan)."""
    out = []
    hi = min(SLASH_MAX_DELTA, slash.shape[-1] - 1)
    for li in range(slash.shape[0]):
        for h in range(slash.shape[1]):
            w = slash[li, h, SLASH_MIN_DELTA: hi + 1].double().nan_to_num(-1.0)
            if not w.numel():
                continue
            d = int(w.argmax()) + SLASH_MIN_DELTA
            score = float(w.max())
            if score < kappa:
                continue
            rnd = float(slash_r[li, h, d]) if slash_r is not None else None
            out.append({"layer": layer_ids[li], "head": h, "delta": d, "score": score, "score_random": rnd,
                        "persists": None if rnd is None else rnd >= kappa, "q_top1_energy": None,
                        "predicted_delta": None})
    return sorted(out, key=lambda s: -s["score"])


def scan_record(text, random=None, *, eps: float = SINK_EPS, kappa: float = SLASH_KAPPA) -> dict | None:
    """A fingerprint-style model record from a text scan (and a random-token scan of the same model
    and shape), holding what the sink, relativity and slash findings read; None when the scan lacks
    the per-head maps."""
    m = _maps(text.path, ("sink_heads", "slash"))
    if "sink_heads" not in m:
        return None
    mr = _maps(random.path, ("sink_heads", "slash")) if random is not None else {}
    L, H, S = m["sink_heads"].shape
    s = text.summary
    lrecs = [l for l in s.get("layers") or [] if isinstance(l, dict) and isinstance(l.get("layer"), int)
             and not isinstance(l.get("layer"), bool)]
    layer_ids = [l["layer"] for l in lrecs] if len(lrecs) == L else list(range(L))
    sink = head_sink(m["sink_heads"])
    sink_r = head_sink(mr["sink_heads"]) if "sink_heads" in mr and mr["sink_heads"].shape == (L, H, S) else None
    layers = [{"layer": l.get("layer"), "rope": bool(l.get("rope")), "flat": l.get("flat"), "flat_p": l.get("flat_p"),
               "nonrelative_p": l.get("nonrelative_p"), "noise_groups": l.get("noise_groups"),
               "relativity_index": l.get("relativity_index")} for l in lrecs]
    rel = [l["relativity_index"] for l in layers if isinstance(l["relativity_index"], (int, float))]
    slash = m.get("slash")
    slash_r = mr.get("slash") if sink_r is not None else None
    return {
        "name": text.name, "num_layers": L, "num_heads": H, "seq_len": S, "num_seqs": s.get("num_seqs"),
        "rope_layers": [l["layer"] for l in layers if l["rope"]], "layers": layers,
        "slash_heads": _slash_heads(slash, slash_r, kappa, layer_ids) if slash is not None else [],
        "random_scan": random.name if sink_r is not None else None,
        "overall": {"sink_rate": float(sink_share(sink, eps).mean()), "sink_mean": float(sink.mean()),
                    "sink_rate_random": float(sink_share(sink_r, eps).mean()) if sink_r is not None else None,
                    "relativity_median": statistics.median(rel) if rel else None},
    }


def scan_findings(runs, *, eps: float = SINK_EPS, kappa: float = SLASH_KAPPA) -> list[dict]:
    """The plain findings of the report's scans: per paper its claim and, per model (a text scan, paired
    with a random-token scan of the same model and length where one is given), the verdict."""
    scans = [r for r in runs if r.kind == "command" and r.command == "scan"]
    texts = [r for r in scans if not _is_random(r)]
    randoms = {}
    for r in scans:
        if _is_random(r):
            randoms.setdefault(_model_key(r), r)
    records = []
    for t in texts:
        rec = scan_record(t, randoms.get(_model_key(t)), eps=eps, kappa=kappa)
        if rec is not None:
            records.append(rec)
    if not records:
        return []
    blocks = judge_claims(records, {"sink_eps": eps, "slash_kappa": kappa}, keys=("sink", "kim", "slash"))
    return [{**b, "run": scans_label(records)} for b in render_findings(blocks)]
