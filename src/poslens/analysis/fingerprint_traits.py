"""The traits of one model from its two scans (text and random tokens), as ``poslens fingerprint`` records
them: per layer, per layer type and for the whole model (:func:`model_traits`)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch

from poslens.analysis.panels import load_scan
from poslens.analysis.slash import SlashConfig, _scan_geometry, analyze_scans
from poslens.capture.model.adapters import layer_rope
from poslens.conventions import SLASH_MAX_DELTA, SLASH_MIN_DELTA
from poslens.errors import PoslensError
from poslens.metrics.fingerprint import (MASSIVE_LAMBDA, SINK_EPS, UNROTATED, band_shares, dim_bands, dim_rms,
                                         frequency_usage, head_sink, massive_by_band, massive_dims, sink_share)
from poslens.rope import BANDS, frequency_bands

#: statistics of the text scan (every trait) and of the random-token scan (sink and slash persistence)
TEXT_STATS = ("scores", "probs", "slash", "cosine", "qk", "dim_logit")
RANDOM_STATS = ("probs", "slash")
#: κ of the slash heads (the persistence κ of ``poslens slash``)
SLASH_KAPPA = 0.3
#: the bands a trait is summarised over, in figure order
FREQ_BANDS = (*BANDS, UNROTATED)


def _opt(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def _mean(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    return sum(xs) / len(xs) if xs else None


def _median(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    return statistics.median(xs) if xs else None


def _layer_kind(ssum: dict, l: int, rope_on: bool) -> str:
    """A layer's type: its RoPE table's kind (Gemma 3: ``sliding_attention`` / ``full_attention``),
    ``rope`` for a model with one kind, ``no_rope`` without RoPE (SmolLM3's NoPE layers)."""
    rope = ssum.get("rope") or {}
    kinds = rope.get("layer_kind") or []
    if not rope_on:
        return "no_rope"
    kind = kinds[l] if l < len(kinds) else None
    return "rope" if kind in (None, "default") else kind


def _slash_heads(maps: dict, scfg: dict, ssum: dict, maps_r: dict, text_dir: Path, layer_ids: list[int],
                 rope_flags: list[bool], kappa: float) -> tuple[list[dict], dict]:
    """The (κ, Δ)-slash heads of the text scan with their random-token score, rank-one energy and
    RoPE-predicted offset (``poslens slash``'s analysis); one entry per head at its strongest Δ."""
    cfg = SlashConfig(scan_dir=str(text_dir), out="", kappa=(kappa,), persist_kappa=kappa,
                      min_delta=SLASH_MIN_DELTA, max_delta=SLASH_MAX_DELTA, figures=False)
    _, geom = _scan_geometry(cfg, scfg, ssum)
    parts, _ = analyze_scans(maps, geom, rope_flags, layer_ids, cfg, maps_r)
    by_head = {(h["layer"], h["head"]): h for h in parts["heads"]}
    out, seen = [], set()
    for p in parts["persistence"] or []:  # sorted by the text score, best first
        key = (p["layer"], p["head"])
        if key in seen:
            continue
        seen.add(key)
        h = by_head[key]
        out.append({"layer": p["layer"], "head": p["head"], "delta": p["delta"], "score": p["score_in"],
                    "score_random": p["score_random"], "persists": bool(p["persists"]),
                    "q_top1_energy": h.get("q_top1_energy"), "k_top1_energy": h.get("k_top1_energy"),
                    "predicted_delta": h.get("predicted_peak"), "profile_corr": h.get("profile_corr")})
    return out, geom


def _frequency(maps: dict, ssum: dict, li: int, l: int, rope_on: bool, S: int):
    """``(band shares {band: [H]}, pair shares [H, r/2] or None, dim bands [D])`` of layer ``l``."""
    qg, kg = maps["q_gram"][li:li + 1], maps["k_gram"][li:li + 1]
    D = qg.shape[-1]
    table = layer_rope(ssum.get("rope"), l) if rope_on else None
    if table is None:  # no RoPE in this layer: every dim is unrotated
        shares, unrot = frequency_usage(qg, kg, 0)
        bands = band_shares(shares, unrot, [])
        return {b: v[0] for b, v in bands.items()}, None, dim_bands(D, 0, None)
    r = int(table["rotary_dim"])
    labels = frequency_bands(r, None, S, theta=table["inv_freq"])
    shares, unrot = frequency_usage(qg, kg, r)  # the scan stores q/k grams in the rotate_half layout
    bands = band_shares(shares, unrot, labels)
    return {b: v[0] for b, v in bands.items()}, shares[0], dim_bands(D, r, labels)


def _massive_list(rms: torch.Tensor, mask: torch.Tensor, bands_by_layer: list[list[str]], layer_ids: list[int],
                  rotary: list[int]) -> list[dict]:
    """Every massive dim: layer, head, dim, its RMS over the layer's mean RMS, its band (and pair)."""
    out = []
    for li, h, d in mask.nonzero().tolist():
        r = rotary[li]
        out.append({"layer": layer_ids[li], "head": h, "dim": d, "ratio": float(rms[li, h, d] / rms[li].mean()),
                    "band": bands_by_layer[li][d], "pair": (d % (r // 2)) if d < r else None})
    return sorted(out, key=lambda x: -x["ratio"])


def model_traits(text_dir: str | Path, random_dir: str | Path, *, name: str | None = None, eps: float = SINK_EPS,
                 kappa: float = SLASH_KAPPA, massive_lambda: float = MASSIVE_LAMBDA) -> tuple[dict, dict]:
    """The fingerprint of one model from its finished text and random-token scans (same model, same
    shape): ``(record, tensors)``. The record holds per-layer traits (``layers``), aggregates per
    layer type (``layer_types``), the slash heads, the massive dims, whole-model numbers
    (``overall``) and a one-line summary (``line``); the tensors are per head."""
    text_dir, random_dir = Path(text_dir), Path(random_dir)
    maps, scfg, ssum = load_scan(text_dir)
    maps_r, rcfg, rsum = load_scan(random_dir)
    for need in ("sink_heads", "slash", "q_gram", "k_gram", "dim_logit", "scores"):
        if need not in maps:
            raise PoslensError(f"{text_dir}: maps.safetensors lacks {need!r}; rescan with --stats "
                               f"{','.join(TEXT_STATS)} (this poslens).")
    for need in ("sink_heads", "slash"):
        if need not in maps_r:
            raise PoslensError(f"{random_dir}: maps.safetensors lacks {need!r}; rescan with --stats probs,slash.")
    if maps_r["sink_heads"].shape != maps["sink_heads"].shape:
        raise PoslensError(f"{random_dir}: its scan shape {tuple(maps_r['sink_heads'].shape)} differs from the text "
                           f"scan's {tuple(maps['sink_heads'].shape)}; scan the same model at the same --seq-len.")
    L, H, S = maps["sink_heads"].shape
    Hk, D = maps["k_gram"].shape[1], maps["k_gram"].shape[-1]
    layer_ids = list(ssum["_meta"].get("layers") or range(L))
    lrecs = ssum.get("layers") or [{} for _ in range(L)]
    rope_flags = [bool(r.get("rope", False)) for r in lrecs]

    sink, sink_r = head_sink(maps["sink_heads"]), head_sink(maps_r["sink_heads"])
    share, share_r = sink_share(sink, eps), sink_share(sink_r, eps)
    slash_heads, geom = _slash_heads(maps, scfg, ssum, maps_r, text_dir, layer_ids, rope_flags, kappa)
    q_mask, k_mask = massive_dims(maps["q_gram"], massive_lambda), massive_dims(maps["k_gram"], massive_lambda)
    pair_shares = {}
    layers, dim_band_rows, rotary = [], [], []
    for li, l in enumerate(layer_ids):
        rec = lrecs[li]
        rope_on = rope_flags[li]
        bands, pairs, dbands = _frequency(maps, ssum, li, l, rope_on, S)
        if pairs is not None:
            pair_shares[l] = pairs
        dim_band_rows.append(dbands)
        rotary.append(sum(b != UNROTATED for b in dbands))
        qb, kb = massive_by_band(q_mask[li], dbands), massive_by_band(k_mask[li], dbands)
        in_slash = [s for s in slash_heads if s["layer"] == l]
        layers.append({
            "layer": l, "type": _layer_kind(ssum, l, rope_on), "rope": rope_on,
            "sliding_window": rec.get("sliding_window"),
            "sink_share": float(share[li]), "sink_share_random": float(share_r[li]),
            "sink_mean": float(sink[li].mean()), "sink_heads": sink[li].tolist(),
            "sink_heads_random": sink_r[li].tolist(),
            "slash_heads": len(in_slash), "slash_persist": sum(s["persists"] for s in in_slash),
            "relativity_index": _opt(rec.get("relativity_index")), "diagonal_trend": _opt(rec.get("diagonal_trend")),
            "diagonal_trend_se": _opt(rec.get("diagonal_trend_se")), "trend_p": _opt(rec.get("trend_p")),
            "flat": rec.get("flat"), "flat_p": _opt(rec.get("flat_p")), "nonrelative_p": _opt(rec.get("nonrelative_p")),
            "noise_groups": rec.get("noise_groups"),
            "aps_mean": _opt(rec.get("aps_mean")), "aps_std": _opt(rec.get("aps_std")),
            "freq": {b: float(v.mean()) for b, v in bands.items()},
            "freq_heads": {b: v.tolist() for b, v in bands.items()},
            "massive_q": int(q_mask[li].sum()), "massive_k": int(k_mask[li].sum()),
            "massive_q_bands": {b: int(v) for b, v in qb.items()}, "massive_k_bands": {b: int(v) for b, v in kb.items()},
            "dims_by_band": {b: sum(x == b for x in dbands) for b in FREQ_BANDS},
        })
    q_list = _massive_list(dim_rms(maps["q_gram"]), q_mask, dim_band_rows, layer_ids, rotary)
    k_list = _massive_list(dim_rms(maps["k_gram"]), k_mask, dim_band_rows, layer_ids, rotary)
    types = sorted({r["type"] for r in layers}, key=lambda t: [r["type"] for r in layers].index(t))
    record = {
        "name": name or text_dir.parent.name, "model": (scfg.get("options") or {}).get("model_dir"),
        "model_type": ssum.get("model_type"), "num_layers": L, "num_heads": H, "num_kv_heads": Hk, "head_dim": D,
        "seq_len": S, "num_seqs": ssum.get("num_seqs"), "num_seqs_random": rsum.get("num_seqs"),
        "scans": {"text": str(text_dir), "random": str(random_dir)},
        "rope_layers": [r["layer"] for r in layers if r["rope"]],
        "layers": layers,
        "layer_types": {t: _aggregate([r for r in layers if r["type"] == t], slash_heads) for t in types}
        if len(types) > 1 else {},
        "slash_heads": slash_heads,
        "massive": {"q": q_list, "k": k_list},
        "overall": _aggregate(layers, slash_heads),
        "geometry": {k: geom.get(k) for k in ("rotary_dim", "base", "head_dim", "scaling")},
        "massive_lambda": massive_lambda,
    }
    tensors = {"sink": sink.to(torch.float32), "sink_random": sink_r.to(torch.float32)}
    for b in FREQ_BANDS:
        tensors[f"freq_{b}"] = torch.tensor([r["freq_heads"][b] for r in layers], dtype=torch.float32)
    if pair_shares and len({tuple(v.shape) for v in pair_shares.values()}) == 1:
        tensors["freq_pairs"] = torch.stack([pair_shares.get(l, torch.full_like(next(iter(pair_shares.values())),
                                                                                 float("nan")))
                                             for l in layer_ids]).to(torch.float32)
    tensors["massive_q"], tensors["massive_k"] = q_mask.to(torch.uint8), k_mask.to(torch.uint8)
    return record, tensors


def _aggregate(layers: list[dict], slash_heads: list[dict]) -> dict:
    """Whole-model (or one layer type's) numbers from per-layer records."""
    ids = {r["layer"] for r in layers}
    rotating = [r for r in layers if r["rope"]]
    heads = [h for r in layers for h in r["sink_heads"]]
    heads_r = [h for r in layers for h in r["sink_heads_random"]]
    slash = [s for s in slash_heads if s["layer"] in ids]
    rel = [r["relativity_index"] for r in layers if r["relativity_index"] is not None]
    mq = sum(r["massive_q"] for r in layers)
    mk = sum(r["massive_k"] for r in layers)
    mq_low = sum(r["massive_q_bands"]["low"] for r in layers)
    mk_low = sum(r["massive_k_bands"]["low"] for r in layers)
    return {
        "layers": len(layers), "rope_layers": sum(r["rope"] for r in layers),
        # Gu et al.'s Sink_1^eps: the share of all heads (every layer alike) above eps
        "sink_rate": _mean([r["sink_share"] for r in layers]),
        "sink_rate_random": _mean([r["sink_share_random"] for r in layers]),
        "sink_mean": _mean(heads), "sink_mean_random": _mean(heads_r),
        "slash_heads": len(slash), "slash_persist": sum(s["persists"] for s in slash),
        "relativity_median": _median(rel), "nonflat_layers": len(rel),
        "trend_mean": _mean([r["diagonal_trend"] for r in layers if r["relativity_index"] is not None]),
        "aps_mean": _mean([r["aps_mean"] for r in layers]),
        "aps_min": min((r["aps_mean"] for r in layers if r["aps_mean"] is not None), default=None),
        "aps_max": max((r["aps_mean"] for r in layers if r["aps_mean"] is not None), default=None),
        # RoPE usage over the layers that rotate (a NoPE layer's energy is all unrotated)
        "freq": {b: _mean([r["freq"][b] for r in (rotating or layers)]) for b in FREQ_BANDS},
        "massive_q": mq, "massive_k": mk, "massive_q_low": mq_low, "massive_k_low": mk_low,
        "massive_q_low_share": mq_low / mq if mq else None, "massive_k_low_share": mk_low / mk if mk else None,
    }
