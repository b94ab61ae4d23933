"""Built-in statistics, one module each.

Each module defines ``STATISTIC``, a :class:`~poslens.capture.statistics.builtin.base.BuiltinStatistic`: its
``--stats`` name, the accumulators it fills (their names are the ``maps.safetensors`` names), the
intermediates it needs (the attention pass computes each once per layer, on every backend) and what
it adds from them. Its sums live in the capture's accumulators, so checkpoints, resume, merges and
the all-reduce treat it like every other. Adding one: its module, its test against
:mod:`poslens.capture.statistics.reference`, its row in docs/scan.md and its line in :data:`REGISTRY`.
"""

from __future__ import annotations

from poslens.capture.statistics.builtin import (attn_cosine, cosine, dim_logit, head_maps, heads, probs, qk,
                                                scores, sink, slash)

#: the registry: every built-in statistic (the statistics reading one intermediate run in this order)
REGISTRY = (
    scores.STATISTIC,
    probs.STATISTIC,
    slash.STATISTIC,
    sink.STATISTIC,
    heads.STATISTIC,
    head_maps.STATISTIC,
    cosine.STATISTIC,
    attn_cosine.STATISTIC,
    qk.STATISTIC,
    dim_logit.STATISTIC,
)
#: the selectable ones by ``--stats`` name
BUILTINS = {st.name: st for st in REGISTRY if st.selectable}
_BY_NAME = {st.name: st for st in REGISTRY}


def requirements(st) -> tuple:
    """The statistics ``st`` brings along (its ``requires``), as objects."""
    return tuple(_BY_NAME[n] for n in st.requires)


def active_statistics(spec) -> tuple:
    """The built-in statistics a scan with this spec computes, in registry order: the selected ones,
    those they require, and those that follow other options (the per-head maps follow ``--heads``)."""
    chosen = {st.name for st in REGISTRY if st.active(spec)}
    chosen |= {r.name for st in REGISTRY if st.name in chosen for r in requirements(st)}
    return tuple(st for st in REGISTRY if st.name in chosen)


def stats_table() -> dict[str, tuple[str, ...]]:
    """``--stats`` name -> the accumulators it fills, those of the statistics it brings along included."""
    return {name: st.accumulators + tuple(a for r in requirements(st) for a in r.accumulators)
            for name, st in BUILTINS.items()}
