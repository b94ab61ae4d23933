"""What an explorer page holds of each run: the per-head and per-layer readings (numbers, with their
chance levels and noise floors) and the maps, block-averaged to at most :data:`MAP_SIDE` blocks per
axis and packed as float16 (:class:`Blobs`). Nothing here needs the model: only the run directory.

A scan gives the heads view (sink, best SlashScore and its offset, previous-token score, mean
attention distance, massive query dimensions; entropy where the run has it), the one-head view (the
head's mean attention map where the scan kept per-head maps, ``--heads all`` or ``--heads L.H``; its
scores map where it kept one; its diagonal profile) and the layers view. A comparison gives the
change grid of each per-head reading, with its verdicts, and both sides' per-head maps where it kept
them; several lengths give the lengths view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from poslens.conventions import HEAD_MAP_MAX_SIDE
from poslens.errors import PoslensError

#: the most blocks per axis a map has on the page (that of the scan's per-head maps)
MAP_SIDE = HEAD_MAP_MAX_SIDE
#: the map values a page holds (their visible entries): a 30 x 9 model's per-head maps at 128 x 128 and its layer
#: maps, within 10 MB of page with Plotly; further runs' maps are shown coarser where they would exceed it
MAP_BUDGET = 2_750_000

#: the per-head readings of a scan, in the order of the reading menu: (key, label, unit)
HEAD_READINGS = (
    ("sink", "sink: weight on key 0", "attention weight"),
    ("slash_score", "best SlashScore (Δ 1 … 16)", "attention weight"),
    ("slash_offset", "offset Δ of the best SlashScore", "tokens"),
    ("prev_token", "previous-token score SlashScore(1)", "attention weight"),
    ("distance", "mean attention distance", "tokens"),
    ("entropy", "attention entropy", "nats"),
    ("massive_dims", "massive query dimensions (λ = 5)", "dimensions"),
)
#: per-layer readings of a scan with the column holding their noise floor (None: no floor column), and how the
#: floor reads: "band" (value ± floor), "level" (a level the value must clear), "chance" (computed chance level)
LAYER_READINGS = (
    ("relativity_index", None, None),
    ("within_diag_rms", "within_diag_rms_noise", "level"),
    ("diagonal_trend", "diagonal_trend_se", "band"),
    ("locality", None, None),
    ("sink_weight", "sink_chance", "chance"),
    ("aps_mean", "aps_se", "band"),
    ("attn_aps_mean", "attn_aps_se", "band"),
    ("norm_score", None, None),
)
#: the per-head readings of a comparison and its per-layer ones (poslens.analysis.compare.readings)
COMPARE_HEAD = ("sink", "slash", "prev_token", "entropy", "distance")


def uniform_offsets(S: int) -> np.ndarray:
    """SlashScore(Δ) of uniform causal attention at every offset, ``[S]``: the mean over the queries i ≥ Δ
    of 1/(i + 1) (:func:`poslens.metrics.verdicts.uniform_slash` for all Δ at once)."""
    inv = 1.0 / np.arange(1, S + 1, dtype=np.float64)  # inv[i] = 1 / (i + 1)
    tail = np.cumsum(inv[::-1])[::-1]  # tail[d] = sum_{i >= d} 1 / (i + 1)
    return tail / (S - np.arange(S))


def chance_levels(S: int) -> dict:
    """Each per-head reading of uniform causal attention over ``S`` tokens (the level a head without
    structure sits at): weight on key 0 over queries 1 … S−1, SlashScore(1), the mean distance and the
    mean row entropy."""
    from poslens.metrics.verdicts import uniform_sink_weight, uniform_slash

    i = np.arange(S, dtype=np.float64)
    return {"sink": uniform_sink_weight(S) if S > 1 else None,
            "prev_token": uniform_slash(S, 1) if S > 1 else None,
            "distance": float(np.mean(i / 2.0)),
            "entropy": float(np.mean(np.log(i + 1.0)))}


@dataclass
class Blobs:
    """float16 arrays packed one after another: :meth:`add` returns the reference (offset in
    elements, shape) the page reads an array back by."""

    parts: list = field(default_factory=list)
    size: int = 0

    def add(self, x) -> dict:
        a = np.ascontiguousarray(np.asarray(x, dtype=np.float32).astype("<f2"))
        ref = {"offset": self.size, "shape": list(a.shape)}
        self.parts.append(a.reshape(-1))
        self.size += a.size
        return ref

    def bytes(self) -> bytes:
        return np.concatenate(self.parts).tobytes() if self.parts else b""


@dataclass
class _Request:
    priority: tuple
    target: dict
    key: str
    tensors: dict  # name -> [..., M, M] maps (several: drawn on one colour range, e.g. a comparison's A and B)
    seq_len: int
    causal: bool
    notes: list
    what: str


class Maps:
    """The maps a page asks for, packed by priority within :data:`MAP_BUDGET` values: each set gets the
    largest side of at most :data:`MAP_SIDE` blocks (halving) that still fits, so the first run's
    per-head maps are kept whole and the others' are coarser where the page would outgrow its size."""

    def __init__(self, blobs: Blobs):
        self.blobs, self.requests = blobs, []

    def ask(self, priority: tuple, target: dict, key: str, tensors: dict, seq_len: int, *, causal: bool = True,
            notes: list | None = None, what: str = "") -> None:
        self.requests.append(_Request(priority, target, key, tensors, seq_len, causal, notes if notes is not None
                                      else [], what))

    def pack(self) -> None:
        left = MAP_BUDGET
        for r in sorted(self.requests, key=lambda r: r.priority):
            M = next(iter(r.tensors.values())).shape[-1]
            n = sum(int(np.prod(t.shape[:-2])) for t in r.tensors.values())
            want = side = min(MAP_SIDE, M)
            while side > 8 and n * _values(side, r.causal) > left:
                side = -(-side // 2)
            if n * _values(side, r.causal) > left:
                r.notes.append(f"{r.what}: left out to keep the page small")
                continue
            left -= n * _values(side, r.causal)
            if side < want:
                r.notes.append(f"{r.what}: shown on {side} × {side} blocks to keep the page small")
            step = -(-r.seq_len // M) * (-(-M // side) if side < M else 1)  # positions per block on the page
            refs = {name: {**self.blobs.add(block_means(t, r.seq_len, side, causal=r.causal)), "step": step}
                    for name, t in r.tensors.items()}
            r.target[r.key] = refs if len(refs) > 1 else next(iter(refs.values()))


def _values(side: int, causal: bool) -> int:
    return side * (side + 1) // 2 if causal else side * side


def block_means(maps: torch.Tensor, seq_len: int, side: int = MAP_SIDE, causal: bool = True) -> torch.Tensor:
    """``[..., M, M]`` maps (full ``S x S`` maps, or block means on ``M`` blocks of a length-``seq_len``
    sequence) as block means on at most ``side`` blocks per axis, each the mean over the visible
    entries it covers (entries j ≤ i of a causal map; exact for block means too: each is weighted by
    the visible entries it stands for); blocks with none are NaN. Maps already that small come back
    as they are, their invisible entries NaN."""
    from poslens.capture.backends.blocks import BlockMaps

    x = maps.to(torch.float64)
    M = x.shape[-1]
    if M > seq_len:
        raise PoslensError(f"a map of side {M} is larger than its sequence length {seq_len}; the run is damaged.")
    counts = (BlockMaps(seq_len, M).counts(causal, None) if M < seq_len else
              (torch.ones(M, M, dtype=torch.float64, device="cpu").tril() if causal else
               torch.ones(M, M, dtype=torch.float64, device="cpu")))
    if M <= side:
        return x.masked_fill(counts == 0, float("nan"))
    f = -(-M // side)
    n = -(-M // f)
    pad = n * f - M
    w = torch.nn.functional.pad(counts, (0, pad, 0, pad))
    xs = torch.nn.functional.pad(x.nan_to_num(0.0) * counts, (0, pad, 0, pad))
    shape = xs.shape[:-2]
    sums = xs.reshape(*shape, n, f, n, f).sum((-3, -1))
    cnt = w.reshape(n, f, n, f).sum((-3, -1))
    return torch.where(cnt > 0, sums / cnt.clamp_min(1.0), torch.full_like(sums, float("nan")))


def _finite(x) -> list:
    """A list of floats for JSON: NaN and infinities as None, 6 significant digits."""
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    return [float(f"{v:.6g}") if math.isfinite(v) else None for v in a.tolist()]


def _model_label(result) -> str:
    if result.command == "compare":
        return str(result.summary.get("model_a") or result._model_name() or "model")
    return result._model_name() or "model"


def _run_label(result, model: str, index: int) -> str:
    s = result.summary
    if result.command == "compare":
        return f"{index}: compare {model}: {s.get('variant_label') or 'A vs B'}"
    data = s.get("data") or (result.config.get("options") or {}).get("data") or ""
    return f"{index}: scan {model}, {data} data, {s.get('num_seqs')} × {s.get('seq_len')} tokens"


# --------------------------------------------------------------------------------------------
# a scan
# --------------------------------------------------------------------------------------------
def _head_readings(result, L: int, H: int) -> tuple[dict, list[str]]:
    """The per-head readings ``{key: [L*H] values}`` of a scan and the notes on what is missing."""
    from poslens.analysis.compare.readings import mean_distance
    from poslens.metrics.fingerprint import massive_dims

    maps, out, notes = result.maps, {}, []
    df = result.heads()
    if df["sink"].notna().any():
        out["sink"] = _finite(df["sink"].to_numpy(dtype=float))
    slash = maps.get("slash")
    if slash is not None:
        out["slash_score"] = _finite(df["slash_score"].to_numpy(dtype=float))
        out["slash_offset"] = _finite(df["slash_offset"].astype("Float64").to_numpy(dtype=float, na_value=np.nan))
        out["prev_token"] = _finite(slash[..., 1].double().numpy()) if slash.shape[-1] > 1 else _finite([np.nan] * L * H)
        out["distance"] = _finite(mean_distance(slash).numpy())
    else:
        notes.append("the slash, previous-token and distance readings need the scan's slash statistic "
                     "(--stats all, the default)")
    ent = maps.get("entropy")
    if ent is not None and tuple(ent.shape) == (L, H):
        out["entropy"] = _finite(ent.double().numpy())
    if maps.get("q_gram") is not None and maps["q_gram"].dim() == 4 and tuple(maps["q_gram"].shape[:2]) == (L, H):
        out["massive_dims"] = _finite(massive_dims(maps["q_gram"]).sum(-1).double().numpy())
    return out, notes


def _layer_readings(result) -> dict:
    """``{reading: {"values": [...], "floor": [...] or None, "floor_kind": ...}}`` of a scan's layers."""
    df = result.layers()
    S, n = int(result.summary.get("seq_len") or 0), int(result.summary.get("num_seqs") or 0)
    out = {}
    for key, floor, kind in LAYER_READINGS:
        if key not in df.columns or not df[key].notna().any():
            continue
        values = df[key].astype(float).to_numpy()
        if kind == "chance":
            fl = [chance_levels(S)["sink"]] * len(values) if S > 1 else None
        elif floor and floor.endswith("_se") and floor not in df.columns:  # the SE of a per-sequence mean
            std = floor[:-len("_se")] + "_std"
            fl = _finite(df[std].astype(float).to_numpy() / math.sqrt(max(n, 1))) if std in df.columns and n else None
        elif floor and floor in df.columns:
            fl = _finite(df[floor].astype(float).to_numpy())
        else:
            fl = None
        out[key] = {"values": _finite(values), "floor": fl, "floor_kind": kind if fl is not None else None}
    return out


def _scan_maps(result, blobs: Blobs, maps_out: Maps, rank: int, L: int, H: int, notes: list[str]) -> dict:
    """References to a scan's maps on the page (filled when the page's maps are packed): the layers'
    mean weight and score maps, each head's mean weight map (and score map where kept), the heads'
    diagonal profiles (exact). ``rank``: 0 for the page's first run, whose maps come first."""
    maps, S = result.maps, int(result.summary.get("seq_len") or 0)
    controls = result.summary.get("controls") if isinstance(result.summary.get("controls"), dict) else {}
    causal = not bool(controls.get("bidirectional"))
    out: dict = {"causal": causal}
    first = rank == 0
    hm = maps.get("head_maps")
    if hm is not None and tuple(hm.shape[:2]) == (L, H):
        maps_out.ask((0 if first else 2, rank), out, "head_probs", {"m": hm}, S, causal=causal, notes=notes,
                     what="per-head maps")
    for name, prio in (("probs", 1), ("scores", 3)):
        m = maps.get(name)
        if m is not None and m.dim() == 3 and m.shape[0] == L:
            maps_out.ask((prio if first else 4, rank), out, f"layer_{name}", {"m": m}, S, causal=causal, notes=notes,
                         what=f"layer {name} maps")
    pairs = [tuple(p) for p in (result.config.get("options") or {}).get("heads") or []
             if isinstance(p, (list, tuple)) and len(p) == 2]
    ids = result._layer_ids()
    for name in ("head_probs", "head_scores"):
        t = maps.get(name)
        if t is None or not pairs or t.shape[0] != len(pairs):
            continue
        sel = out.setdefault(f"selected_{name}", {})
        for n, (l, h) in enumerate(pairs):
            if l in ids and (name == "head_scores" or hm is None):
                maps_out.ask((3 if first else 4, rank), sel, f"{ids.index(l)}.{h}", {"m": t[n]}, S, causal=causal,
                             notes=notes, what=f"the map of layer {l}, head {h}")
    if hm is None and not (maps.get("head_probs") is not None and pairs):
        notes.append("per-head maps: scan with --heads all to see every head's attention map")
    slash = maps.get("slash")
    if slash is not None and tuple(slash.shape[:2]) == (L, H):
        out["profiles"] = blobs.add(slash)
        out["uniform_profile"] = _finite(uniform_offsets(slash.shape[-1]))
    return out


def scan_data(result, blobs: Blobs, maps_out: Maps, index: int) -> dict:
    """One scan's part of the page."""
    s = result.summary
    ids = result._layer_ids()
    L = len(ids)
    H = int(s.get("num_heads") or 0) or _heads_from(result)
    S = int(s.get("seq_len") or 0)
    model = _model_label(result)
    heads, notes = _head_readings(result, L, H) if H else ({}, ["the scan has no per-head readings"])
    maps = _scan_maps(result, blobs, maps_out, index, L, H, notes)
    data = s.get("data") or (result.config.get("options") or {}).get("data")
    return {"kind": "scan", "label": _run_label(result, model, index), "path": str(result.path), "model": model,
            "data": str(data or ""), "seq_len": S, "num_seqs": s.get("num_seqs"), "layers": ids, "num_heads": H,
            "trained_context": s.get("trained_context"), "beyond_context": bool(s.get("beyond_context")),
            "heads": heads, "chance": chance_levels(S) if S else {}, "layer_readings": _layer_readings(result),
            "maps": maps, "notes": notes, "convention": "decoder layers count from 0"}


def _heads_from(result) -> int:
    for k in ("sink_heads", "slash", "q_gram"):
        if k in result.maps and result.maps[k].dim() >= 2:
            return int(result.maps[k].shape[1])
    return 0


# --------------------------------------------------------------------------------------------
# a comparison
# --------------------------------------------------------------------------------------------
def compare_data(result, maps_out: Maps, index: int) -> dict:
    """One comparison's part of the page: per reading and length, the cells' a, b, delta, floor, p and
    verdict (``changes()`` as columns), and both sides' per-head maps where the run kept them."""
    s = result.summary
    L, H = int(s.get("num_layers") or 0), int(s.get("num_heads") or 0)
    lengths = [int(x) for x in s.get("seq_lens") or [s.get("seq_len")] if x]
    df = result.changes()
    cells: dict = {}
    for (reading, S), g in df.groupby(["reading", "seq_len"], sort=False):
        rec = {}
        per_head = g[g["head"].notna()]
        per_layer = g[g["head"].isna() & g["layer"].notna()]
        if len(per_head):
            idx = per_head["layer"].astype(int).to_numpy() * H + per_head["head"].astype(int).to_numpy()
            grid = {}
            for col in ("a", "b", "delta", "floor", "p"):
                v = np.full(L * H, np.nan)
                v[idx] = per_head[col].astype(float).to_numpy()
                grid[col] = _finite(v)
            ch = np.full(L * H, -1)
            ch[idx] = (per_head["verdict"] == "changed").astype(int).to_numpy()
            grid["changed"] = ch.tolist()
            rec["heads"] = grid
        if len(per_layer):
            order = per_layer.sort_values("layer")
            rec["layers"] = {col: _finite(order[col].astype(float).to_numpy()) for col in ("a", "b", "delta", "floor")}
            rec["layers"]["layer"] = order["layer"].astype(int).tolist()
            rec["layers"]["changed"] = (order["verdict"] == "changed").astype(int).tolist()
        cells.setdefault(str(reading), {})[str(int(S))] = rec
    maps, notes = {}, []
    for k, S in enumerate(lengths):
        pair = {side: result.maps.get(f"{side}.{S}.head_maps") for side in ("a", "b")}
        if all(t is not None and t.dim() == 4 and tuple(t.shape[:2]) == (L, H) for t in pair.values()):
            maps_out.ask((0 if index == 0 else 2, index, k), maps, str(S), pair, S, notes=notes,
                         what=f"A's and B's maps at {S} tokens")
    if not any(result.maps.get(f"a.{S}.head_maps") is not None for S in lengths):
        notes.append("A's and B's maps: compare.safetensors holds no per-head maps ({a|b}.S.head_maps); run "
                     "poslens compare again to keep them")
    return {"kind": "compare", "label": _run_label(result, _model_label(result), index), "path": str(result.path),
            "model": _model_label(result), "model_b": str(s.get("model_b") or ""),
            "variant": str(s.get("variant_label") or ""), "lengths": lengths, "num_layers": L, "num_heads": H,
            "layers": list(range(L)), "trained_context": s.get("trained_context"),
            "beyond_context": {str(k): bool(v) for k, v in (s.get("beyond_context") or {}).items()}
            if isinstance(s.get("beyond_context"), dict) else {},
            "readings": cells, "head_readings": [r for r in COMPARE_HEAD if r in cells], "maps": maps,
            "noise_groups": s.get("noise_groups"), "notes": notes, "convention": "decoder layers count from 0"}


def page_data(results: list) -> tuple[dict, bytes]:
    """The page's JSON (runs, readings, references into the blob) and its float16 blob."""
    blobs = Blobs()
    maps = Maps(blobs)
    runs = []
    for i, r in enumerate(results):
        if r.command == "scan":
            runs.append(scan_data(r, blobs, maps, i))
        elif r.command == "compare":
            runs.append(compare_data(r, maps, i))
        else:
            raise PoslensError(f"{r.path}: a {r.command} run; poslens explore shows scan and compare runs (pass the "
                               "run directories of poslens scan or poslens compare).")
    maps.pack()
    _pair_controls(runs)
    return {"runs": runs, "head_readings": [list(h) for h in HEAD_READINGS],
            "compare_readings": list(COMPARE_HEAD)}, blobs.bytes()


def _pair_controls(runs: list) -> None:
    """Each text scan's random-token control: a scan of the same model, length and layers on
    ``--data random`` among the runs (the slash paper's control, arXiv 2601.08297)."""
    for r in runs:
        r["control"] = None
        if r["kind"] != "scan" or r["data"] == "random":
            continue
        for j, o in enumerate(runs):
            if (o["kind"] == "scan" and o["data"] == "random" and o["model"] == r["model"]
                    and o["layers"] == r["layers"] and o["num_heads"] == r["num_heads"]):
                r["control"] = j
                break
