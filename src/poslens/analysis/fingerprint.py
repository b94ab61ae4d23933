"""``poslens fingerprint``: the positional fingerprint of one or more models, side by side.

For every model (a Hugging Face directory or a ``.gguf`` file) :func:`fingerprint` runs two scans
of the same shape, one on text (the Python standard library's sources) and one on uniformly random
tokens, into ``OUT/scans/<model>/{text,random}``, and reads a fixed set of traits from them, per
layer and as one line per model:

- **sink** (Gu et al., ICLR 2025): each head's mean weight on key 0 over queries 1 .. S-1; per layer
  the share of heads above eps = 0.3 (:mod:`poslens.metrics.fingerprint`), on text and on random tokens;
- **slash heads** (Cheng et al., arXiv 2601.08297): the (kappa, Δ)-slash-dominant heads with Δ in
  1 .. :data:`poslens.metrics.slash.SLASH_MAX_DELTA`, whether each persists on random tokens, its
  rank-one pre-RoPE q/k energy and the offset its RoPE frequencies predict
  (:func:`poslens.analysis.slash.analyze_scans`, the numbers of ``poslens slash``);
- **relativity** (Kim et al., arXiv 2509.21042): the scan's relativity index with the sink column
  left out and the noise floor applied (None where the layer's map is flat), and the signed trend;
- **APS ± sd** (Zuo et al., arXiv 2501.00073) per layer, and which layers rotate q/k;
- **RoPE frequency usage** (Barbero et al., ICLR 2025): each head's share of q·k energy per rotary
  pair from the pre-RoPE pair norms, summed into the high / medium / low bands of
  :func:`poslens.rope.frequency_bands` at the scanned length;
- **massive Q/K dimensions** (Jin et al., ICML 2025): dims whose RMS exceeds 5 x the layer's mean,
  and how many sit in low-frequency pairs.

Models whose layers differ in kind (Gemma 3's sliding-window and global layers, with their own RoPE
bases) get every trait per layer type as well. ``OUT`` holds ``fingerprint.json`` (the summary),
``fingerprint.safetensors`` (per-head tensors), ``fingerprint.html`` (models in columns, shared axes
and colour scales) and the figures.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from poslens.analysis.panels import load_scan
from poslens.analysis.slash import SlashConfig, _scan_geometry, analyze_scans
from poslens.capture.model.adapters import layer_rope
from poslens.capture.model.source import model_names
from poslens.errors import PoslensError
from poslens.fmt import fmt
from poslens.metrics.fingerprint import (MASSIVE_LAMBDA, SINK_EPS, UNROTATED, band_shares, dim_bands, dim_rms,
                                         frequency_usage, head_sink, massive_by_band, massive_dims, sink_share)
from poslens.conventions import SLASH_MAX_DELTA, SLASH_MIN_DELTA
from poslens.reporting.fingerprint import FIGURE_CAPTIONS, findings, overview_table, render_page, terminal_tables
from poslens.reporting.fingerprint import pct as _pct
from poslens.conventions import NOISE_P as VERDICT_LEVEL, VERDICT_THRESHOLDS as VERDICT_THRESHOLDS
from poslens.metrics.verdicts import RULE as VERDICT_RULE
from poslens.rope import BANDS, frequency_bands
from poslens.conventions import LAYER_CONVENTION
from poslens.rundir.summary import write_summary
from poslens.rundir.io import _atomic_write_bytes, versions, write_json, write_tensors
from poslens.rundir.staging import check_replaceable, written_by
from poslens.rundir.outdir import commit_out_dir, create_out_dir, prepare_out_dir
from poslens.rundir.lock import release_out_dir

#: default scan shape: both GGUF models (two scans each) within 5 minutes on an idle 2-core CPU
#: (benchmarks/bench_fingerprint.py)
DEFAULT_SEQ_LEN = 256
DEFAULT_NUM_SEQS = 32
#: statistics of the text scan (every trait) and of the random-token scan (sink and slash persistence)
TEXT_STATS = ("scores", "probs", "slash", "cosine", "qk", "dim_logit")
RANDOM_STATS = ("probs", "slash")
#: κ of the slash heads (the persistence κ of ``poslens slash``)
SLASH_KAPPA = 0.3
#: the bands a trait is summarised over, in figure order
FREQ_BANDS = (*BANDS, UNROTATED)


# --------------------------------------------------------------------------------------------
# options and names
# --------------------------------------------------------------------------------------------
@dataclass
class FingerprintConfig:
    """Every option of a fingerprint (the CLI flags one to one)."""

    models: list[str]
    out: str
    data: str = "stdlib"  # the text scan's --data (the random-token scan has the same shape)
    seq_len: int = DEFAULT_SEQ_LEN
    num_seqs: int = DEFAULT_NUM_SEQS
    batch_size: int = 4
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    figures: bool = True
    overwrite: bool = False
    eps: float = SINK_EPS
    kappa: float = SLASH_KAPPA
    massive_lambda: float = MASSIVE_LAMBDA
    allow_pickle: bool = False
    trust_remote_code: bool = False


def _check(cfg: FingerprintConfig, loaded: dict | None = None) -> None:
    if not cfg.models:
        raise PoslensError("fingerprint: no model given; pass one or more model directories or .gguf files.")
    for m in cfg.models:
        if loaded and m in loaded:
            continue
        if not isinstance(m, (str, Path)):
            raise PoslensError(f"fingerprint: {type(m).__name__} is not a model path; pass a Hugging Face model "
                               "directory or a .gguf file (save a loaded model with save_pretrained first).")
        if not Path(m).exists():
            raise PoslensError(f"MODEL {m} does not exist; pass a Hugging Face model directory or a .gguf file "
                               "(`poslens models list` shows the fetched ones).")
    if cfg.seq_len < 4:
        raise PoslensError(f"--seq-len {cfg.seq_len}: the fingerprint needs at least 4 tokens per sequence.")
    if cfg.num_seqs < 2:
        raise PoslensError(f"--num-seqs {cfg.num_seqs}: the noise floor needs at least 2 sequences.")
    if not 0 < cfg.eps < 1:
        raise PoslensError(f"--eps {cfg.eps}: the sink threshold must lie in (0, 1), e.g. 0.3.")
    if not 0 < cfg.kappa <= 1:
        raise PoslensError(f"--kappa {cfg.kappa}: the slash threshold must lie in (0, 1], e.g. 0.3.")
    if cfg.massive_lambda <= 1:
        raise PoslensError(f"--massive-lambda {cfg.massive_lambda}: must exceed 1 (Jin et al. use 5).")


# --------------------------------------------------------------------------------------------
# traits of one model from its two scans
# --------------------------------------------------------------------------------------------
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
    record["line"] = summary_line(record)
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


def summary_line(record: dict) -> str:
    """One line per model: the headline number of every trait."""
    o = record["overall"]
    f = o["freq"]
    rel = f"relativity {fmt(o['relativity_median'])} median over {o['nonflat_layers']}/{o['layers']} layers" \
        if o["relativity_median"] is not None else "relativity: every layer flat"
    massive = f"massive dims Q {o['massive_q']} ({_pct(o['massive_q_low_share'])} low-frequency), " \
              f"K {o['massive_k']} ({_pct(o['massive_k_low_share'])})"
    return (f"{record['name']}: sink heads {_pct(o['sink_rate'])} (random tokens {_pct(o['sink_rate_random'])}); "
            f"{o['slash_heads']} slash heads, {o['slash_persist']} persist on random tokens; {rel}, "
            f"trend {fmt(o['trend_mean'], signed=True)}; APS {fmt(o['aps_min'])}–{fmt(o['aps_max'])}; "
            + (f"RoPE energy high/medium/low {_pct(f['high'])}/{_pct(f['medium'])}/{_pct(f['low'])}; {massive}"
               if o.get("rope_layers") else "no RoPE"))


# --------------------------------------------------------------------------------------------
# the result
# --------------------------------------------------------------------------------------------
class FingerprintResult:
    """A finished fingerprint: ``summary`` (the content of ``fingerprint.json``), ``models`` (one
    record per model, as in the summary), ``tensors`` (per model, per head), ``table()`` and
    ``save(dir)``."""

    def __init__(self, summary: dict, tensors: dict[str, dict], path: Path | None = None):
        self.summary = summary
        self.models: list[dict] = summary["models"]
        self.tensors = tensors
        self.path = path

    def __repr__(self) -> str:
        return f"FingerprintResult({', '.join(m['name'] for m in self.models)}; {self.path or 'not saved'})"

    def table(self, level: str = "layer"):
        """A pandas DataFrame: one row per (model, layer) (``level="layer"``), or per model
        (``level="model"``, the whole-model numbers)."""
        import pandas as pd

        if level == "model":
            rows = []
            for m in self.models:
                o = m["overall"]
                rows.append({"model": m["name"], **{k: v for k, v in o.items() if k != "freq"},
                             **{f"freq_{b}": v for b, v in o["freq"].items()}})
            return pd.DataFrame(rows)
        if level != "layer":
            raise PoslensError(f"table(level={level!r}): choose 'layer' or 'model'.")
        rows = []
        for m in self.models:
            for r in m["layers"]:
                rows.append({"model": m["name"], **{k: v for k, v in r.items()
                                                    if not isinstance(v, (list, dict))},
                             **{f"freq_{b}": v for b, v in r["freq"].items()},
                             **{f"massive_q_{b}": v for b, v in r["massive_q_bands"].items()}})
        return pd.DataFrame(rows)

    def terminal_tables(self, per_table: int = 3) -> list:
        """rich Tables of the traits, models in columns (``per_table`` models each, so a table fits 80
        columns), with one block of rows per layer type where a model has several."""
        return terminal_tables(self.summary, per_table)

    def save(self, out: str | Path, *, figures: bool = True, overwrite: bool = False) -> Path:
        """Write ``fingerprint.json``, ``fingerprint.safetensors``, ``fingerprint.html`` and (with
        ``figures``) the PNG figures into ``out``; returns ``out``."""
        out = Path(out)
        prepare_out_dir(out)
        existing = [out / f for f in ("fingerprint.json", "fingerprint.html") if (out / f).exists()]
        if existing and not overwrite and out != self.path:
            raise PoslensError(f"{existing[0]} already exists; pass overwrite=True (--overwrite) or another "
                               "directory.")
        out.mkdir(parents=True, exist_ok=True)
        write_fingerprint(out, self.summary, self.tensors, figures=figures)
        self.path = out
        return out


def write_fingerprint(out: Path, summary: dict, tensors: dict[str, dict], *, figures: bool = True) -> None:
    """The files of a fingerprint: json, tensors, figures and the page (each written atomically)."""
    flat = {f"{name}.{k}": v.detach().cpu().clone() for name, t in tensors.items() for k, v in t.items()}
    write_tensors(out / "fingerprint.safetensors", flat,
                  metadata={"models": [m["name"] for m in summary["models"]],
                            "layer_convention": LAYER_CONVENTION,
                            "names": "<model>.sink [L, H]: mean weight on key 0 over queries 1..S-1; "
                                     "<model>.freq_<band> [L, H]: share of q.k energy; <model>.freq_pairs "
                                     "[L, H, r/2]; <model>.massive_q/k [L, H(k), D]: Jin et al.'s massive dims"})
    summary["files"] = ["fingerprint.json", "fingerprint.safetensors", "fingerprint.html"]
    summary["findings"] = findings(summary)
    html, figs = render_page(summary, figures=figures, findings=summary["findings"])
    for name, png in figs.items():
        _atomic_write_bytes(out / name, png)
        summary["files"].append(name)
    write_json(out / "fingerprint.json", summary)
    _atomic_write_bytes(out / "fingerprint.html", html.encode("utf-8"))
    if not (out / "config.json").is_file():  # a result saved elsewhere: the options it was made with
        write_json(out / "config.json", {"command": "fingerprint", "options": {k: summary[k] for k in
                                         ("seq_len", "num_seqs", "seed", "thresholds")}, "versions": versions()})
    # the common run-directory summary (poslens report, poslens.load): the traits table, figures, one line per model
    write_summary(out, {"title": summary["title"], "tables": [overview_table(summary)],
                        "figures": [{"file": f, "caption": FIGURE_CAPTIONS[f]} for f in figs],
                        "readings": summary["lines"], "fingerprint": "fingerprint.json",
                        "files": summary["files"] + ["summary.json", "config.json"]},
                  command="fingerprint", paper=None)


# --------------------------------------------------------------------------------------------
# running it
# --------------------------------------------------------------------------------------------
def _scan_config(model: str, out: Path, data: str, stats: Iterable[str], cfg: FingerprintConfig):
    from poslens.capture.scan.options import ScanConfig

    return ScanConfig(model_dir=str(model), out=str(out), data=data, seq_len=cfg.seq_len, num_seqs=cfg.num_seqs,
                      batch_size=cfg.batch_size, seed=cfg.seed, dtype=cfg.dtype, device=cfg.device,
                      figures=False, overwrite=cfg.overwrite, reservoir=0, stats=list(stats),
                      allow_pickle=cfg.allow_pickle, trust_remote_code=cfg.trust_remote_code)


def _scan(model: str, out: Path, data: str, stats: Iterable[str], cfg: FingerprintConfig, progress: bool,
          loaded=None, tokenizer=None) -> None:
    """One scan of ``model`` (a path, or the label of ``loaded``, a model in memory, read with ``tokenizer``)
    into ``out``."""
    from poslens.capture.scan.run import run_scan

    run_scan(_scan_config(model, out, data, stats, cfg), progress=progress, model=loaded, tokenizer=tokenizer)


def _check_models(cfg: FingerprintConfig, out: Path, loaded: dict, tokenizers: dict) -> None:
    """Every model's two scans planned (config values, weights' headers and shapes, context length,
    data) before anything is written, so a bad model is refused before a good one is scanned."""
    from poslens.capture.scan.plan import plan_scan

    for model in cfg.models:
        for data, stats in ((cfg.data, TEXT_STATS), ("random", RANDOM_STATS)):
            plan_scan(_scan_config(model, out / "scans" / "check", data, stats, cfg), model=loaded.get(model),
                      tokenizer=tokenizers.get(model) if data == cfg.data else None)


def _clear_previous(out: Path, overwrite: bool) -> None:
    """An existing non-empty ``out`` is refused, or with ``overwrite`` emptied of a previous
    fingerprint's files (a directory that holds no fingerprint is refused either way)."""
    if not out.is_dir():
        return
    entries = [p for p in out.iterdir() if not p.name.startswith(".")]
    if not entries:
        return
    if not overwrite:
        raise PoslensError(f"--out {out} already exists and is not empty; pass --overwrite to replace it, or "
                           "choose a new directory.")
    if written_by(out) != "fingerprint" and not (out / "fingerprint.json").is_file():
        raise PoslensError(f"--out {out} is not a run directory of `poslens fingerprint`, so --overwrite will not "
                           "replace it; choose a new directory.")
    check_replaceable(out, "fingerprint")  # the previous run is replaced once the new one is written


