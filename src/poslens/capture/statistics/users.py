"""Users' statistics (:class:`poslens.Statistic`) fed from the attention pass, as the built-ins are.

A statistic that reads ``scores`` or ``probs`` gets them in pieces, as the built-in statistics do:
``add(layer, **points)`` once per chunk of query rows (and slice of the batch's sequences), with
the chunk's scores / probs ``[b, H, c, k]`` and its other attention points cut to the same rows
and sequences (keys ``0 .. k - 1``); the optional points ``rows`` and ``seqs`` say which. Memory
then stays at a chunk, never ``[B, H, S, S]``. Any other statistic gets ``add`` once per layer and
batch with whole tensors.
"""

from __future__ import annotations

import json

import torch

from poslens.capture.statistics.builtin.base import Piece
from poslens.capture.statistics.points import PASS_POINTS
from poslens.capture.statistics.protocol import flatten_state, qualified_name, unflatten_state
from poslens.errors import PoslensError


#: values per piece a user's statistic gets at most (one row of a sequence's heads may exceed it). A
#: statistic's float64 temporaries of a piece (2 MiB each) stay near the core's cache, and fewer of them
#: are fresh pages from the kernel than with the pass's own chunks (up to 16 MiB of float32); smaller
#: pieces pay torch's fixed cost per operation more often (``benchmarks/bench_user_statistics.py``)
USER_PIECE_ELEMS = 1 << 18


