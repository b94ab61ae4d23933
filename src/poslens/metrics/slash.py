"""Slash-pattern metrics (arXiv 2601.08297).

``SlashScore(d) = E_P[(1/(N-d)) sum_{i=d+1..N} S_{i,i-d}(P)]``: the mean post-softmax weight a
head puts on its d-th sub-diagonal. A head is (kappa, d)-slash-dominant if SlashScore(d) >= kappa.
Profiles are ``[..., S]`` tensors indexed by d = 0 .. S-1.
"""

from __future__ import annotations

import math

import torch

from poslens.conventions import SLASH_MAX_DELTA, SLASH_MIN_DELTA
from poslens.errors import PoslensError
from poslens.metrics.diagonal import as_float64
from poslens.metrics.verdicts import SINK_CHANCE_FORMULA, uniform_sink_weight, uniform_slash  # noqa: F401



def scored_offsets(S: int, min_offset: int = SLASH_MIN_DELTA, max_offset: int | None = SLASH_MAX_DELTA) -> range:
    """Offsets ``d`` a head is scored at in a length-``S`` map: ``min_offset <= d <= max_offset`` and at
    least half of the queries have a key at that offset (``S - d >= ceil(S / 2)``), so no offset is
    judged on a handful of entries near the corner of the map."""
    hi = S - (S + 1) // 2
    if max_offset is not None:
        hi = min(hi, max_offset)
    return range(max(0, min_offset), hi + 1)


def slash_profile(attn) -> torch.Tensor:
    """SlashScore(d) of attention matrices ``[..., S, S]`` (rows = queries), averaged over leading
    dims that the caller wants to average; returns ``[..., S]`` (no averaging here).

    Direct reference computation: the mean of each sub-diagonal.
    """
    a = torch.as_tensor(attn, dtype=torch.float64)
    S = a.shape[-1]
    return torch.stack([torch.diagonal(a, offset=-d, dim1=-2, dim2=-1).mean(-1) for d in range(S)], dim=-1)