def run_fingerprint(cfg: FingerprintConfig, progress: bool = True, *, loaded: dict | None = None,
                    tokenizers: dict | None = None) -> FingerprintResult:
    """Scan every model twice (text, random tokens) into ``cfg.out/scans/<model>/``, read the traits
    and write the fingerprint's files into ``cfg.out``. ``loaded`` / ``tokenizers``: models in memory
    and their text tokenizers, by their label in ``cfg.models``. Every model is checked before the
    first is scanned; a fingerprint replacing another (``overwrite``) is swapped in once complete."""
    loaded = loaded or {}
    _check(cfg, loaded)
    final = Path(cfg.out)
    prepare_out_dir(final)
    _clear_previous(final, cfg.overwrite)
    _check_models(cfg, final, loaded, tokenizers or {})
    names = model_names(cfg.models)
    # a fingerprint replacing another is written beside it and swapped in once it is complete
    out = create_out_dir(final, command="fingerprint", overwrite=cfg.overwrite, staged=True)
    try:
        result = _run(cfg, out, names, progress, loaded, tokenizers)
        commit_out_dir(final)
    finally:
        release_out_dir(final)
    result.path = final
    return result


def _run(cfg: FingerprintConfig, out: Path, names: list[str], progress: bool, loaded: dict,
         tokenizers: dict | None) -> FingerprintResult:
    from poslens.progress import task_progress
    from poslens.runtime import no_hf_progress_bars

    # first: an interrupted fingerprint is still recognised as one (--overwrite replaces it)
    write_json(out / "config.json", {"command": "fingerprint", "options": dataclasses.asdict(cfg),
                                     "models": dict(zip(names, cfg.models)), "versions": versions()})
    records, tensors = [], {}
    steps = 3 * len(names)
    # the scans' own bars nest under this one; Hugging Face's loading bars would break the display
    with no_hf_progress_bars(), task_progress("fingerprint", steps, enabled=progress) as update:
        for i, (model, name) in enumerate(zip(cfg.models, names)):
            base = out / "scans" / name
            update(3 * i, info=f"{name}: text")
            _scan(model, base / "text", cfg.data, TEXT_STATS, cfg, progress, loaded.get(model),
                  (tokenizers or {}).get(model))
            update(3 * i + 1, info=f"{name}: random")
            _scan(model, base / "random", "random", RANDOM_STATS, cfg, progress, loaded.get(model))
            update(3 * i + 2, info=f"{name}: traits")
            rec, t = model_traits(base / "text", base / "random", name=name, eps=cfg.eps, kappa=cfg.kappa,
                                  massive_lambda=cfg.massive_lambda)
            rec["model"] = str(model)
            rec["scans"] = {k: str(Path(v).relative_to(out)) for k, v in rec["scans"].items()}
            records.append(rec)
            tensors[name] = t
            update(3 * i + 3)
    summary = build_summary(records, cfg)
    result = FingerprintResult(summary, tensors)
    out.mkdir(parents=True, exist_ok=True)
    write_fingerprint(out, summary, tensors, figures=cfg.figures)
    return result


