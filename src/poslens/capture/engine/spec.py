"""What a scan captures: :class:`CaptureSpec` and the ``--stats`` values naming its statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from poslens.capture.backends.blocks import BlockMaps
from poslens.capture.statistics.builtin import active_statistics, stats_table
from poslens.capture.statistics.protocol import check_needs, qualified_name, resolve_statistic
from poslens.capture.statistics.accumulators import NOISE_GROUPS
from poslens.errors import PoslensError

#: Statistics a scan can ask for (``--stats``) and the accumulators each one fills, from the registry
#: of built-in statistics (:mod:`poslens.capture.statistics.builtin`, one module each). Per-head maps
#: (``head_scores``/``head_probs``, and ``head_maps`` under ``--heads all``) follow ``--heads``; the q/k
#: reservoir follows ``--reservoir``.
STATS: dict[str, tuple[str, ...]] = stats_table()
#: Every statistic. The default: the report and the analyses read all but ``probs``, and ``probs`` is
#: one extra reduction of the softmax that ``slash`` computes anyway.
ALL_STATS = frozenset(STATS)


def _stat_parts(text) -> list | None:
    """The items of a ``--stats`` value: names (stripped, empty ones dropped) and statistic objects."""
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    return [p.strip() if isinstance(p, str) else p for p in items if not (isinstance(p, str) and not p.strip())]


def _is_user(part) -> bool:
    """A user's statistic: an object, or a qualified class name (``package.module.Class``)."""
    return not isinstance(part, str) or (part not in STATS and "." in part)


def parse_stats(text) -> frozenset:
    """``"scores,probs"`` / ``"all"`` / an iterable of names -> a frozenset of :data:`STATS` names.

    Users' statistics in the iterable (:class:`poslens.Statistic` objects or qualified class names)
    are left to :func:`user_statistics`; a value of nothing but those asks for no built-in one."""
    parts = _stat_parts(text)
    if parts is None:
        return ALL_STATS
    if not parts:
        raise PoslensError(f"--stats is empty; pass one or more of {', '.join(STATS)} (comma-separated) or all.")
    names = [p for p in parts if not _is_user(p)]
    if "all" in names:
        return ALL_STATS
    bad = [p for p in names if p not in STATS]
    if bad:
        raise PoslensError(f"--stats {','.join(bad)}: unknown statistic; choose from {', '.join(STATS)} or all, or "
                           "give a poslens.Statistic (an object, or its qualified class name package.module.Class).")
    return frozenset(names)


def user_statistics(text) -> tuple:
    """The users' statistics of a ``--stats`` value, in order: objects as given, qualified class names
    imported and built (:func:`poslens.capture.statistics.protocol.resolve_statistic`)."""
    return tuple(resolve_statistic(p) if isinstance(p, str) else p for p in (_stat_parts(text) or []) if _is_user(p))


def stats_option(text):
    """A ``--stats`` value as JSON (config.json's options): a user statistic object by its qualified
    class name, everything else as given."""
    if text is None or isinstance(text, str):
        return text
    return [p if isinstance(p, str) else qualified_name(p) for p in text]


def stats_record(text) -> list[str]:
    """A ``--stats`` value as config.json and the checkpoint fingerprint record it: the sorted built-in
    names, then each user statistic's qualified class name."""
    parts = _stat_parts(text) or []
    users = [p if isinstance(p, str) else qualified_name(p) for p in parts if _is_user(p)]
    return sorted(parse_stats(text)) + users

@dataclass
class CaptureSpec:
    """What to capture: model geometry, which layers/heads, and the controls."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    seq_len: int
    layers: list[int]
    rope_layers: set[int] = field(default_factory=set)
    heads: list[tuple[int, int]] = field(default_factory=list)  # (layer, head) pairs with S x S maps
    #: every head of every captured layer keeps its block-mean weight map (``head_maps``, ``--heads all``)
    head_maps: bool = False
    no_rope_layers: set[int] = field(default_factory=set)
    bidirectional: bool = False
    chunk_elems: int = 0  # logits per query-row chunk (B * H * c * S), bounds the working set; 0 = per device
    stats: frozenset = ALL_STATS  # which statistics to accumulate (names of STATS)
    rope_layout: str = "half"  # the model's RoPE pair layout: "half" (rotate_half) or "interleaved" (Cohere)
    reservoir: int = 0  # token slots with pre-RoPE q/k vectors kept (0 = none); see capture.reservoir
    seed: int = 0  # seeds the reservoir's slot keys
    aps_max_positions: int = 256  # positions per sequence for the per-sequence APS (evenly spaced subsample)
    noise_groups: int = NOISE_GROUPS  # independent sequence groups whose score-map sums give the noise floor
    noise_max_positions: int = 128  # group maps are kept on a strided grid of at most this many positions
    #: keep S x S maps (scores, probs, cosine, attn_cosine, per-head maps) as exact block means on an
    #: N x N grid of blocks (:class:`BlockMaps`); 0 = full maps
    map_size: int = 0
    #: compute a captured layer's attention output from the capture's own weights (CPU) instead of a
    #: second SDPA pass; False: SDPA output, statistics computed beside it (comparisons, benchmarks)
    own_output: bool = True
    #: users' statistics (:class:`poslens.Statistic` objects), fed the capture points they need
    user_stats: tuple = ()

    def map_side(self) -> int:
        """Side of a stored ``S x S`` map: ``S``, or the number of blocks per axis under ``map_size``."""
        return BlockMaps(self.seq_len, self.map_size).n if self.map_size else self.seq_len

    def __post_init__(self):
        self.user_stats = tuple(self.user_stats)
        rope = bool(set(self.rope_layers) & set(self.layers))
        for stat in self.user_stats:  # before anything is loaded or written
            check_needs(stat, rope)

def accumulator_shapes(spec: CaptureSpec) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the mean accumulators of a scan (also the ``maps.safetensors`` names; the
    noise groups of ``scores`` are group accumulators beside them)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for st in active_statistics(spec):
        shapes.update(st.shapes(spec))
    return shapes
