"""A finished scan into its run directory: ``maps.safetensors``, ``summary.json`` (per-layer score-map
numbers with their noise floors, APS, norm score, slash heads, rank-one measures) and figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from poslens.capture.model.adapters import layer_rope
from poslens.capture.model.load import trained_context
from poslens.capture.statistics.protocol import qualified_name
from poslens.capture.statistics.accumulators import noise_grid
from poslens.capture.statistics.builtin.head_maps import head_map_blocks
from poslens.conventions import LAYER_CONVENTION
from poslens.metrics import adjacency_probability_score, describe_map, locality, norm_score
from poslens.metrics.diagonal import NO_GROUPS, causal_view, window_view
from poslens.metrics.neighborhood import aps_positions
from poslens.metrics.rank import band_contributions, rank_measures
from poslens.conventions import SLASH_MAX_DELTA, SLASH_MIN_DELTA
from poslens.metrics.slash import scored_offsets, sink_weight, top_slash_heads
from poslens.rundir.io import write_tensors

if TYPE_CHECKING:  # annotations only: the capture and the plan are read through the attributes used below
    from poslens.capture.engine.capture import Capture
    from poslens.capture.scan.plan import ScanPlan


def _subsample(m: torch.Tensor, k: int) -> torch.Tensor:
    """``m`` on the positions an APS reads (:func:`poslens.metrics.neighborhood.aps_positions`)."""
    S = m.shape[-1]
    if S <= k:
        return m
    idx = aps_positions(S, k, device=m.device)
    return m[..., idx, :][..., idx] if m.ndim >= 2 and m.shape[-2] == S else m[..., idx]


def _opt(x):
    return None if x is None else float(x)


def _at(values: list | None, i: int):
    """``values[i]``, None where there are no values."""
    return None if values is None else values[i]


#: key columns left out of whole-map statistics by default: real models put most attention on key 0
#: (the attention sink, the BOS position), which otherwise dominates relativity and locality
SINK_COLUMNS = (0,)




def _per_sequence(acc) -> tuple[list, list]:
    """Mean and standard deviation over sequences of a per-sequence statistic's accumulator."""
    mean = acc.mean.tolist()
    std = acc.var.sqrt().tolist() if acc.count >= 2 else [None] * len(mean)
    return mean, std


