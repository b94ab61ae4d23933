"""arXiv 2509.21042 on trained models: the nine-panel Gram decomposition of one
layer, and per-layer score maps with their non-relativity numbers.

**Nine panels** for layer ℓ of a Llama-family model (batch-averaged ``[S, S]`` matrices):

(a) ``Y Yᵀ``, Y = input_layernorm(X);          (b) ``Q Kᵀ · scaling`` (post-RoPE, mean over heads, causal);
(c) ``(AV)(AV)ᵀ`` (heads concatenated, before W_O);  (d) ``(AV W_O)(AV W_O)ᵀ``;
(e) ``O Oᵀ``, O = AV W_O + X;                   (f) ``LN(O) LN(O)ᵀ`` (post_attention_layernorm);
(g) ``X' X'ᵀ``, X' = FFN(LN(O)) + O (the layer output); (h) the next layer's ``Y Yᵀ``;
(i) the next layer's ``Q Kᵀ · scaling``.

Capture: the adapter's capture points (:data:`PANEL_POINTS`: ``attn_in``, ``attn_z``, ``attn_out``,
``resid_mid``, ``mlp_in``, ``resid_post`` and the next layer's ``attn_in``) and, for (b) and (i),
poslens' registered attention function (:class:`poslens.capture.engine.attention.Capture` ``scores``). Nothing is
monkeypatched. Every architecture with a sequential block works (not Phi, GPT-NeoX, Cohere, whose
attention and MLP run in parallel); in Gemma 2/3 (d) is the projection before the post-attention
norm, and in OLMo 2 (f) equals (e) (the MLP reads the residual stream unnormalised). Sums are float64 over batches; memory is ``9 x S x S`` plus one batch.

Each panel gets the relativity index and locality of :mod:`poslens.metrics.diagonal` over its
lower triangle (the diagonal, a self-similarity, excluded); *non-relativity* = 1 - relativity.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from poslens.capture.model.adapters import ADAPTERS
from poslens.capture.backends.blocks import BlockMaps
from poslens.capture.engine.capture import Capture
from poslens.capture.engine.spec import CaptureSpec
from poslens.capture.engine.loop import hooked, run_batches
from poslens.capture.model.source import source_record
from poslens.capture.scan.finalize import SINK_COLUMNS, map_view
from poslens.capture.model.load import load_model, load_tokenizer, open_model_config
from poslens.capture.engine.loop import attach
from poslens.metrics.diagonal import causal_view, window_view
from poslens.data.sources import make_source
from poslens.capture.statistics.accumulators import MeanAccumulator
from poslens.errors import PoslensError, require_positive
from poslens.metrics import diagonal_trend, locality, relativity_index
from poslens.metrics.judge.commands import judge_panels, judge_score_maps
from poslens.metrics.noise import jackknife_se_of, leave_one_out_means
from poslens.metrics.slash import sink_weight
from poslens.rundir.figures import new_figure, save_figure
from poslens.conventions import LAYER_CONVENTION
from poslens.rundir.summary import write_summary
from poslens.rundir.outdir import prepare_out_dir
from poslens.rundir.io import read_json, read_tensors, versions, write_json, write_tensors
from poslens.rundir.staging import staged_dir
from poslens.runtime import parse_device, resolve_dtype

PANELS = [
    ("a", "Y Yᵀ, Y = LN(X)"),
    ("b", "Q Kᵀ/√d (causal, mean over heads)"),
    ("c", "(AV)(AV)ᵀ"),
    ("d", "(AV W_O)(AV W_O)ᵀ"),
    ("e", "O Oᵀ, O = AV W_O + X"),
    ("f", "LN(O) LN(O)ᵀ"),
    ("g", "X' X'ᵀ, X' = FFN(LN(O)) + O"),
    ("h", "next layer Y Yᵀ"),
    ("i", "next layer Q Kᵀ/√d"),
]
#: architectures with a sequential block (attention, then + X, then the MLP): the panels' capture points exist
SEQUENTIAL = tuple(sorted(m for m, a in ADAPTERS.items() if a.resid_mid_path is not None))


@dataclass
class PanelsConfig:
    model_dir: str
    out: str
    layer: int = 0
    data: str = "stdlib"
    num_seqs: int = 200
    seq_len: int = 50
    batch_size: int = 10
    seed: int = 0
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda[:N]; resolved by poslens.runtime.parse_device
    dtype: str = "fp32"
    allow_pickle: bool = False
    trust_remote_code: bool = False
    figures: bool = True


def _gram(x: torch.Tensor) -> torch.Tensor:
    """Batch sum of ``x xᵀ`` over sequences: ``[B, S, d] -> [S, S]`` (float64)."""
    x = x.to(torch.float64)
    return torch.einsum("bsd,btd->st", x, x)


#: the capture point behind each Gram panel: (point, layer offset from the analysed layer)
PANEL_POINTS = {"a": ("attn_in", 0), "c": ("attn_z", 0), "d": ("attn_out", 0), "e": ("resid_mid", 0),
                "f": ("mlp_in", 0), "g": ("resid_post", 0), "h": ("attn_in", 1)}


def panel_points(adapter, layer: int, accs: dict[str, MeanAccumulator]) -> dict:
    """``{(point, layer): fn}`` adding the Gram panels a, c-h of ``layer`` into ``accs``
    (for :func:`poslens.capture.engine.loop.hooked`)."""
    def adder(name):
        def add(x):
            accs[name].sum += _gram(x).to(accs[name].sum.device)
        return add
    return {(pt, layer + off): adder(k) for k, (pt, off) in PANEL_POINTS.items()}


def panel_metrics(m: torch.Tensor, exclude_keys=None) -> dict:
    """Relativity index, non-relativity, locality and signed diagonal trend of one panel's causal
    lower triangle (the diagonal, a self-similarity, excluded). Sink-aware as ``poslens scan``: key
    0 (the attention-sink / BOS column; ``exclude_keys``, default
    :data:`poslens.capture.scan.finalize.SINK_COLUMNS`) is left out of the headline numbers, and the
    values with it (``*_with_sink``) are given beside them."""
    keys = tuple(SINK_COLUMNS if exclude_keys is None else exclude_keys)
    cv = causal_view(m.to(torch.float64), include_diagonal=True)
    ri = relativity_index(cv, exclude_keys=keys)
    ri_s = relativity_index(cv)
    S = m.shape[-1]
    i = torch.arange(S)
    off = m[(i[:, None] > i[None, :])]
    return {"relativity_index": ri, "non_relativity": None if ri is None else 1.0 - ri,
            "locality": locality(cv, exclude_keys=keys), "diagonal_trend": diagonal_trend(cv, exclude_keys=keys),
            "relativity_index_with_sink": ri_s, "non_relativity_with_sink": None if ri_s is None else 1.0 - ri_s,
            "locality_with_sink": locality(cv), "sink_columns": list(keys),
            "mean_offdiag": float(off.mean()) if off.numel() else None}


def compute_panels(model, adapter, config, source, layer: int, *, batch_size: int, device: str,
                   progress: bool = True, groups: dict | None = None) -> torch.Tensor:
    """The nine mean panels ``[9, S, S]`` (float64) of ``layer`` over every sequence of ``source``.
    ``groups`` (a dict, filled): the score panels (b) and (i) of each sequence group (sequence
    ``n % G``) on the noise grid, as sums ``[G, n, n]``, with ``counts [G]`` and the ``grid``."""
    if adapter.resid_mid_path is None:
        raise PoslensError(f"model type {adapter.model_type!r} runs attention and MLP in parallel, so panels (e) and "
                           "(f) (the residual stream between them) do not exist; panels need a sequential block.")
    S = source.seq_len
    accs = {k: MeanAccumulator((S, S)) for k in "acdefgh"}
    spec = CaptureSpec(num_layers=adapter.num_layers(config), num_heads=adapter.num_heads(config),
                       num_kv_heads=adapter.num_kv_heads(config), head_dim=adapter.head_dim(config), seq_len=S,
                       layers=[layer, layer + 1], rope_layers=adapter.rope_layers(config),
                       rope_layout=adapter.rope_layout)
    capture = Capture(spec, device=device)
    handles = attach(model, adapter, capture)

    def count(s, e):
        for acc in accs.values():
            acc.count += e - s
    try:
        with hooked(model, adapter, panel_points(adapter, layer, accs)):
            run_batches(model, source, batch_size=batch_size, device=device, capture=capture, on_batch=count,
                        progress=progress, description="panels")
    finally:
        for hd in handles:
            hd.remove()
    if groups is not None:
        acc = capture.accs["score_groups"]
        keep = acc.counts > 0
        sums = acc.sum[keep.to(acc.sum.device)].cpu()
        groups.update(b=sums[:, 0], i=sums[:, 1], counts=acc.counts[keep].cpu(), grid=capture.grid.cpu())
    scores = capture.means()["scores"].cpu()
    means = {k: a.mean for k, a in accs.items()}
    means["b"] = causal_view(scores[0], include_diagonal=True)
    means["i"] = causal_view(scores[1], include_diagonal=True)
    return torch.stack([means[k] for k, _ in PANELS])


def panels_figure(panels: torch.Tensor, layer: int, title: str = ""):
    """3 x 3 heat maps (1-99 % colour range over the lower triangle), Gram panels masked above the diagonal."""
    from poslens.figures import heatmap

    fig, axes = new_figure(3, 3, figsize=(11, 10.5))
    for ax, (k, desc), m in zip(axes.flat, PANELS, panels):
        heatmap(ax, causal_view(m, include_diagonal=True), title=f"({k}) {desc}", percentile=(1, 99))
    fig.suptitle(title or f"decoder layer {layer} (layers counted from 0): Gram decomposition (arXiv 2509.21042)",
                 fontsize=11)
    fig.tight_layout()
    return fig


def run_panels(cfg: PanelsConfig, progress: bool = True, *, model=None, tokenizer=None) -> dict:
    """Validate, compute the nine panels of ``cfg.layer`` and write the run directory ``cfg.out``.
    ``model``: a loaded causal LM, used where it is and handed back unchanged (``poslens.panels``);
    ``tokenizer``: its text tokenizer (default: the one saved beside it)."""
    t0 = time.time()
    config, adapter = _check_panels(cfg, model)
    if model is not None:
        from poslens.capture.model.borrow import borrowed, model_device
        from poslens.capture.scan.plan import loaded_model_tokenizer

        device = model_device(model)
        if tokenizer is None and cfg.data != "random":
            tokenizer = loaded_model_tokenizer(model)
    else:
        device = parse_device(cfg.device)
        tokenizer = None if cfg.data == "random" else load_tokenizer(cfg.model_dir, cfg.trust_remote_code)
    prepare_out_dir(cfg.out)
    groups: dict = {}
    source = make_source(cfg.data, seq_len=cfg.seq_len, num_seqs=cfg.num_seqs, seed=cfg.seed, tokenizer=tokenizer,
                         vocab_size=getattr(config, "vocab_size", None))
    if model is not None:
        with borrowed(model):
            panels = compute_panels(model, adapter, config, source, cfg.layer, batch_size=cfg.batch_size,
                                    device=device, progress=progress, groups=groups)
    else:
        dtype = resolve_dtype(cfg.dtype, device, config)
        model = load_model(cfg.model_dir, dtype=dtype, device=device, allow_pickle=cfg.allow_pickle,
                           trust_remote_code=cfg.trust_remote_code)
        panels = compute_panels(model, adapter, config, source, cfg.layer, batch_size=cfg.batch_size, device=device,
                                progress=progress, groups=groups)
    summary = _panels_summary(cfg, adapter, config, source, panels, wall_s=time.time() - t0, groups=groups)
    with staged_dir(cfg.out) as stage:
        write_json(stage / "config.json", {"command": "panels", **dataclasses.asdict(cfg),
                                           "model_source": source_record(cfg.model_dir)
                                           if not cfg.model_dir.startswith("<in-memory") else
                                           {"kind": "in-memory", "class": type(model).__name__},
                                           "versions": versions()})
        write_tensors(stage / "panels.safetensors", {"panels": panels.to(torch.float32)},
                      metadata={"order": [k for k, _ in PANELS], "layer": cfg.layer})
        if cfg.figures:
            save_figure(panels_figure(panels, cfg.layer), stage / "panels.png")
        write_summary(stage, summary, command="panels",
                      layers_describe=f"one decoder layer ({cfg.layer}) and the next one's input and scores (panels "
                                      "h, i); per-panel numbers under 'panels'")
    return summary


def _check_panels(cfg: PanelsConfig, model=None):
    """``(config, adapter)`` of ``cfg.model_dir`` (or of a loaded ``model``) once every option is valid
    for panels (writes nothing)."""
    if model is not None:
        from poslens.capture.scan.plan import loaded_model_config

        config, adapter = loaded_model_config(model, seq_len=cfg.seq_len)
    else:
        config, adapter = open_model_config(cfg.model_dir, seq_len=cfg.seq_len, allow_pickle=cfg.allow_pickle,
                                            trust_remote_code=cfg.trust_remote_code)
    if adapter.resid_mid_path is None:
        raise PoslensError(f"MODEL_DIR {cfg.model_dir}: model type {adapter.model_type!r} runs attention and MLP in "
                           f"parallel (no residual stream between them for panels e and f); panels support "
                           f"{', '.join(sorted(SEQUENTIAL))}.")
    L = adapter.num_layers(config)
    if not 0 <= cfg.layer <= L - 2:
        raise PoslensError(f"--layer {cfg.layer}: panels (h) and (i) need the next layer; pass 0..{L - 2} "
                           f"(the model has {L} layers).")
    require_positive(("--num-seqs", cfg.num_seqs), ("--batch-size", cfg.batch_size), ("--seq-len", cfg.seq_len))
    return config, adapter


def locality_se(group_sums: torch.Tensor, counts: torch.Tensor, exclude_keys=None) -> float | None:
    """Delete-one-group jackknife SE of a score map's :func:`locality` (key 0 left out, as in
    :func:`panel_metrics`) from its sequence groups' sums ``[G, n, n]`` and counts ``[G]``; None with
    fewer than two groups or a flat leave-one-out map."""
    if group_sums.shape[0] < 2:
        return None
    keys = tuple(SINK_COLUMNS if exclude_keys is None else exclude_keys)
    loo = leave_one_out_means(group_sums.to(torch.float64), counts)
    return jackknife_se_of([locality(causal_view(m, include_diagonal=True), exclude_keys=keys) for m in loo])


def _panels_summary(cfg: PanelsConfig, adapter, config, source, panels: torch.Tensor, wall_s: float,
                    groups: dict | None = None) -> dict:
    """The summary of a panels run: per-panel metrics, the table (numbers as numbers: the report and
    the terminal format them), figure captions and the judgement (:func:`judge_panels`). With the score
    panels' sequence ``groups`` (:func:`compute_panels`), panels (b) and (i) carry ``locality_se`` (jackknife over the
    groups, on the noise grid's positions) and ``noise_groups``."""
    rows = [{"panel": k, "description": desc, **panel_metrics(m)} for (k, desc), m in zip(PANELS, panels)]
    for r in rows:
        if groups and r["panel"] in ("b", "i"):
            r["locality_se"] = locality_se(groups[r["panel"]], groups["counts"])
            r["noise_groups"] = int(groups["counts"].numel())
            r["noise_grid_positions"] = int(groups["grid"].numel())
    summary = {
        "experiment": "kim-panels",
        "title": f"Gram decomposition of decoder layer {cfg.layer} ({adapter.model_type}, {source.num_seqs} x "
                 f"{cfg.seq_len} tokens)",
        "paper": "kim",
        "model_dir": str(cfg.model_dir), "model_type": adapter.model_type, "layer": cfg.layer,
        "num_seqs": source.num_seqs, "seq_len": cfg.seq_len, "data": source.describe(),
        "rope": cfg.layer in adapter.rope_layers(config),
        "panels": rows,
        "layer_convention": LAYER_CONVENTION,
        "tables": [{"title": f"panels of decoder layer {cfg.layer} (from 0): relativity and locality (lower triangle, "
                             "diagonal and key 0 excluded; non-relativity with key 0 beside it)",
                    "columns": ["panel", "matrix", "relativity index", "non-relativity", "non-relativity with key 0",
                                "locality", "diagonal trend", "mean off-diagonal"],
                    "rows": [[r["panel"], r["description"], r["relativity_index"], r["non_relativity"],
                              r["non_relativity_with_sink"], r["locality"], r["diagonal_trend"],
                              r["mean_offdiag"]] for r in rows]}],
        "figures": [{"file": "panels.png", "caption": f"The nine batch-averaged matrices of decoder layer {cfg.layer} "
                     "(layers counted from 0; upper triangle masked; colour range 1st-99th percentile)."}] if cfg.figures else [],
        "wall_s": wall_s,
    }
    summary["judgement"] = judge_panels(summary)
    return summary


