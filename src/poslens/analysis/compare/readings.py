"""What ``poslens compare`` reads from one sequence group's capture: every positional reading, per
decoder layer (from 0) and per head where the reading is per head, and the next-token losses of
the same forwards.

Per head (``[L, H]``): the sink share (mean weight on key 0 over the queries after it), the slash
profile (SlashScore by offset, arXiv 2601.08297; the best offset is chosen on the pooled profile),
the previous-token score SlashScore(1), the entropy of the attention rows and the mean attention
distance. Per layer (``[L]``): the relativity index, locality and diagonal trend of the layer's mean
score map (key 0 left out, as the scan reads them), the share of q·k energy in each RoPE band (the
fingerprint's measure, bands of the reference side's frequencies) and the number of massive
pre-RoPE q and k dimensions (Jin et al., ICML 2025, Definition 1).
"""

from __future__ import annotations

import torch

from poslens.capture.scan.finalize import SINK_COLUMNS  # key 0 left out, as the scan's headline numbers
from poslens.capture.statistics.protocol import Statistic
from poslens.conventions import SLASH_MAX_DELTA, SLASH_MIN_DELTA
from poslens.metrics.diagonal import diagonal_normalize, diagonal_trends, mask_keys, valid_mask
from poslens.metrics.fingerprint import MASSIVE_LAMBDA, band_shares, frequency_usage, massive_dims
from poslens.metrics.neighborhood import aps_positions, pair_counts, pair_fraction
from poslens.metrics.slash import scored_offsets
from poslens.rope import BANDS

#: the statistics a compare capture accumulates (the entropy is :class:`HeadEntropy`)
COMPARE_STATS = "scores,slash,qk"
#: positions the O(S^3) locality of a score map is computed on (as the scan's APS positions)
LOCALITY_POSITIONS = 256

#: the per-head readings and the per-layer ones, in the order of the tables
HEAD_READINGS = ("sink", "slash", "prev_token", "entropy", "distance")
LAYER_READINGS = ("relativity", "locality", "diagonal_trend", *(f"band_{b}" for b in BANDS), "massive_dims")


class HeadEntropy(Statistic):
    """Each head's mean entropy of its attention rows (nats), ``-sum_j p_ij log p_ij`` averaged over
    the query rows and the sequences: ``entropy [L, H]`` (decoder layers in the order captured)."""

    needs = ("probs",)

    def __init__(self):
        self.sum: dict[int, torch.Tensor] = {}
        self.rows: dict[int, int] = {}

    def add(self, layer, probs):
        # -p log p summed over the keys; 0 log 0 = 0 for the keys a row does not see (a weight below 1e-30 counts
        # as 1e-30 inside the log: its term is below 1e-28)
        e = (probs * probs.clamp_min(1e-30).log()).sum(-1)  # [b, H, c]
        s = -e.sum((0, 2)).to(torch.float64).cpu()
        self.sum[layer] = self.sum[layer] + s if layer in self.sum else s
        self.rows[layer] = self.rows.get(layer, 0) + probs.shape[0] * probs.shape[2]

    def merge(self, other):
        for l, s in other.sum.items():
            self.sum[l] = self.sum[l] + s if l in self.sum else s.clone()
            self.rows[l] = self.rows.get(l, 0) + other.rows[l]

    def state_dict(self):
        return {"sum": {int(l): s for l, s in self.sum.items()}, "rows": {int(l): r for l, r in self.rows.items()}}

    def load_state_dict(self, state):
        self.sum = {int(l): s for l, s in state["sum"].items()}
        self.rows = {int(l): int(r) for l, r in state["rows"].items()}

    def result(self):
        return {"entropy": torch.stack([self.sum[l] / self.rows[l] for l in sorted(self.sum)])}


def mean_distance(slash: torch.Tensor) -> torch.Tensor:
    """The mean attention distance ``(1/S) sum_i sum_j p_ij (i - j)`` ``[...]`` from slash profiles
    ``[..., S]`` (``slash[d]`` the mean weight on offset ``d``, over the ``S - d`` queries that have
    one): the diagonal sums are ``(S - d) slash[d]``, so the expected offset needs nothing else."""
    S = slash.shape[-1]
    d = torch.arange(S, dtype=torch.float64, device=slash.device)
    return (slash.to(torch.float64) * (d * (S - d))).sum(-1) / S


def sink_share(sink_heads: torch.Tensor) -> torch.Tensor:
    """Each head's mean weight on key 0 over the queries after it, ``[L, H]`` from ``[L, H, S]``."""
    return sink_heads[..., 1:].to(torch.float64).mean(-1) if sink_heads.shape[-1] > 1 \
        else torch.full(sink_heads.shape[:-1], float("nan"), dtype=torch.float64)


def slash_profile(slash: torch.Tensor) -> torch.Tensor:
    """The SlashScores at the scored offsets ``[L, H, D]`` (offset ``d`` at index ``d - SLASH_MIN_DELTA``)."""
    offs = scored_offsets(slash.shape[-1], SLASH_MIN_DELTA, SLASH_MAX_DELTA)
    return slash[..., offs.start:offs.stop].to(torch.float64)