def build_summary(records: list[dict], cfg: FingerprintConfig) -> dict:
    """``fingerprint.json``: the options, the thresholds and their sources, one record per model."""
    return {
        "command": "fingerprint", "title": "Positional fingerprint of " + ", ".join(r["name"] for r in records),
        "seq_len": cfg.seq_len, "num_seqs": cfg.num_seqs, "seed": cfg.seed,
        "data": {"text": cfg.data, "random": "random"}, "stats": {"text": list(TEXT_STATS), "random": list(RANDOM_STATS)},
        "layer_convention": LAYER_CONVENTION,
        "thresholds": {
            "sink_eps": cfg.eps, "slash_kappa": cfg.kappa, "slash_delta": [SLASH_MIN_DELTA, SLASH_MAX_DELTA],
            "massive_lambda": cfg.massive_lambda,
        },
        "verdicts": {"rule": VERDICT_RULE, "level": VERDICT_LEVEL, "thresholds": dict(VERDICT_THRESHOLDS)},
        "definitions": DEFINITIONS,
        "models": records,
        "lines": [r["line"] for r in records],
        "versions": versions(),
    }


DEFINITIONS = {
    "sink": "each head's mean attention weight on key 0 over queries 1..S-1 and sequences; a sink head exceeds "
            "eps (Gu et al., ICLR 2025); sink_rate: the share of all heads above eps",
    "slash_heads": "heads whose SlashScore(Δ) >= kappa for some Δ in the slash range, at their strongest such Δ; "
                   "persists: still >= kappa on uniformly random tokens (arXiv 2601.08297)",
    "relativity_index": "1 - Var(diagonal-normalised score map) / Var(map), key 0 left out, noise-corrected; "
                        "null where the map is flat against its noise floor (arXiv 2509.21042)",
    "diagonal_trend": "signed trend along the diagonals of the diagonal-normalised map (> 0: the right end higher)",
    "aps": "adjacency probability score per sequence, mean ± sd over sequences (arXiv 2501.00073)",
    "freq": "share of q·k energy per RoPE band: sqrt(E|q_l|^2 E|k_l|^2) per rotary pair from pre-RoPE pair norms, "
            "over the sum of all pairs and unrotated dims (Barbero et al., ICLR 2025); bands by wavelength "
            "against the scanned length (poslens.rope.frequency_bands)",
    "massive": "dims whose RMS over tokens exceeds lambda x the layer's mean RMS over heads and dims (Jin et al., "
               "ICML 2025, Definition 1, lambda = 5), from the pre-RoPE second moments",
}