def score_map_numbers(sc: torch.Tensor, groups: torch.Tensor | None, counts: torch.Tensor | None, grid: torch.Tensor,
                      locality_positions: int, sink_columns=SINK_COLUMNS, grid_map: torch.Tensor | None = None) -> dict:
    """The score-map numbers of one layer: sink-excluded headline values on the full map (relativity
    index, locality on at most ``locality_positions`` positions, signed diagonal trend, within-diagonal
    RMS), the with-sink values beside them, and the noise floor from the group maps on ``grid``
    (p-values, RMS noise floor, trend standard error: :func:`poslens.metrics.diagonal.describe_map`).
    Where ``grid`` is coarser than the map, the same statistics of the grid map (``grid_*``, the ones
    the p-values and standard error test) are given too, under ``noise_positions`` positions; where it
    covers the map, the headline relativity index is the noise-corrected one (group cross-products,
    ``relativity_index_noise_corrected``), the uncorrected index in ``relativity_index_uncorrected``."""
    sub = _subsample(sc, locality_positions)
    out = describe_map(sc, exclude_keys=sink_columns, locality_map=sub, locality_all_keys=True)
    # the with-sink locality from the same pair counts; where the sink-excluded map is constant (no counts)
    # it is counted on its own
    locality_with_sink = out.pop("locality_all_keys")
    ri_with_sink = out.pop("relativity_index_all_keys")  # relativity_index(sc), from the same diagonal sums
    if out["flat"]:
        locality_with_sink = locality(sub)
    if groups is not None and groups.shape[0] >= 2:
        g = causal_view(groups, include_diagonal=True)
        on_grid = sc[grid][:, grid] if grid_map is None else grid_map  # grid_map: the mean map on the grid
        noise = describe_map(causal_view(on_grid), g, counts, exclude_keys=sink_columns)
        for key in ("flat_p", "nonrelative_p", "trend_p", "within_diag_rms_noise", "diagonal_trend_se", "noise_groups"):
            out[key] = noise.get(key)
        out["flat"] = bool(noise["flat"])
        out["noise_positions"] = int(grid.numel())
        if grid.numel() < sc.shape[-1]:
            # the p-values, noise floor and standard error belong to the statistics of the grid map: give
            # those beside the full-map headline numbers, so each uncertainty sits next to its own statistic
            for key in ("relativity_index", "diagonal_trend", "within_diag_rms", "locality"):
                out[f"grid_{key}"] = noise.get(key)
        elif noise.get("relativity_index") is not None:
            # the groups cover the whole map: the headline index is corrected with them (variances from
            # products of different groups only), the uncorrected one kept beside it
            out["relativity_index_uncorrected"] = out["relativity_index"]
            out["relativity_index"] = noise["relativity_index"]
            out["relativity_index_noise_corrected"] = True
        out.pop("noise", None)
        if noise.get("noise"):
            out["noise"] = noise["noise"]
        if out["flat"]:
            out["relativity_index"] = out["locality"] = None
            if "relativity_index_uncorrected" in out:
                out["relativity_index_uncorrected"] = None
    else:
        out["noise"] = NO_GROUPS
    flat = out["flat"] and groups is not None and groups.shape[0] >= 2
    out["relativity_index_with_sink"] = None if flat else _opt(ri_with_sink)
    out["locality_with_sink"] = None if flat else _opt(locality_with_sink)
    out["sink_columns"] = list(sink_columns)
    return out


def map_view(m: torch.Tensor, window: int | None, blocks=None, causal: bool = True) -> torch.Tensor:
    """A stored score/weight map as the summary reads it: NaN where no query sees the entry (above the
    diagonal, outside a sliding window); a block map (``--map-size``) NaN in the blocks without a
    visible entry."""
    if blocks is None:
        return window_view(causal_view(m, include_diagonal=True), window)
    empty = blocks.counts(causal, window) == 0
    return m.masked_fill(empty.to(m.device), float("nan"))


def _grid_mean(groups: torch.Tensor, counts: torch.Tensor | None, li: int) -> torch.Tensor | None:
    """Layer ``li``'s mean score map on the noise grid, from the group means and their counts (what
    ``scores[grid][:, grid]`` is for a full map; a block map has no grid entries)."""
    if counts is None or not groups.shape[0]:
        return None
    w = counts.to(torch.float64)
    return (groups[:, li].cpu() * w[:, None, None]).sum(0) / w.sum()


def _grid_groups(groups: torch.Tensor, li: int, grid: torch.Tensor, window: int | None) -> torch.Tensor | None:
    """Layer ``li``'s group maps on the noise grid, NaN outside a sliding window (as the full map)."""
    if not groups.shape[0]:
        return None
    g = groups[:, li].cpu()
    if window and window < int(grid[-1]) + 1:
        far = (grid[:, None] - grid[None, :]) >= window
        g = g.masked_fill(far, float("nan"))
    return g


