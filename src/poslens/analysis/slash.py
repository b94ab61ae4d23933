"""``poslens slash``: slash-dominant heads and their RoPE explanation (arXiv 2601.08297), from a scan.

:func:`run_slash` reads a scan's ``maps.safetensors`` (``slash [L, H, S]``, ``q_gram``, ``k_gram``,
``dim_logit``) and the model's RoPE geometry, and writes the SDH table, persistence on random-token
prompts, rank-one measures and the RoPE decomposition of every head as a run directory. The
numbers themselves are pure functions in :mod:`poslens.metrics.slash` (SDH tables, persistence,
best offsets, ``kv_head_of``), :mod:`poslens.metrics.rank` (rank tables) and
:mod:`poslens.metrics.ropefit` (the rank-one RoPE decomposition).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from poslens.analysis.panels import load_scan
from poslens.capture.model.adapters import get_adapter, layer_rope
from poslens.capture.model.source import model_directory
from poslens.errors import OptionError, PoslensError
from poslens.fmt import fmt
from poslens.metrics.judge.commands import judge_slash
from poslens.metrics.rank import rank_table
from poslens.metrics.ropefit import rope_decomposition
from poslens.metrics.slash import _check_slash, best_offsets, kv_head_of, persistence, sdh_table
from poslens.rope import BANDS
from poslens.rundir.figures import new_figure, save_figure
from poslens.conventions import LAYER_CONVENTION
from poslens.rundir.summary import write_summary
from poslens.rundir.outdir import prepare_out_dir
from poslens.rundir.io import read_json, versions, write_json, write_tensors
from poslens.rundir.staging import staged_dir


def decompose_scan(maps: dict, *, rotary_dim: int | None, base: float | None, scaling: float,
                   rope_layers: list[bool], min_delta: int = 1, max_delta: int | None = None,
                   layer_ids: list[int] | None = None, rope: dict | None = None) -> list[dict]:
    """RoPE decomposition of every head of every RoPE layer of a scan; one dict per head.

    ``rope`` is the scan's record of the model's own RoPE tables (summary ``rope``:
    :func:`poslens.capture.model.adapters.rope_tables`); each layer then uses its table's ``inv_freq`` and
    ``attention_scaling``. Without it ``rotary_dim`` and ``base`` recompute the frequencies.

    Each dict: layer, head, observed/predicted peak offset (Δ in ``min_delta..max_delta``) and
    their SlashScores, the profile correlation, sign/coherence/pair_fit, band usage and the
    bands' contributions at the predicted peak. ``profile`` (predicted ``[S]``) is included.
    """
    slash = _check_slash(maps["slash"])
    L, H, S = slash.shape
    Hk = maps["k_gram"].shape[1]
    hi = S - 1 if max_delta is None else min(max_delta, S - 1)
    ids = layer_ids or list(range(L))
    out = []

    for li in range(L):
        if not rope_layers[li]:
            continue
        table = layer_rope(rope, ids[li])
        own = dict(theta=table["inv_freq"], attention_scaling=table["attention_scaling"]) if table else {}
        if not own and not rotary_dim:
            continue
        for h in range(H):
            dec = rope_decomposition(maps["q_gram"][li, h], maps["k_gram"][li, kv_head_of(h, H, Hk)],
                                     maps["dim_logit"][li, h], rotary_dim=rotary_dim, base=base,
                                     scaling=scaling, seq_len=S, **own)
            obs = slash[li, h]
            w_obs = obs[min_delta: hi + 1]
            w_pred = dec.profile[min_delta: hi + 1]
            d_obs = int(w_obs.argmax()) + min_delta
            d_pred = int(w_pred.argmax()) + min_delta
            corr = float(torch.corrcoef(torch.stack([w_obs, w_pred]))[0, 1]) if w_obs.numel() > 1 else None
            out.append({
                "layer": ids[li], "head": h,
                "observed_peak": d_obs, "observed_score": float(obs[d_obs]),
                "predicted_peak": d_pred, "predicted_score": float(dec.profile[d_pred]),
                "predicted_score_at_observed_peak": float(dec.profile[d_obs]),
                "peak_match": d_obs == d_pred,
                "profile_corr": corr if corr == corr else None,  # NaN (constant profile) -> None
                "sign": dec.sign, "coherence": dec.coherence, "pair_fit": dec.pair_fit,
                "band_usage": dec.band_usage(), "band_peak_contribution": dec.band_peak_contribution(d_pred),
                "profile": dec.profile,
            })
    return out


# --------------------------------------------------------------------------------------------
# the `poslens slash` run directory
# --------------------------------------------------------------------------------------------
@dataclass
class SlashConfig:
    scan_dir: str
    out: str
    random_scan: str | None = None
    kappa: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
    persist_kappa: float | None = None  # κ of the persistence test (default: the smallest κ >= 0.3 in the grid)
    min_delta: int = 1
    max_delta: int = 16
    model_dir: str | None = None  # where the scanned model's config.json is (default: the scan's model_dir)
    top: int = 20  # heads listed in the per-head table
    figures: bool = True


def model_rope_geometry(model_dir: str | None, config=None) -> dict:
    """``rotary_dim``, ``base``, ``scaling`` (logit scale) and ``head_dim`` of a model directory's config
    (or of ``config``, a transformers config: a model scanned from memory)."""
    from transformers import AutoConfig

    if config is None:
        p = model_directory(model_dir)  # a .gguf file: its dequantised cache directory
        if not (p / "config.json").is_file():
            raise PoslensError(f"model directory {p} (recorded by the scan) has no config.json; pass --model-dir "
                               "with the scanned model's directory.")
        config = AutoConfig.from_pretrained(str(p))
    ad = get_adapter(config)
    D = ad.head_dim(config)
    qpas = getattr(config, "query_pre_attn_scalar", None)
    return {"rotary_dim": ad.rotary_dim(config), "base": ad.rope_base(config), "head_dim": D,
            "scaling": float(qpas) ** -0.5 if qpas else D ** -0.5, "model_type": ad.model_type,
            "num_kv_heads": ad.num_kv_heads(config)}


def analyze_scans(maps: dict, geometry: dict, rope_flags: list[bool], layer_ids: list[int], cfg: SlashConfig,
                  maps_random: dict | None = None) -> tuple[dict, dict]:
    """All slash numbers of one scan (and its random-token twin): ``(summary parts, tensors)``."""
    slash = _check_slash(maps["slash"])
    L, H, S = slash.shape
    hi = min(cfg.max_delta, S - 1)
    if cfg.min_delta < 0 or cfg.min_delta > hi:
        raise PoslensError(f"--min-delta {cfg.min_delta} / --max-delta {cfg.max_delta}: need 0 <= min <= max < "
                           f"the scan's --seq-len {S}.")
    kappas = sorted(float(k) for k in cfg.kappa)
    tab = sdh_table(slash, kappas, hi, cfg.min_delta, layer_ids)
    counts = tab["counts"]
    by_delta = []
    for b, d in enumerate(range(cfg.min_delta, hi + 1)):
        listed = next(r[4] for r in tab["rows"] if r[0] == kappas[0] and r[1] == d)
        by_delta.append([d] + [int(counts[a, b]) for a in range(len(kappas))] + [listed])
    ranks = rank_table(maps["q_gram"], maps["k_gram"])
    dec_rows = []
    if (geometry.get("rotary_dim") or geometry.get("rope")) and any(rope_flags):
        dec_rows = decompose_scan(maps, rotary_dim=geometry["rotary_dim"], base=geometry["base"],
                                  scaling=geometry["scaling"], rope_layers=rope_flags, min_delta=cfg.min_delta,
                                  max_delta=hi, layer_ids=layer_ids, rope=geometry.get("rope"))
    dec = {(r["layer"], r["head"]): r for r in dec_rows}
    d_best, s_best = best_offsets(slash, cfg.min_delta, hi)
    heads = []
    predicted = torch.full_like(slash, float("nan"))
    for li in range(L):
        for h in range(H):
            r = dec.get((layer_ids[li], h))
            if r is not None:
                predicted[li, h] = r["profile"]
            heads.append({
                "layer": layer_ids[li], "head": h, "best_delta": int(d_best[li, h]), "best_score": float(s_best[li, h]),
                **{k: float(v[li, h]) for k, v in ranks.items()},
                **({k: v for k, v in r.items() if k not in ("layer", "head", "profile")} if r else {}),
            })
    pk = cfg.persist_kappa if cfg.persist_kappa is not None else next((k for k in kappas if k >= 0.3), kappas[-1])
    pers = None
    if maps_random is not None:
        pers = persistence(slash, maps_random["slash"], pk, hi, cfg.min_delta, layer_ids)
    tensors = {"slash": slash, "slash_predicted": predicted, **{f"rank_{k}": v for k, v in ranks.items()}}
    if maps_random is not None:
        tensors["slash_random"] = _check_slash(maps_random["slash"])
    return {"kappas": kappas, "by_delta": by_delta, "heads": heads, "persist_kappa": pk, "persistence": pers,
            "max_delta": hi}, tensors


def _by_score(r: dict) -> float:
    """Sort key: highest SlashScore first; a head without a finite score (NaN) last."""
    v = r["best_score"]
    return -v if v == v else float("inf")


def _profiles_figure(slash, predicted, heads, layer_ids, max_delta, n=8, random=None):
    top = sorted(heads, key=_by_score)[:n]
    cols = min(4, len(top))
    rows = (len(top) + cols - 1) // cols
    fig, axes = new_figure(rows, cols, figsize=(3.4 * cols, 2.6 * rows), squeeze=False)
    d = list(range(0, max_delta + 1))
    for ax, r in zip(axes.flat, top):
        li = layer_ids.index(r["layer"])
        ax.plot(d, slash[li, r["head"], : max_delta + 1].tolist(), "o-", ms=3, label="observed")
        if random is not None:
            ax.plot(d, random[li, r["head"], : max_delta + 1].tolist(), "s--", ms=3, label="random tokens")
        pr = predicted[li, r["head"], : max_delta + 1]
        if bool(torch.isfinite(pr).all()):
            ax.plot(d, pr.tolist(), "-", color="k", lw=1, label="rank-one RoPE")
        ax.set_title(f"layer {r['layer']} head {r['head']} (layers from 0)", fontsize=9)
        ax.set_xlabel("Δ")
        ax.set_ylabel("SlashScore")
    for ax in list(axes.flat)[len(top):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _load_inputs(cfg: SlashConfig) -> tuple[dict, dict, dict, dict | None]:
    """``(maps, scan config, scan summary, random-token maps or None)``, each input checked."""
    maps, scfg, ssum = load_scan(cfg.scan_dir)
    for need in ("slash", "q_gram", "k_gram", "dim_logit"):
        if need not in maps:
            raise PoslensError(f"SCAN_DIR {cfg.scan_dir}: maps.safetensors lacks {need!r}; rescan with this poslens.")
    maps_r = None
    if cfg.random_scan:
        maps_r, rcfg, _ = load_scan(cfg.random_scan)
        if maps_r["slash"].shape[:2] != maps["slash"].shape[:2]:
            raise PoslensError(f"--random-scan {cfg.random_scan}: its slash tensor {tuple(maps_r['slash'].shape)} does "
                               f"not match {tuple(maps['slash'].shape)}; scan the same model and --layers.")
        src = (rcfg.get("source") or {}).get("kind")
        if src not in (None, "random"):
            raise PoslensError(f"--random-scan {cfg.random_scan} was scanned on --data {src}, not random tokens; "
                               "rescan with --data random.")
    if not cfg.kappa or any(not 0 < k <= 1 for k in cfg.kappa):
        raise PoslensError(f"--kappa {list(cfg.kappa)}: give thresholds in (0, 1], e.g. 0.1,0.3,0.5.")
    return maps, scfg, ssum, maps_r


def _scan_geometry(cfg: SlashConfig, scfg: dict, ssum: dict) -> tuple[str, dict]:
    """``(model directory, RoPE geometry)``: the model's config, with the RoPE tables and logit scale
    the scan recorded (what the scanned model actually used) where it has them."""
    model_dir = cfg.model_dir or (scfg.get("options") or {}).get("model_dir")
    if not model_dir:
        raise PoslensError(f"SCAN_DIR {cfg.scan_dir}: config.json does not name the model; pass --model-dir.")
    saved = Path(cfg.scan_dir) / MODEL_CONFIG
    if not cfg.model_dir and str(model_dir).startswith("<in-memory") and saved.is_file():
        geom = model_rope_geometry(None, config=config_from_dict(read_json(saved)))  # scanned from memory
    elif not cfg.model_dir and not str(model_dir).startswith("<in-memory") and not Path(model_dir).exists():
        typed = "" if Path(model_dir).is_absolute() else ", as typed where the scan ran"
        raise OptionError("SCAN_DIR", str(cfg.scan_dir), f"the scanned model {model_dir} (its config.json's "
                          f"model_dir{typed}) is not there any more: moved or deleted; pass {{model_dir}} with where "
                          "it is now.", keyword="scan", shown=str(cfg.scan_dir))
    else:
        geom = model_rope_geometry(model_dir)
    if ssum.get("rope"):  # the frequencies the scanned model actually used (scaled RoPE, per-layer-type bases)
        geom["rope"] = ssum["rope"]
    used = [x for x in ((ssum.get("attention") or {}).get("scaling") or []) if x]
    if used and len(set(used)) == 1:  # the logit scale the layers used (Granite's multiplier, Gemma's scalar)
        geom["scaling"] = used[0]
    return model_dir, geom


#: a scan of a model in memory keeps the model's configuration here (its directory may not exist)
MODEL_CONFIG = "model_config.json"


def config_from_dict(d: dict):
    """A transformers config from the dict ``config.to_dict()`` wrote."""
    from transformers import AutoConfig

    d = dict(d)
    return AutoConfig.for_model(d.pop("model_type"), **d)


def _num(v) -> float | None:
    """A table cell's number, unrounded (tables store numbers; the report and terminal format them)."""
    return None if v is None else float(v)


