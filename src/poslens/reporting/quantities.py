"""The report's per-layer and per-head quantities, drawn from a run's numbers: which per-layer keys a run
plots under which paper (:data:`LAYER_QUANTITIES`), their line plots with error bars, the head × layer maps
(the best SlashScore by :func:`poslens.metrics.slash.best_slash` and the per-head lists of
:data:`HEAD_QUANTITIES`) and the short per-layer table."""

from __future__ import annotations

from poslens.conventions import NOISE_P, SLASH_MAX_DELTA
from poslens.fmt import fmt
from poslens.reporting.elements import embed_figure, table
from poslens.metrics.judge.papers import num
from poslens.rundir.load import Run

#: per-layer quantities: key -> (paper, panel title, reference line). Keys not listed are plotted
#: under the run's first paper with their own name.
LAYER_QUANTITIES: dict[str, tuple[str, str, float | None]] = {
    "relativity_index": ("kim", "relativity index (1 = relative)", None),
    "locality": ("kim", "locality (+1 = nearer keys score higher)", 0.0),
    "diagonal_trend": ("kim", "signed trend along diagonals (+1 = right higher)", 0.0),
    "within_diag_rms": ("kim", "within-diagonal RMS (dashed: noise floor)", None),
    "nonrelative_p": ("kim", "p, non-relative (sample-group test; noise grid)", NOISE_P),
    "trend_p": ("kim", "p, diagonal trend (noise grid)", NOISE_P),
    "sink_weight": ("kim", "attention weight on key 0 (sink)", None),
    "relativity_index_with_sink": ("kim", "relativity index with key 0", None),
    "locality_with_sink": ("kim", "locality with key 0", 0.0),
    "max_stderr": ("kim", "largest standard error of a score", None),
    "theory_max_abs_diff": ("kim", "max |simulation − theory|", None),
    "aps_mean": ("neighborhood", "APS per sequence (mean ± std)", 0.5),
    "aps": ("neighborhood", "mean-map APS (sequence-averaged map)", None),
    "mean_map_aps": ("neighborhood", "mean-map APS (sequence-averaged map)", None),
    "attn_aps_mean": ("neighborhood", "APS of attention outputs per sequence", 0.5),
    "attn_aps": ("neighborhood", "mean-map APS of attention outputs", None),
    "attn_mean_map_aps": ("neighborhood", "mean-map APS of attention outputs", None),
    "resid_aps_mean": ("neighborhood", "APS of the residual stream per sequence", 0.5),
    "norm_score_mean": ("neighborhood", "norm score (1 = norms shrink)", 0.5),
    "norm_score": ("neighborhood", "norm score (1 = norms shrink)", 0.5),
    "resid_norm_score_mean": ("neighborhood", "norm score of the residual stream", 0.5),
    "bidirectional_aps_mean": ("neighborhood", "APS, bidirectional control", 0.5),
    "bidirectional_norm_score_mean": ("neighborhood", "norm score, bidirectional control", 0.5),
}
#: per-head lists (one value per head per layer): key -> (paper, map title)
HEAD_QUANTITIES: dict[str, tuple[str, str]] = {
    "q_top1_energy": ("slash", "pre-RoPE query top-1 energy (1 = rank one)"),
    "k_top1_energy": ("slash", "pre-RoPE key top-1 energy"),
    "q_effective_rank": ("slash", "query effective rank"),
}
#: per-layer tables are kept up to this many layers; beyond, the line plots carry them
MAX_TABLE_LAYERS = 6


# --------------------------------------------------------------------------------------------
# per-layer and per-head quantities, drawn from the numbers
# --------------------------------------------------------------------------------------------
#: per-layer keys that are bookkeeping, not quantities to plot
_NOT_PLOTTED = ("noise_groups", "noise_positions", "sink_columns", "sliding_window", "flat_p", "paper_layer",
                "max_stderr", "mean_score", "within_diag_rms_signal")
