"""The options of an ablation (:class:`AblateConfig`), their defaults and the layer selection."""

from __future__ import annotations

from dataclasses import dataclass, field

from poslens.capture.engine.intervene import Intervention
from poslens.errors import PoslensError

#: default scan shape: ``rope-off`` layer by layer on SmolLM2 within 5 minutes on a 2-core CPU
#: (benchmarks/bench_ablate.py)
DEFAULT_SEQ_LEN = 256
DEFAULT_NUM_SEQS = 32
DEFAULT_GROUPS = 8


@dataclass
class AblateConfig:
    """Every option of an ablation (the flags of ``poslens ablate``, the keywords of :func:`poslens.ablate`)."""

    model_dir: str
    out: str | None = None
    interventions: list = field(default_factory=lambda: ["rope-off"])
    layers: str = "each"
    data: str = "stdlib"
    seq_len: int | None = None  # None: as Python data has it, else DEFAULT_SEQ_LEN
    num_seqs: int | None = None  # None: every sequence of Python data, else DEFAULT_NUM_SEQS
    batch_size: int = 4
    seed: int = 0
    noise_groups: int = DEFAULT_GROUPS
    massive_lambda: float = 5.0
    device: str = "auto"
    dtype: str = "auto"
    figures: bool = True
    overwrite: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    #: replay the layers before a condition's first ablated layer from the unmodified forward (checked
    #: bit for bit on the first batch); False: every condition runs the whole model
    replay: bool = True
    #: also scan the same sequences under every condition (scores, probs, slash): relativity, sink, slash heads
    readings: bool = False
    #: also fit a linear position probe on every layer's residual stream under every condition (held-out test
    #: sequences: the first half)
    probes: bool = False


# --------------------------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------------------------
def parse_layers(text, num_layers: int, where: str = "--layers") -> list[list[int]]:
    """The layer sets of the conditions: ``each`` -> ``[[0], [1], ...]``, ``all`` -> ``[[0 .. L-1]]``,
    ``"0,3,5-7"`` (or a list of ints) -> ``[[0, 3, 5, 6, 7]]``, ``"each:0-3"`` -> ``[[0], [1], [2], [3]]``."""
    from poslens.capture.scan.options import parse_int_list

    if isinstance(text, (list, tuple)):
        chosen, each = sorted({_int_layer(x, where) for x in text}), False
    else:
        s = str(text).strip().lower()
        each = s == "each" or s.startswith("each:")
        rest = s[5:] if s.startswith("each:") else ("all" if s in ("each", "all") else s)
        chosen = list(range(num_layers)) if rest == "all" else (parse_int_list(rest, where) or [])
    bad = [l for l in chosen if not 0 <= l < num_layers]
    if bad or not chosen:
        raise PoslensError(f"{where} {text!r}: the model has decoder layers 0..{num_layers - 1}; pass each, all, or a "
                           "list like 0,3,5-7 (each:0-5 for one layer at a time).")
    return [[l] for l in chosen] if each else [chosen]


def _int_layer(x, where: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise PoslensError(f"{where}: {x!r} is not a layer index; pass integers (decoder layers from 0).")
    return x


def condition_name(iv: Intervention, layers: list[int], num_layers: int) -> str:
    """``rope-off@3``, ``rope-off@all``, ``rope-off@0,3,5``."""
    where = "all" if layers == list(range(num_layers)) else ",".join(map(str, layers))
    return f"{iv.name}@{where}"