def fingerprint(models, *, out: str | Path | None = None, data: str = "stdlib", seq_len: int = DEFAULT_SEQ_LEN,
                num_seqs: int = DEFAULT_NUM_SEQS, batch_size: int = 4, seed: int = 0, device: str = "auto",
                dtype: str = "auto", figures: bool = True, overwrite: bool = False, progress: bool = True,
                eps: float = SINK_EPS, kappa: float = SLASH_KAPPA, massive_lambda: float = MASSIVE_LAMBDA,
                allow_pickle: bool = False, trust_remote_code: bool = False) -> FingerprintResult:
    """The positional fingerprint of ``models`` (one path or a list: HF directories or ``.gguf`` files).

    ``out``: the directory to write (scans under ``out/scans``); without it the scans go to a
    temporary directory that is removed afterwards, and the result is kept in memory until
    :meth:`FingerprintResult.save`."""
    import tempfile

    if isinstance(models, (str, Path)):
        models = [models]
    models = list(models)
    if out is not None:
        return run_fingerprint(FingerprintConfig(
            models=models, out=str(out), data=str(data), seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size, seed=seed,
            device=device, dtype=dtype, figures=figures, overwrite=overwrite, eps=eps, kappa=kappa,
            massive_lambda=massive_lambda, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code),
            progress=progress)
    with tempfile.TemporaryDirectory(prefix="poslens-fingerprint-") as tmp:
        r = run_fingerprint(FingerprintConfig(
            models=models, out=str(Path(tmp) / "run"), data=str(data), seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size,
            seed=seed, device=device, dtype=dtype, figures=False, eps=eps, kappa=kappa,
            massive_lambda=massive_lambda, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code),
            progress=progress)
    r.path = None
    return r


def load_fingerprint(path: str | Path) -> FingerprintResult:
    """A written fingerprint read back (``fingerprint.json`` and ``fingerprint.safetensors``)."""
    from poslens.rundir.io import read_json, read_tensors

    p = Path(path)
    if not (p / "fingerprint.json").is_file():
        raise PoslensError(f"{p} has no fingerprint.json; pass the --out directory of `poslens fingerprint`.")
    summary = read_json(p / "fingerprint.json")
    flat = read_tensors(p / "fingerprint.safetensors") if (p / "fingerprint.safetensors").is_file() else {}
    tensors: dict[str, dict] = {}
    for k, v in flat.items():
        name, _, key = k.rpartition(".")
        tensors.setdefault(name, {})[key] = v
    return FingerprintResult(summary, tensors, p)