class _Reader:
    """A finished capture as the summary reads it: float64 means layer by layer (before the sums are
    freed), what was not asked for (--stats) as None, and what every layer's numbers share (the
    noise grid and groups, per-sequence APS, sliding windows, the --map-size blocks)."""

    def __init__(self, capture: Capture, plan: ScanPlan, rope: dict | None = None, attention: dict | None = None):
        self.capture, self.plan, self.spec = capture, plan, plan.spec
        self.rope, self.attention = rope, attention
        spec, has = plan.spec, self.has
        self.n_seqs = capture.sequences
        self.k = plan.cfg.aps_max_positions
        self.rot_dim, self.base = plan.adapter.rotary_dim(plan.config), plan.adapter.rope_base(plan.config)
        # the summary is computed on the CPU, whichever device accumulated (a GPU scan's sums)
        self.groups, self.counts = tuple(t.cpu() for t in capture.accs["score_groups"].group_means()) \
            if has("score_groups") else (torch.zeros(0, device="cpu"), None)
        self.grid = noise_grid(spec.seq_len, spec.noise_max_positions)
        nl = len(spec.layers)
        self.aps = _per_sequence(capture.accs["aps_seq"]) if has("aps_seq") else ([None] * (nl + 1),) * 2
        self.attn_aps = _per_sequence(capture.accs["attn_aps_seq"]) if has("attn_aps_seq") else ([None] * nl,) * 2
        self.windows = (attention or {}).get("windows") or [None] * spec.num_layers
        self.blocks = capture.blocks  # --map-size: the S x S maps are block means
        # the mean-map APS and norm score of every index at once (embeddings and layers; layers): one
        # count over all the maps
        self.mean_map_aps = {"cosine": self.of_all("cosine", nl + 1, adjacency_probability_score),
                             "attn_cosine": self.of_all("attn_cosine", nl, adjacency_probability_score)}
        self.norm_scores = self.of_all("norms", nl + 1, norm_score)

    def has(self, name: str) -> bool:
        return name in self.capture.accs

    def mean(self, name: str, idx=slice(None)) -> torch.Tensor:
        """float64 mean of one accumulator at ``idx``."""
        return self.capture.accs[name].mean_at(idx).cpu()

    def when(self, name: str, fn):
        return fn() if self.has(name) else None

    def of_all(self, name: str, n: int, fn) -> list | None:
        """``fn`` of accumulator ``name``'s mean at its ``n`` leading indices, each on the APS positions
        (the entries :func:`_subsample` keeps, the only ones read, mirrored and divided:
        :meth:`~poslens.capture.statistics.accumulators.MeanAccumulator.mean_on`), as floats; None
        where it was not asked for."""
        if not self.has(name):
            return None
        acc = self.capture.accs[name]
        S = acc.shape[-1]
        idx = aps_positions(S, self.k) if S > self.k else None
        matrix = len(acc.shape) >= 3 and acc.shape[-2] == S
        return fn(torch.stack([acc.mean_on(i, idx, matrix).cpu() for i in range(n)])).tolist()


def _score_map_layer(r: _Reader, li: int, l: int) -> dict:
    """Layer ``l``'s score-map numbers (empty without ``scores``). Entries outside a sliding window
    are unseen (stored as 0, like above the diagonal): NaN here."""
    spec, blocks, window = r.spec, r.blocks, r.windows[l]
    if not r.has("scores"):
        return {}
    sc = map_view(r.mean("scores", li), window, blocks, causal=not spec.bidirectional)
    return score_map_numbers(sc, _grid_groups(r.groups, li, r.grid, window), r.counts, r.grid, r.k,
                             grid_map=None if blocks is None else _grid_mean(r.groups, r.counts, li))


def _sink_weight(r: _Reader, li: int) -> torch.Tensor:
    """:func:`poslens.metrics.slash.sink_weight` of layer ``li``'s mean weight map, from its key-0
    column alone (the only entries it reads)."""
    if r.spec.seq_len < 2:
        return sink_weight(r.mean("probs", li))
    return r.mean("probs", (li, slice(1, None), 0)).mean(-1)