# --------------------------------------------------------------------------------------------
# per-layer score maps of a scan (the paper's Figure 5 for any model)
# --------------------------------------------------------------------------------------------
def load_scan(scan_dir: str | Path) -> tuple[dict, dict, dict]:
    """``(maps, scan_config, scan_summary)`` of a ``poslens scan`` run directory, with clear errors."""
    from safetensors import safe_open

    p = Path(scan_dir)
    if not (p / "maps.safetensors").is_file():
        raise PoslensError(f"SCAN_DIR {p} has no maps.safetensors; pass the --out directory of a finished "
                           "`poslens scan`.")
    import json

    from poslens.rundir.io import safetensors_shapes

    f = p / "maps.safetensors"
    again = f"the scan is damaged: scan again (poslens scan ... --out {p} --overwrite)"
    safetensors_shapes(f, again=again)  # a file cut short or a damaged header: one line, not a SafetensorError
    try:
        maps = {k: v.to(torch.float64) for k, v in read_tensors(f).items()}
        with safe_open(str(f), "pt") as fh:
            meta = {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}
    except PoslensError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors' own errors on a damaged file
        why = (str(e).strip().splitlines() or [type(e).__name__])[-1][:160]
        raise PoslensError(f"{f}: cannot be read ({why}); {again}.") from None
    cfg = read_json(p / "config.json") if (p / "config.json").is_file() else {}
    summ = read_json(p / "summary.json") if (p / "summary.json").is_file() else {}
    check_map_shapes(f, maps, summ, again)
    summ.setdefault("_meta", meta)
    return maps, cfg, summ