def score_map_readings(maps: torch.Tensor) -> dict[str, torch.Tensor]:
    """Relativity index, locality and diagonal trend of each of ``maps [G, M, M]`` (one layer's mean score
    map in every sequence group, as the summary reads it: NaN where no query sees the entry), key 0 left
    out, all groups at once: ``{name: [G]}``, NaN for a flat map. Each equals
    :func:`poslens.metrics.diagonal.relativity_index`, :func:`~poslens.metrics.diagonal.locality` (on at most
    :data:`LOCALITY_POSITIONS` positions) and :func:`~poslens.metrics.diagonal.diagonal_trend` of that map
    alone (``tests/compare``)."""
    mk = mask_keys(maps.to(torch.float64), SINK_COLUMNS)
    G, S = mk.shape[0], mk.shape[-1]
    mask = valid_mask(S, device=mk.device) & torch.isfinite(mk).all(0)
    v = mk[:, mask]  # [G, n]
    nan = torch.full((G,), float("nan"), dtype=torch.float64)
    if v.shape[1] < 2:
        return {"relativity": nan, "locality": nan.clone(), "diagonal_trend": nan.clone()}
    centred = v - v.mean(-1, keepdim=True)
    scale = v.abs().amax(-1).clamp_min(1e-300)
    flat = centred.abs().amax(-1) <= 1e-12 * scale  # only an exactly constant map (no groups to test it on)
    var_map = (centred ** 2).mean(-1)
    within = diagonal_normalize(torch.where(mask, mk, float("nan")))[:, mask]
    var_dn = (within ** 2).mean(-1).clamp_min(0.0)
    ri = (1.0 - var_dn / var_map.clamp_min(1e-300)).clamp(0.0, 1.0)
    ri = torch.where(var_map > 0, ri, float("nan"))
    idx = aps_positions(S, LOCALITY_POSITIONS)
    sub = mk[:, idx][:, :, idx] if S > LOCALITY_POSITIONS else mk
    rises, tied, pairs = pair_counts(sub)
    loc = 2.0 * pair_fraction(rises, tied, pairs, ties=0.5) - 1.0
    trend = diagonal_trends(mk)
    return {k: torch.where(flat, float("nan"), x) for k, x in
            (("relativity", ri), ("locality", loc), ("diagonal_trend", trend))}


def energy_readings(q_gram: torch.Tensor, k_gram: torch.Tensor, labels: list, rotary_dim: int | None,
                    layout: str) -> dict[str, torch.Tensor]:
    """Per layer: the share of q·k energy in each RoPE band (mean over the query heads; ``labels[l]``
    the band of each rotary pair of layer ``l``, None where the layer has no RoPE: NaN) and the number
    of massive pre-RoPE q and k dimensions (Jin et al.'s lambda = 5)."""
    L = q_gram.shape[0]
    out = {f"band_{b}": torch.full((L,), float("nan"), dtype=torch.float64) for b in BANDS}
    if rotary_dim:
        pairs, unrot = frequency_usage(q_gram, k_gram, rotary_dim, layout)
        for l in range(L):
            if labels[l] is None:
                continue
            shares = band_shares(pairs[l], unrot[l], labels[l])
            for b in BANDS:
                out[f"band_{b}"][l] = shares[b].nanmean()
    q = massive_dims(q_gram.to(torch.float64), MASSIVE_LAMBDA).sum((1, 2))
    k = massive_dims(k_gram.to(torch.float64), MASSIVE_LAMBDA).sum((1, 2))
    out["massive_dims"] = (q + k).to(torch.float64)
    return out


# --------------------------------------------------------------------------------------------
# the losses of the same forwards
# --------------------------------------------------------------------------------------------
def next_token_losses(model, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[B, S - 1]`` float32: the cross-entropy of token ``t`` given the tokens before it, from the final
    hidden states ``[B, S, d]`` through the model's LM head with its final logit soft cap: ablate's
    :func:`~poslens.analysis.ablate.losses.blocked_token_losses` (one pass of the head, a block of
    positions at a time), so both commands give the same loss."""
    from poslens.analysis.ablate.losses import blocked_token_losses

    head = model.get_output_embeddings()
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    return blocked_token_losses(head, hidden, ids, head.weight.shape[0], softcap=cap).to(ids.device)


def bucket_losses(losses: torch.Tensor, buckets: list[tuple[int, int]]) -> torch.Tensor:
    """``[N, 1 + len(buckets)]`` float64: each sequence's mean loss over every position, then over each
    position bucket ``[lo, hi)`` of :func:`poslens.analysis.ablate.losses.position_buckets`."""
    x = losses.to(torch.float64)
    cols = [x.mean(1)] + [x[:, lo - 1:hi - 1].mean(1) for lo, hi in buckets]
    return torch.stack(cols, 1)