def sub_pieces(piece: Piece, causal: bool, heads: int, limit: int | None = None):
    """``(rows, seqs, keys)`` of the pieces a chunk is handed to a user's statistic in: at most
    ``limit`` values each where one row of a sequence allows, a causal piece's keys cut at its last row
    (the weights past it are 0, the logits masked)."""
    limit = limit or USER_PIECE_ELEMS
    r0, r1 = piece.rows.start, piece.rows.stop
    s0, s1 = piece.seqs.start, piece.seqs.stop
    row = heads * piece.keys  # values in one row of one sequence
    seqs = max(1, min(s1 - s0, limit // max(1, row)))
    rows = max(1, limit // max(1, row * seqs))
    for a in range(s0, s1, seqs):
        for b in range(r0, r1, rows):
            e = min(r1, b + rows)
            yield slice(b, e), slice(a, min(s1, a + seqs)), (e if causal else piece.keys)


def _needs(stat) -> tuple:
    return tuple(stat.needs) if not isinstance(stat.needs, str) else (stat.needs,)



def _add(stat, layer: int, points: dict) -> None:
    """``stat.add(layer, **points)``; an exception of the user's code is one error naming the statistic."""
    try:
        stat.add(layer, **points)
    except PoslensError:
        raise
    except Exception as e:  # the user's code: any exception, said in one line
        why = (str(e).strip().splitlines() or [""])[-1][:200]
        raise PoslensError(f"stats: {qualified_name(stat)}.add() raised {type(e).__name__}"
                           + (f": {why}" if why else "") + "; fix the statistic or drop it from --stats.") from e

class UserStatistics:
    """The users' statistics of one capture: which points they need, and their feeding."""

    def __init__(self, stats):
        self.stats = list(stats)
        self.points = {p for st in self.stats for p in _needs(st)}
        # (poslens.capture.statistics.protocol.check_needs refuses a statistic of scores/probs that reads the residual stream)
        self.chunked = [i for i, st in enumerate(self.stats) if set(_needs(st)) & set(PASS_POINTS)]
        self._pending: dict[int, dict] = {}  # a layer's points gathered for the per-layer statistics
        self._fed: dict[int, set] = {}  # per layer, the statistics (indices) fed in this batch

    def __bool__(self) -> bool:
        return bool(self.stats)

    def pass_needs(self) -> frozenset:
        """The per-sequence intermediates of the attention pass the users' statistics read."""
        return frozenset(p for p in self.points if p in PASS_POINTS)

    def begin_batch(self) -> None:
        self._pending, self._fed = {}, {}

    # -- feeding -----------------------------------------------------------------------------
    def readers(self, batch, layer_points: dict, output) -> list:
        """``(needs, callback)`` readers of the attention pass for the chunked statistics of a layer.
        ``layer_points``: the layer's q/k points; ``output()``: the layer output ``[B, S, H, D]`` so far."""
        out = []
        for i in self.chunked:
            st = self.stats[i]
            want = frozenset(p for p in _needs(st) if p in PASS_POINTS)
            out.append((want, self._chunk_feeder(batch.layer, i, st, want, layer_points, output, batch.causal)))
        return out

    def _chunk_feeder(self, layer, i, st, want, layer_points, output, causal=True):
        held = {}

        def feed(piece: Piece):
            for name in PASS_POINTS:
                if name in piece:  # the pass masks / softmaxes its scores in place: keep a copy for later
                    held[name] = piece[name] if name == "probs" or want == {"scores"} else piece[name].clone()
            if not want <= held.keys():
                return
            whole = {p: held[p] for p in PASS_POINTS if p in _needs(st)}
            held.clear()
            for r, s, k in sub_pieces(piece, causal, whole[next(iter(whole))].shape[1]):
                pts = {p: t[s.start - piece.seqs.start:s.stop - piece.seqs.start, :,
                             r.start - piece.rows.start:r.stop - piece.rows.start, :k] for p, t in whole.items()}
                for p in _needs(st):
                    if p in ("q_pre", "q_post"):
                        pts[p] = layer_points[p][s, :, r]
                    elif p in ("k_pre", "k_post"):
                        pts[p] = layer_points[p][s, :, :k]
                    elif p == "head_out":
                        pts[p] = output()[s, r]
                    elif p == "rows":
                        pts[p] = r
                    elif p == "seqs":
                        pts[p] = s
                _add(st, layer, {p: pts[p] for p in _needs(st)})
            self._fed.setdefault(layer, set()).add(i)
        return feed

    def layer(self, layer: int, points: dict) -> None:
        """Gather a layer's points; each per-layer statistic gets ``add(layer, **its points)`` once they
        are all in."""
        pend = self._pending.setdefault(layer, {})
        pend.update(points)
        fed = self._fed.setdefault(layer, set())
        for i, st in enumerate(self.stats):
            if i not in fed and i not in self.chunked and all(p in pend for p in _needs(st)):
                _add(st, layer, {p: pend[p] for p in _needs(st)})
                fed.add(i)
        if len(fed) == len(self.stats):
            pend.clear()  # the layer's points are not kept past the last statistic that reads them

    def check_fed(self, layers) -> None:
        """Every statistic got every captured layer of the batch (else a point never came)."""
        for i, stat in enumerate(self.stats):
            for layer in layers:
                if i not in self._fed.get(layer, ()):
                    got = sorted(self._pending.get(layer, {}))
                    raise PoslensError(
                        f"stats: {qualified_name(stat)} needs {', '.join(_needs(stat))} of layer {layer}, but the model "
                        f"gave only {', '.join(got) or 'none of them'}; this architecture cannot provide "
                        f"{', '.join(p for p in _needs(stat) if p not in got)} (drop the statistic or those points).")

    # -- state and results -------------------------------------------------------------------
    def state_dict(self) -> dict:
        out = {}
        for i, stat in enumerate(self.stats):
            out.update(flatten_state(stat.state_dict(), prefix=f"user.{i}.")[0])
        return out

    def state_metadata(self) -> dict:
        if not self.stats:
            return {}
        return {"user_statistics": json.dumps([{"class": qualified_name(st), "state": flatten_state(
            st.state_dict(), prefix=f"user.{i}.")[1]} for i, st in enumerate(self.stats)])}

    def load_state_dict(self, state, *, copy: bool, metadata: dict | None) -> None:
        if not self.stats:
            return
        saved = json.loads((metadata or {}).get("user_statistics", "[]"))
        names = [qualified_name(st) for st in self.stats]
        if [e["class"] for e in saved] != names:
            raise PoslensError(f"the checkpoint holds the statistics {[e['class'] for e in saved]}, this scan asks for "
                               f"{names}; resume with the original --stats.")
        for i, (stat, entry) in enumerate(zip(self.stats, saved)):
            mine = {k: (v.clone() if copy else v) for k, v in state.items() if k.startswith(f"user.{i}.")}
            stat.load_state_dict(unflatten_state(entry["state"], mine))

    def all_reduce(self, group=None) -> None:
        for stat in self.stats:
            stat.all_reduce(group)

    def results(self, taken=()) -> dict[str, torch.Tensor]:
        """The statistics' named result tensors (on the CPU); a name that a built-in tensor or another
        statistic already uses is refused."""
        out: dict[str, torch.Tensor] = {}
        for stat in self.stats:
            res = stat.result()
            if not isinstance(res, dict) or not all(isinstance(v, torch.Tensor) for v in res.values()):
                raise PoslensError(f"stats: {qualified_name(stat)}.result() must return a dict of named tensors.")
            for name, t in res.items():
                if not isinstance(name, str) or not name:
                    raise PoslensError(f"stats: {qualified_name(stat)}.result() names a tensor {name!r}; each name "
                                       "must be a non-empty string.")
                if t.layout != torch.strided:
                    raise PoslensError(f"stats: {qualified_name(stat)}.result() gives {name!r} as a {t.layout} "
                                       "tensor; return a dense one (.to_dense()).")
                if name in out or name in taken:
                    raise PoslensError(f"stats: {qualified_name(stat)}.result() names a tensor {name!r}, which "
                                       "another statistic also writes; rename it.")
                out[name] = t.detach().cpu().contiguous()
        return out