#: companions drawn dashed in their key's panel (key ``k``): the noise floor, the same statistic with
#: key 0 (the sink), on a scan's noise grid or without the noise correction, and the bidirectional control
COMPANIONS = (("{k}_noise", "noise floor"), ("{k}_with_sink", "with key 0"), ("grid_{k}", "noise grid"),
              ("{k}_uncorrected", "not noise-corrected"), ("bidirectional_{k}", "bidirectional control"))


def _companion_keys(k: str) -> list[tuple[str, str]]:
    return [(pat.format(k=k), label) for pat, label in COMPANIONS]


def _error_key(layers: list[dict], key: str) -> str | None:
    base = key[:-5] if key.endswith("_mean") else key
    for cand in (f"{base}_std", f"{key}_std", f"{key}_stderr", f"{key}_se"):
        if any(num(l.get(cand)) is not None for l in layers):
            return cand
    return None


def layer_quantities(run: Run) -> dict[str, list[str]]:
    """Paper -> the per-layer scalar keys of ``run`` worth a line (finite in at least one layer,
    not an error-bar companion, not the index)."""
    layers = run.layers
    keys: list[str] = []
    for l in layers:
        for k, v in l.items():
            if k in keys or k == "layer" or isinstance(v, bool) or num(v) is None:
                continue
            keys.append(k)
    errs = {e for k in keys for e in [_error_key(layers, k)] if e}
    companions = {c for k in keys for c, _ in _companion_keys(k)}  # drawn in their key's panel
    keys = [k for k in keys if k not in errs and not k.endswith(("_std", "_stderr", "_se", "_noise"))
            and k not in _NOT_PLOTTED and k not in companions]
    order = list(LAYER_QUANTITIES)
    keys.sort(key=lambda k: order.index(k) if k in order else len(order))  # known quantities first, in order
    # with the per-sequence APS present, ``aps`` is either the same number or the older mean-map one under
    # the old name: plot the per-sequence one and, last, the one explicitly named ``mean_map_aps``
    for per_seq, dup in (("aps_mean", "aps"), ("attn_aps_mean", "attn_aps")):
        if per_seq in keys:
            keys = [k for k in keys if k != dup]
    if any(k.endswith("aps_mean") for k in keys):  # the paper's per-sequence APS is drawn; the mean-map one
        keys = [k for k in keys if "mean_map" not in k]  # stays in summary.json (it has no chance level)
    keys = [k for k in keys if "mean_map" not in k] + [k for k in keys if "mean_map" in k]
    default = run.paper or "other"
    out: dict[str, list[str]] = {}
    for k in keys:
        paper = LAYER_QUANTITIES.get(k, (default,))[0]
        if paper not in run.papers:
            paper = default
        out.setdefault(paper, []).append(k)
    return out


def _layer_xy(layers: list[dict], key: str) -> tuple[list, list, list | None, list]:
    """(x positions, values, errors, tick labels) with 'embeddings' drawn at x = −1."""
    xs, ys, es, labels = [], [], [], []
    ek = _error_key(layers, key)
    for i, l in enumerate(layers):
        lid = l.get("layer")
        x = lid if isinstance(lid, int) else (-1 if lid == "embeddings" else i)
        xs.append(x)
        ys.append(num(l.get(key)))
        es.append(num(l.get(ek)) if ek else None)
        labels.append(str(lid))
    return xs, ys, (es if ek else None), labels