def _layer_record(r: _Reader, li: int, l: int) -> dict:
    """One entry of the summary's ``layers``: the ``li``-th captured layer, decoder layer ``l``."""
    spec, mean, when = r.spec, r.mean, r.when
    rm_q = when("q_gram", lambda: rank_measures(mean("q_gram", li)))
    rm_k = when("k_gram", lambda: rank_measures(mean("k_gram", li)))
    table = layer_rope(r.rope, l)  # the model's own frequencies (scaled RoPE, Gemma 3's two bases)
    bands = when("dim_logit", lambda: band_contributions(
        mean("dim_logit", li), r.rot_dim if l in spec.rope_layers else None, r.base, spec.seq_len,
        inv_freq=table["inv_freq"] if table else None))
    (aps_mean, aps_std), (attn_aps_mean, attn_aps_std) = r.aps, r.attn_aps
    return {
        "layer": l,
        "rope": l in spec.rope_layers and l not in spec.no_rope_layers,
        "sliding_window": r.windows[l],
        **_score_map_layer(r, li, l),
        "sink_weight": when("probs", lambda: float(
            _sink_weight(r, li) if r.blocks is None else mean("probs_key0", li)[1:].mean())),
        "aps": aps_mean[li + 1],  # = aps_mean: the paper's per-sequence APS (before, the mean map's)
        "aps_mean": aps_mean[li + 1],
        "aps_std": aps_std[li + 1],
        "attn_aps": attn_aps_mean[li],
        "attn_aps_mean": attn_aps_mean[li],
        "attn_aps_std": attn_aps_std[li],
        "mean_map_aps": _at(r.mean_map_aps["cosine"], li + 1),
        "attn_mean_map_aps": _at(r.mean_map_aps["attn_cosine"], li),
        "norm_score": _at(r.norm_scores, li + 1),
        "top_slash_heads": when("slash", lambda: top_slash_heads(mean("slash", slice(li, li + 1)), k=3,
                                                                 layer_ids=[l])) or [],
        "q_top1_energy": rm_q["top1_energy"].tolist() if rm_q else None,
        "k_top1_energy": rm_k["top1_energy"].tolist() if rm_k else None,
        "q_effective_rank": rm_q["effective_rank"].tolist() if rm_q else None,
        "k_effective_rank": rm_k["effective_rank"].tolist() if rm_k else None,
        "band_logit": {b: v.tolist() for b, v in bands.items()} if bands is not None else None,
    }


def _summary(r: _Reader, layers: list) -> dict:
    """The scan's summary around its per-layer records (whole-model numbers, controls, the noise
    design, the slash table)."""
    cfg, spec, blocks, k = r.plan.cfg, r.spec, r.blocks, r.k
    offs = scored_offsets(spec.seq_len, SLASH_MIN_DELTA, SLASH_MAX_DELTA)
    aps_mean, aps_std = r.aps
    trained = trained_context(r.plan.adapter, r.plan.config)
    return {
        "model_dir": str(cfg.model_dir),
        "model_type": r.plan.adapter.model_type,
        "num_seqs": r.n_seqs,
        "seq_len": spec.seq_len,
        # the model's trained context (max_position_embeddings) and whether seq_len is past it (--beyond-context)
        "trained_context": trained,
        "beyond_context": trained is not None and spec.seq_len > trained,
        "layer_convention": LAYER_CONVENTION,
        "stats": sorted(spec.stats),
        "user_statistics": [qualified_name(st) for st in r.capture.user],
        # --map-size: S x S maps stored as block means (n x n blocks of `block` positions; see docs/scan.md)
        "map_size": {"blocks": blocks.n, "block": blocks.f,
                     "masked": "blocks without a visible (causal, in-window) entry are NaN; others average "
                               "their visible entries"} if blocks is not None else None,
        # --heads all: every head's mean weight map as block means (head_maps [L, H, m, m], blocks of f positions)
        "head_map_block": head_map_blocks(spec.seq_len, spec.map_size).f if spec.head_maps else None,
        "head_map_size": head_map_blocks(spec.seq_len, spec.map_size).n if spec.head_maps else None,
        "controls": {"no_rope_layers": sorted(spec.no_rope_layers), "bidirectional": spec.bidirectional},
        "reservoir_slots": r.capture.reservoir.filled if r.capture.reservoir is not None else 0,
        "embedding_aps": aps_mean[0],
        "embedding_aps_mean": aps_mean[0],
        "embedding_aps_std": aps_std[0],
        "embedding_mean_map_aps": _at(r.mean_map_aps["cosine"], 0),
        "aps_positions": min(k, spec.seq_len),
        "sink_columns": list(SINK_COLUMNS),
        "noise": {"groups": int(r.groups.shape[0]), "grid_positions": int(r.grid.numel()),
                  "group_rule": "sequence n in group n % " + str(spec.noise_groups)},
        "layers": layers,
        "slash_offsets": [offs.start, offs.stop - 1] if len(offs) else None,
        "slash_top_heads": r.when("slash", lambda: top_slash_heads(r.mean("slash"), k=10,
                                                                   layer_ids=spec.layers)) or [],
        "files": ["config.json", "maps.safetensors", "summary.json"],
        "rope": r.rope,
        "attention": r.attention,
    }


