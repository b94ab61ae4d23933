"""The options of a comparison (:class:`CompareConfig`) and their checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from poslens.errors import PoslensError

DEFAULT_SEQ_LEN = 256
DEFAULT_NUM_SEQS = 16
#: sequence groups of the paired statistics (sequence n in group n % G): 16 lets the exact sign-flip test
#: reach p = 1/32768, small enough to survive Benjamini–Hochberg over a 30 × 9 grid of heads
DEFAULT_GROUPS = 16
#: score maps kept as block means on at most this many blocks per axis (0: full maps)
DEFAULT_MAP_SIZE = 256


@dataclass
class CompareConfig:
    """Every option of a comparison (the flags of ``poslens compare``, the keywords of :func:`poslens.compare`).

    ``model_a``: the reference model (directory or ``.gguf``); ``model_b``: the other model, or None for
    ``model_a`` under ``variants``. ``seq_lens``: every length scanned, on the same sequences cut to each."""

    model_a: str
    model_b: str | None = None
    variants: list = field(default_factory=list)
    out: str | None = None
    data: str = "stdlib"
    seq_lens: list = field(default_factory=lambda: [DEFAULT_SEQ_LEN])
    num_seqs: int = DEFAULT_NUM_SEQS
    batch_size: int = 4
    seed: int = 0
    noise_groups: int = DEFAULT_GROUPS
    map_size: int = DEFAULT_MAP_SIZE
    beyond_context: bool = False
    device: str = "auto"
    dtype: str = "auto"
    figures: bool = True
    overwrite: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False


def parse_lengths(value, flag: str = "--seq-len") -> list[int]:
    """``"512,2048"`` / ``512`` / ``[512, 2048]`` -> sorted distinct positive lengths."""
    if isinstance(value, bool):
        raise PoslensError(f"{flag} {value!r}: pass one length or several, e.g. 512,2048.")
    if isinstance(value, int):
        items = [value]
    elif isinstance(value, str):
        try:
            items = [int(x) for x in value.replace(" ", "").split(",") if x]
        except ValueError:
            raise PoslensError(f"{flag} {value!r}: expected comma-separated token counts, e.g. 512,2048.") from None
    else:
        try:
            items = [int(x) for x in value if not isinstance(x, bool)]
        except (TypeError, ValueError):
            raise PoslensError(f"{flag} {value!r}: expected token counts, e.g. [512, 2048].") from None
    if not items:
        raise PoslensError(f"{flag} {value!r}: name at least one length, e.g. 512.")
    bad = [x for x in items if x < 2]
    if bad:
        raise PoslensError(f"{flag} {bad[0]}: each length must be at least 2 tokens (the loss needs a next token).")
    return sorted(set(items))