def layer_figure(runs: list[Run], keys: list[str], *, title: str) -> dict | None:
    """Line plots (with error bars) of ``keys`` against layer, one line per run; embedded."""
    from poslens.reporting.plots import layer_lines

    panels = []
    has_emb = any(l.get("layer") == "embeddings" for r in runs for l in r.layers)
    for k in keys[:9]:
        series = []
        for r in runs:
            layers = r.layers
            if not any(num(l.get(k)) is not None for l in layers):
                continue
            xs, ys, es, _ = _layer_xy(layers, k)
            grid = any(num(l.get(f"grid_{k}")) is not None for l in layers)
            if grid:  # the standard error belongs to the statistic of the noise grid, drawn below
                es = None
            emb = num(r.summary.get(f"embedding_{k}"))
            if emb is not None and -1 not in xs:  # a scan's embeddings value, drawn at x = −1
                xs, ys = [-1] + xs, [emb] + ys
                es = [num(r.summary.get(f"embedding_{k}_std"))] + es if es is not None else None
                has_emb = True
            series.append({"label": f"{r.name}: full map" if grid else r.name, "layers": xs, "values": ys,
                           "errors": es})
            for ck, what in _companion_keys(k):  # dashed, in the same panel
                if not any(num(l.get(ck)) is not None for l in layers):
                    continue
                cx, cy, _, _ = _layer_xy(layers, ck)
                errs = None
                if ck == f"grid_{k}":  # the statistic its p-values, noise floor and error bars describe
                    ek = _error_key(layers, k)
                    errs = [num(l.get(ek)) for l in layers] if ek else None
                    what = f"{max(int(num(l.get('noise_positions')) or 0) for l in layers)}-position {what}"
                series.append({"label": f"{r.name}: {what}", "layers": cx, "values": cy, "errors": errs,
                               "dashed": True})
        if series:
            info = LAYER_QUANTITIES.get(k, (None, k.replace("_", " "), None))
            panels.append({"title": info[1], "series": series, "ref": info[2]})
    if not panels:
        return None
    conv = (runs[0].summary.get("layer_info") or {}).get("convention") or "layer indices as the run wrote them"
    from0 = all("from 0" in str((r.summary.get("layer_info") or {}).get("convention", "from 0")) for r in runs)
    label = "decoder layer (from 0)" if from0 else "layer"
    fig = layer_lines(panels, suptitle=title, columns=3, layer_label=f"{label[:-1]}; −1: embeddings)" if has_emb and from0
                      else f"{label} (−1: embeddings)" if has_emb else label)
    more = f" ({len(keys) - 9} more quantities in summary.json)" if len(keys) > 9 else ""
    emb = " Layer −1 on the axis: the embeddings." if has_emb else ""
    grids = {int(num(l.get("noise_positions")) or 0) for r in runs for l in r.layers
             if any(str(k).startswith("grid_") for k in l)}
    grid = (f" Solid lines: statistics of the full score map; dashed 'noise grid' lines: the same statistics on "
            f"the {'/'.join(str(g) for g in sorted(grids))}-position grid the sample groups were kept on, which is "
            "what the p-values, noise floors and trend error bars describe." if grids else "")
    return {"src": embed_figure(fig), "caption": f"Per-layer quantities; {conv}.{emb} Error bars: the run's std / "
                                                 f"standard error where it gives one.{grid}{more}",
            "file": "summary.json"}


def _head_matrix(layers: list[dict], key: str):
    import numpy as np

    rows = [l.get(key) if isinstance(l.get(key), list) else [] for l in layers]
    H = max((len(r) for r in rows), default=0)
    if H == 0:
        return None
    m = np.full((len(rows), H), np.nan)
    for i, r in enumerate(rows):
        for h, v in enumerate(r):
            f = num(v)
            if f is not None:
                m[i, h] = f
    return m


def slash_profiles(run: Run, upto: int | None = SLASH_MAX_DELTA):
    """``(slash [L, H, :upto + 1], S)`` from the run's ``maps.safetensors`` (key ``slash``, ``[L, H, S]``; the
    whole profile with ``upto=None``), or None where the run has none."""
    path = run.path / "maps.safetensors"
    if not path.is_file():
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            if "slash" not in f.keys():
                return None
            s = f.get_slice("slash")
            L, H, S = s.get_shape()
            return (s[:, :, : S if upto is None else min(upto + 1, S)].double()), S
    except Exception:  # a damaged tensor file: the report shows the summary's numbers only
        return None