def _write_maps(out: Path, r: _Reader) -> dict:
    """``maps.safetensors``: float32 means, converted in place one accumulator at a time (the capture
    is spent afterwards), and the reservoir sample; returns the tensors written."""
    spec, blocks = r.spec, r.blocks
    tensors = r.capture.release_means(torch.float32, group_means={"score_groups": (r.groups, r.counts)}
                                      if r.counts is not None else None)
    tensors = {k: tensors.pop(k).cpu() for k in list(tensors)}  # the file, figures and tables: on the CPU
    if r.capture.reservoir is not None:
        tensors.update({k: v.cpu() for k, v in r.capture.reservoir.result().items()})
    tensors.update(r.capture.user_results(taken=tensors))  # users' statistics, as their result() names them
    write_tensors(out / "maps.safetensors", tensors,
                  metadata={"layers": spec.layers, "heads": [list(h) for h in spec.heads], "num_seqs": r.n_seqs,
                            "seq_len": spec.seq_len, "cosine_index": "0 = embeddings, k = output of layers[k-1]",
                            "rope": r.rope, "attention": r.attention,
                            "layer_convention": LAYER_CONVENTION,
                            "map_block": blocks.f if blocks is not None else 1,
                            **({"head_map_block": head_map_blocks(spec.seq_len, spec.map_size).f}
                               if spec.head_maps else {}),
                            "score_groups": "[g, L, n, n] scores of sequence groups on positions 0, s, 2s, ... "
                                            f"(n = {r.grid.numel()}); score_group_counts: sequences per group",
                            "aps_seq": "per-sequence APS, mean over sequences (index as cosine)"})
    return tensors


def finalize(out: Path, capture: Capture, plan: ScanPlan, *, rope: dict | None = None, attention: dict | None = None,
             figures: bool = True) -> dict:
    """Write ``maps.safetensors`` (float32 means) and figures; return the summary dict. ``rope`` and
    ``attention``: what the loaded model told the run (its RoPE tables, its dry run's windows and scales).

    Decoder layers count from 0. Score-map statistics leave out the sink column (key 0) by default
    and give the with-sink values beside them; the APS is the paper's per-sequence APS (mean and
    std over sequences), the APS of the mean map is ``mean_map_aps``.
    """
    r = _Reader(capture, plan, rope, attention)
    summary = _summary(r, [_layer_record(r, li, l) for li, l in enumerate(r.spec.layers)])
    tensors = _write_maps(out, r)
    if figures and "scores" in tensors:
        from poslens.figures import ZOOM_POSITIONS, score_map_figures  # matplotlib: only when drawing

        summary["files"] += score_map_figures(causal_view(tensors["scores"]), out, layer_ids=r.spec.layers,
                                              zoom=ZOOM_POSITIONS,
                                              block=r.blocks.f if r.blocks is not None else 1)
    return summary