HEAD_COLUMNS = ["layer.head", "best Δ", "SlashScore", "q σ1²/Σσ²", "k σ1²/Σσ²", "q eff. rank", "k eff. rank",
                "q n95", "k n95", "predicted Δ", "profile corr", "coherence", "band use high/med/low"]


def slash_tables(parts: dict, cfg: SlashConfig, n_heads: int) -> list[dict]:
    """The run's tables from :func:`analyze_scans`' parts: (κ, Δ) counts, the top ``cfg.top`` heads
    and, with a random-token scan, persistence. Cells hold numbers (unrounded) or labels."""
    top = sorted(parts["heads"], key=_by_score)[: cfg.top]
    head_rows = []
    for r in top:
        bu = r.get("band_usage")
        head_rows.append([f"{r['layer']}.{r['head']}", r["best_delta"], _num(r["best_score"]),
                          _num(r["q_top1_energy"]), _num(r["k_top1_energy"]), _num(r["q_effective_rank"]),
                          _num(r["k_effective_rank"]), int(r["q_n95"]), int(r["k_n95"]), r.get("predicted_peak"),
                          _num(r.get("profile_corr")), _num(r.get("coherence")),
                          "/".join(fmt(bu[b]) for b in BANDS) if bu else None])
    kappas = parts["kappas"]
    tables = [
        {"title": f"number of (κ, Δ)-slash-dominant heads (of {n_heads})",
         "columns": ["Δ"] + [f"κ={k:g}" for k in kappas] + [f"heads at κ={kappas[0]:g}"], "rows": parts["by_delta"]},
        {"title": f"top {len(top)} heads by SlashScore over Δ = {cfg.min_delta}..{parts['max_delta']}: rank-one "
                  "measures of pre-RoPE q/k and the RoPE decomposition (layer.head: decoder layers from 0)",
         "columns": HEAD_COLUMNS, "rows": head_rows},
    ]
    if parts["persistence"] is not None:
        tables.append({"title": f"persistence on random-token prompts of the ({parts['persist_kappa']:g}, Δ)-SDHs "
                                "(layer.head: decoder layers from 0)",
                       "columns": ["layer.head", "Δ", "in-distribution", "random tokens", "ratio", "persists"],
                       "rows": [[f"{p['layer']}.{p['head']}", p["delta"], _num(p["score_in"]), _num(p["score_random"]),
                                 _num(p["ratio"]), p["persists"]] for p in parts["persistence"]]})
    return tables