def slash_matrix(run: Run, max_delta: int = SLASH_MAX_DELTA):
    """``(best SlashScore, its Δ)`` per ``[layer, head]`` (:func:`poslens.metrics.slash.best_slash`, Δ up
    to ``max_delta``; NaN and Δ = -1 for a head without a score) from the run's ``maps.safetensors``, or None
    where the run has none or no offset is scored."""
    got = slash_profiles(run, max_delta)
    if got is None:
        return None
    from poslens.metrics.slash import best_slash, scored_offsets

    profiles, S = got
    if not len(scored_offsets(S, max_offset=max_delta)):
        return None
    offset, best = best_slash(profiles, max_offset=max_delta, seq_len=S)
    return best.numpy(), offset.numpy()


def head_figure(run: Run, keys: list[str], slash=None) -> dict | None:
    """Head × layer heat maps of SlashScore (Δ-limited) and the per-head lists in ``keys``."""
    from poslens.reporting.plots import head_layer_maps

    layers = run.layers
    maps = []
    if slash is not None:
        maps.append({"title": f"best SlashScore, Δ = 1 … {SLASH_MAX_DELTA}", "values": slash[0], "cmap": "viridis"})
    for k in keys:
        m = _head_matrix(layers, k)
        if m is not None:
            maps.append({"title": HEAD_QUANTITIES[k][1], "values": m, "cmap": "mako",
                         **({"vmin": 0.0, "vmax": 1.0} if "energy" in k else {})})
    if not maps:
        return None
    ids = [l.get("layer") for l in layers] or list(range(len(slash[0])))
    fig = head_layer_maps(maps[:3], layer_ids=ids)
    return {"src": embed_figure(fig), "caption": "Head × layer maps (rows: decoder layers from 0; columns: heads). "
                                                 "Grey: no value (e.g. no RoPE in that layer).",
            "file": "maps.safetensors / summary.json"}


def layer_table(run: Run, keys: list[str]) -> dict | None:
    layers = run.layers
    if not layers or len(layers) > MAX_TABLE_LAYERS or not keys:
        return None
    cols = ["layer"] + [LAYER_QUANTITIES.get(k, (None, k.replace("_", " ")))[1] for k in keys]
    rows = []
    for l in layers:
        row = [l.get("layer")]
        for k in keys:
            ek = _error_key(layers, k)
            v = l.get(k)
            g = num(l.get(f"grid_{k}"))
            if k == "relativity_index" and v is None:
                row.append(None if isinstance(l.get("missing"), dict) and k in l["missing"] else "flat")
            elif g is not None and num(v) is not None:  # the error belongs to the noise grid's statistic
                se = f" ± {fmt(num(l.get(ek)))}" if ek and num(l.get(ek)) is not None else ""
                row.append(f"{fmt(num(v))} (grid {fmt(g)}{se})")
            elif ek and num(l.get(ek)) is not None and num(v) is not None:
                row.append(f"{fmt(num(v))} ± {fmt(num(l.get(ek)))}")
            else:
                row.append(num(v) if not isinstance(v, str) else v)
        rows.append(row)
    conv = (run.summary.get("layer_info") or {}).get("convention", "")
    n = max((int(num(l.get("noise_positions")) or 0) for l in layers if any(str(k).startswith("grid_") for k in l)),
            default=0)
    if n:
        conv += (f"{'; ' if conv else ''}values on the full map, '(grid …)' the same statistic on the {n}-position "
                 "grid the p-values and standard errors describe")
    return table("Per layer", cols, rows, note=conv, definitions=_layer_definitions(keys, cols))


def _layer_definitions(keys: list[str], cols: list[str]) -> dict[str, str]:
    """The per-layer table's columns defined: each quantity's definition (:data:`poslens.reporting.columns.LAYER_COLUMNS`,
    the columns of ``Result.layers()``), with its error bars and noise grid where the cells show them."""
    from poslens.reporting.columns import LAYER_COLUMNS

    out = {}
    for k, c in zip(keys, cols[1:]):
        text = LAYER_COLUMNS.get(k) or LAYER_COLUMNS.get(k[:-5] if k.endswith("_mean") else f"{k}_mean")
        if text:
            out[c] = f"{text} (summary.json: {k}; '±': its error bar where the run gives one)"
    return out