def check_map_shapes(f: Path, maps: dict, summary: dict, again: str) -> None:
    """Refuse maps whose shapes disagree with each other or with the scan's summary (its decoder layers,
    ``seq_len`` and the heads its layers list), naming the file, the tensor and what was expected."""
    layers = [l for l in summary.get("layers") or [] if isinstance(l, dict)
              and isinstance(l.get("layer"), int) and not isinstance(l.get("layer"), bool)]
    S = summary.get("seq_len") if isinstance(summary.get("seq_len"), int) else None
    heads = {len(l["q_top1_energy"]) for l in layers if isinstance(l.get("q_top1_energy"), list)}
    want = {"L": len(layers) or None, "S": S, "H": heads.pop() if len(heads) == 1 else None}
    # each tensor's dimensions, by what they count (None: any size)
    dims = {"scores": ("L", "S", "S"), "probs": ("L", "S", "S"), "slash": ("L", "H", "S"),
            "q_gram": ("L", "H", None, None), "dim_logit": ("L", "H", None), "k_gram": ("L", None, None, None)}
    for name, spec in dims.items():
        if name not in maps:
            continue
        shape = tuple(maps[name].shape)
        bad = len(shape) != len(spec)
        for n, key in zip(shape, spec):
            if bad or key is None:
                continue
            if want[key] is None:
                want[key] = n  # the first tensor that counts it says how many there are
            bad = n != want[key]
        if bad:
            expected = "[" + ", ".join("any" if k is None else f"{want[k] or k}" for k in spec) + "]"
            raise PoslensError(f"{f}: its {name!r} tensor has shape {list(shape)} where {expected} is expected (the "
                               f"scan's summary.json and its other maps); {again}.")