def _write_run(cfg: SlashConfig, summary: dict, tensors: dict, layer_ids: list[int], maps: dict,
               maps_r: dict | None) -> None:
    """The run directory, staged and moved into place whole."""
    with staged_dir(cfg.out) as stage:
        write_json(stage / "config.json", {"command": "slash", **dataclasses.asdict(cfg), "versions": versions()})
        write_tensors(stage / "slash.safetensors", {k: v.to(torch.float32) for k, v in tensors.items()},
                      metadata={"layers": layer_ids})
        if cfg.figures:
            save_figure(_profiles_figure(maps["slash"], tensors["slash_predicted"], summary["heads"], layer_ids,
                                         summary["delta_range"][1], random=maps_r["slash"] if maps_r else None),
                        stage / "slash_profiles.png")
        write_summary(stage, summary, command="slash", layers_describe="per head under 'heads': each head's decoder "
                      "layer (from 0) and head index; 'layer.head' in tables")


def _model_name(model_dir, fallback: str) -> str:
    """The model's name as the fingerprint gives it (the directory's name, the ``.gguf`` file's stem),
    else ``fallback`` (its model_type)."""
    from poslens.capture.model.source import model_names

    return model_names([str(model_dir)])[0] if model_dir else str(fallback)


def run_slash(cfg: SlashConfig) -> dict:
    """Analyse a scan (and optionally its random-token twin) and write the run directory ``cfg.out``."""
    maps, scfg, ssum, maps_r = _load_inputs(cfg)
    model_dir, geom = _scan_geometry(cfg, scfg, ssum)
    prepare_out_dir(cfg.out)
    L, H, S = maps["slash"].shape
    layer_ids = ssum["_meta"].get("layers") or list(range(L))
    rope_flags = [bool(r.get("rope", True)) for r in ssum.get("layers", [])] or [geom["rotary_dim"] is not None] * L
    parts, tensors = analyze_scans(maps, geom, rope_flags, layer_ids, cfg, maps_r)
    summary = {
        "experiment": "slash", "paper": "slash",
        "title": f"Slash-dominant heads of {_model_name(model_dir, ssum.get('model_type', geom['model_type']))} "
                 f"({ssum.get('num_seqs', '?')} x {S} tokens" + (", with random-token control)" if maps_r else ")"),
        "scan_dir": str(cfg.scan_dir), "random_scan": cfg.random_scan, "model_dir": str(model_dir),
        "geometry": geom, "kappas": parts["kappas"], "persist_kappa": parts["persist_kappa"],
        "delta_range": [cfg.min_delta, parts["max_delta"]],
        "seq_len": S, "sdh_counts": parts["by_delta"], "persistence": parts["persistence"], "heads": parts["heads"],
        "layer_convention": LAYER_CONVENTION, "tables": slash_tables(parts, cfg, L * H),
        "figures": [{"file": "slash_profiles.png", "caption": "SlashScore(Δ) of the most slash-dominant heads: observed"
                     + (", on random tokens" if maps_r else "") + " and predicted by the rank-one RoPE decomposition."}]
        if cfg.figures else [],
    }
    summary["judgement"] = judge_slash(summary)
    _write_run(cfg, summary, tensors, layer_ids, maps, maps_r)
    return summary