def best_slash(slash, min_offset: int = SLASH_MIN_DELTA, max_offset: int | None = SLASH_MAX_DELTA,
               seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The best slash head rule: each head's strongest SlashScore over the :func:`scored_offsets`
    ``min_offset..max_offset`` of a length-``seq_len`` map (default: the profiles' length; a profile cut
    short after the largest offset gives the same answer), NaN entries ignored, a tie going to the
    smallest offset. ``slash`` is ``[..., S]``; returns ``(offset [...], score [...])`` (float64), offset
    -1 and score NaN for a head without one finite score in range."""
    s = torch.as_tensor(slash, dtype=torch.float64)
    offs = scored_offsets(seq_len or s.shape[-1], min_offset, max_offset)
    if len(offs) == 0 or offs.start >= s.shape[-1]:
        return (torch.full(s.shape[:-1], -1, dtype=torch.long, device=s.device),
                torch.full(s.shape[:-1], float("nan"), dtype=torch.float64, device=s.device))
    raw = s[..., offs.start: offs.stop]
    best, arg = torch.nan_to_num(raw, nan=-1.0).max(dim=-1)
    scored = raw.isfinite().any(-1)
    return (torch.where(scored, arg + offs.start, torch.full_like(arg, -1)),
            torch.where(scored, best, torch.full_like(best, float("nan"))))


def strongest_listed(heads, max_offset: int = SLASH_MAX_DELTA) -> dict | None:
    """The strongest of listed heads (dicts with ``offset`` and ``score``, as :func:`top_slash_heads`
    writes them) at offsets SLASH_MIN_DELTA .. ``max_offset``, the first listed on a tie; None without one."""
    def score(t):
        v = t.get("score") if isinstance(t, dict) else None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        return float(v) if ok else None

    ok = [t for t in heads or [] if score(t) is not None and isinstance(t.get("offset"), int)
          and not isinstance(t["offset"], bool) and SLASH_MIN_DELTA <= t["offset"] <= max_offset]
    return max(ok, key=score) if ok else None


def top_slash_heads(slash, k: int = 10, min_offset: int = SLASH_MIN_DELTA, max_offset: int | None = SLASH_MAX_DELTA,
                    layer_ids: list[int] | None = None) -> list[dict]:
    """The ``k`` heads with the largest SlashScore, each at its best offset (:func:`best_slash`).

    ``slash`` is ``[L, H, S]``; each head appears once, at its best offset. Returns dicts
    ``{layer, head, offset, score, uniform}`` sorted by score, descending (``uniform``: the
    SlashScore at that offset of uniform causal attention, mean of 1/(i+1) over the queries).
    ``layer_ids`` maps row index to the model's layer number (decoder layers from 0). A head without
    one finite score (a NaN map) is no head to list.
    """
    s = torch.as_tensor(slash, dtype=torch.float64)
    L, H, S = s.shape
    if len(scored_offsets(S, min_offset, max_offset)) == 0:
        return []
    offset, score = best_slash(s, min_offset, max_offset)
    scored = (offset >= 0).reshape(-1)
    best = torch.nan_to_num(score, nan=-1.0)  # [L, H]
    order = [i for i in torch.argsort(best.reshape(-1), descending=True).tolist() if scored[i]][:k]
    out = []
    for flat in order:
        l, h = divmod(flat, H)
        d = int(offset[l, h])
        uniform = uniform_slash(S, d)
        out.append({"layer": layer_ids[l] if layer_ids else l, "head": h,
                    "offset": d, "score": float(best[l, h]), "uniform": uniform})
    return out


def slash_dominant(slash, kappa: float, offset: int) -> torch.Tensor:
    """Bool ``[...]`` of profiles ``[..., S]`` (e.g. ``[L, H]`` heads): (kappa, offset)-slash-dominant,
    i.e. SlashScore(offset) >= kappa."""
    s = as_float64(slash)
    if not 0 <= offset < s.shape[-1]:
        raise PoslensError(f"offset Δ={offset} outside 0..{s.shape[-1] - 1} (the scan's --seq-len).")
    return s[..., offset] >= kappa


def sink_weight(probs) -> torch.Tensor:
    """Mean attention weight on key 0 over the queries i >= 1 (query 0 can only see key 0):
    ``probs`` ``[..., S, S]`` (rows = queries) -> ``[...]``. The attention sink's own number."""
    p = torch.as_tensor(probs, dtype=torch.float64)
    if p.shape[-1] < 2:
        return torch.full(p.shape[:-2], float("nan"), dtype=torch.float64, device=p.device)
    return p[..., 1:, 0].mean(-1)


def _check_slash(slash) -> torch.Tensor:
    s = as_float64(slash)
    if s.ndim != 3:
        raise PoslensError(f"slash tensor has shape {tuple(s.shape)}; expected [layers, heads, seq_len] "
                           "(maps.safetensors of `poslens scan`).")
    return s


# --------------------------------------------------------------------------------------------
# profiles, SDH table, persistence
# --------------------------------------------------------------------------------------------
def sdh_table(slash, kappas: list[float], max_delta: int, min_delta: int = 0,
              layer_ids: list[int] | None = None, max_listed: int = 6) -> dict:
    """Counts of (κ, Δ)-SDHs over the κ grid x Δ range, with the heads listed (up to ``max_listed``).

    Returns ``{"columns": [...], "rows": [[κ, Δ, count, fraction, "l.h ..."], ...], "counts": [K, n_Δ]}``.
    Rows with a zero count are kept, so the table is the whole grid.
    """
    s = _check_slash(slash)
    L, H, S = s.shape
    hi = min(max_delta, S - 1)
    if min_delta > hi:
        raise PoslensError(f"--max-delta {max_delta}: must be >= {min_delta} and below the scan's --seq-len {S}.")
    ids = layer_ids or list(range(L))
    rows, counts = [], torch.zeros(len(kappas), hi - min_delta + 1, dtype=torch.long, device="cpu")
    for a, kappa in enumerate(kappas):
        for b, d in enumerate(range(min_delta, hi + 1)):
            m = s[..., d] >= kappa
            n = int(m.sum())
            counts[a, b] = n
            heads = sorted(((float(s[l, h, d]), f"{ids[l]}.{h}") for l, h in m.nonzero().tolist()), reverse=True)
            listed = " ".join(name for _, name in heads[:max_listed]) + (" ..." if n > max_listed else "")
            rows.append([float(kappa), d, n, n / (L * H), listed])
    return {"columns": ["kappa", "delta", "SDHs", "fraction of heads", "heads (layer.head, best first)"],
            "rows": rows, "counts": counts}


def persistence(slash_in, slash_random, kappa: float, max_delta: int, min_delta: int = 1,
                layer_ids: list[int] | None = None) -> list[dict]:
    """Every (κ, Δ)-SDH of the in-distribution scan (Δ in range), with its score on random tokens.

    ``persists`` is True when the head is still (κ, Δ)-dominant on random tokens; ``ratio`` is
    random / in-distribution SlashScore(Δ). Sorted by in-distribution score, descending.
    """
    a, b = _check_slash(slash_in), _check_slash(slash_random)
    if a.shape[:2] != b.shape[:2]:
        raise PoslensError(f"the two scans have different heads ({tuple(a.shape[:2])} vs {tuple(b.shape[:2])} "
                           "layers x heads); scan the same model and --layers twice.")
    hi = min(max_delta, a.shape[-1] - 1, b.shape[-1] - 1)
    ids = layer_ids or list(range(a.shape[0]))
    out = []
    for d in range(min_delta, hi + 1):
        for l, h in (a[..., d] >= kappa).nonzero().tolist():
            si, sr = float(a[l, h, d]), float(b[l, h, d])
            out.append({"layer": ids[l], "head": h, "delta": d, "score_in": si, "score_random": sr,
                        "ratio": sr / si if si > 0 else None, "persists": sr >= kappa})
    return sorted(out, key=lambda r: -r["score_in"])


def best_offsets(slash, min_delta: int = 0, max_delta: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offset [L, H], score [L, H])`` of each head's highest SlashScore over the Δ range."""
    s = _check_slash(slash)
    hi = s.shape[-1] - 1 if max_delta is None else min(max_delta, s.shape[-1] - 1)
    raw = s[..., min_delta: hi + 1]
    score, arg = torch.nan_to_num(raw, nan=-1.0).max(-1)
    score = torch.where(raw.isfinite().any(-1), score, torch.full_like(score, float("nan")))  # no finite score: NaN
    return arg + min_delta, score


# --------------------------------------------------------------------------------------------
# rank measures
# --------------------------------------------------------------------------------------------
def kv_head_of(h: int, num_heads: int, num_kv_heads: int) -> int:
    """The KV head a query head reads (transformers' repeat_interleave grouping)."""
    return h // (num_heads // num_kv_heads)