def layer_score_metrics(scores: torch.Tensor) -> list[dict]:
    """Per layer of ``scores [L, S, S]``: relativity index, non-relativity and locality."""
    return [panel_metrics(scores[l]) for l in range(scores.shape[0])]


def run_score_maps(scan_dir: str, out: str, figures: bool = True) -> dict:
    """Raw and diagonal-normalised score maps of every layer of a scan, with non-relativity per layer."""
    from poslens.figures import score_map_figures  # matplotlib: only when drawing

    maps, scfg, ssum = load_scan(scan_dir)
    prepare_out_dir(out)
    scores = maps["scores"]
    layer_ids = ssum["_meta"].get("layers") or list(range(scores.shape[0]))
    windows = (ssum.get("attention") or {}).get("windows")
    blocks = (ssum.get("map_size") or {}).get("block", 1)
    if blocks > 1:  # a --map-size scan: block means; blocks without a visible entry are out of every metric
        bm = BlockMaps(int(ssum["seq_len"]), scores.shape[-1])
        scores = torch.stack([map_view(scores[i], (windows or {l: None for l in layer_ids})[l], bm)
                              for i, l in enumerate(layer_ids)])
    elif windows:  # keys outside a layer's sliding window are unseen (stored as 0): out of every metric
        scores = torch.stack([window_view(scores[i], windows[l]) for i, l in enumerate(layer_ids)])
    rows = layer_score_metrics(scores)
    if "probs" in maps:  # the sink's own number beside the sink-excluded ones
        for r, w in zip(rows, sink_weight(maps["probs"]).tolist()):
            r["sink_weight"] = w
    table = [[l, r["relativity_index"], r["non_relativity"], r["non_relativity_with_sink"], r["locality"],
              r["diagonal_trend"]] for l, r in zip(layer_ids, rows)]  # numbers: the report and terminal format them
    draw = figures
    raw_caption = ("Mean pre-softmax scores per decoder layer (counted from 0; mean over heads and sequences; "
                   "1st-99th percentile colour range"
                   + (f"; block means of {blocks} x {blocks} positions, --map-size" if blocks > 1 else "") + ").")
    with staged_dir(out) as stage:
        files = score_map_figures(causal_view(scores, include_diagonal=True), stage, layer_ids=layer_ids,
                                  per_figure=8) if draw else []
        figures = [{"file": f, "caption": raw_caption if f.endswith("_raw.png") else "The same maps, "
                    "diagonal-normalised: what remains is the non-relative (absolute-position) part."} for f in files]
        summary = {"experiment": "kim-score-maps", "paper": "kim",
                   "title": f"Per-layer score maps of {ssum.get('model_type', 'a model')} "
                            f"({ssum.get('num_seqs', '?')} x {ssum.get('seq_len', scores.shape[-1])} tokens)",
                   "scan_dir": str(scan_dir), "layers": [{"layer": l, **r} for l, r in zip(layer_ids, rows)],
                   "layer_convention": LAYER_CONVENTION,
                   "tables": [{"title": "non-relativity per decoder layer (from 0; key 0 excluded, with key 0 beside "
                                        "it)", "columns": ["layer", "relativity index", "non-relativity",
                                                           "non-relativity with key 0", "locality", "diagonal trend"],
                               "rows": table}],
                   "figures": figures}
        summary["judgement"] = judge_score_maps(summary)
        write_json(stage / "config.json", {"command": "kim-maps", "scan_dir": str(scan_dir), "out": str(out),
                                           "scan_options": scfg.get("options"), "versions": versions()})
        write_summary(stage, summary, command="kim-maps", layers_describe="mean pre-softmax attention scores of "
                      "each scanned decoder layer (mean over heads and sequences)")
    return summary
