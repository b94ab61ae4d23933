"""Every option of a scan, declared once: :class:`ScanConfig`.

Each field carries its type, its default and its meaning; :func:`option` adds how the two faces
spell it where they differ from the field (the CLI's flag, a keyword's default in a notebook). The
flags of ``poslens scan`` and the keywords of :func:`poslens.scan` are made from these fields
(:func:`scan_options`), so an option added here is an option of both. This module imports no
torch: ``poslens scan --help`` reads it.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Callable

from poslens.conventions import HEAD_MAP_MAX_SIDE
from poslens.errors import PoslensError

#: the words of the options other commands share with a scan (``poslens.cli.app`` uses them too)
MODEL_DIR_HELP = "Local Hugging Face model directory (config.json + *.safetensors), or a .gguf file."
DATA_HELP = "stdlib | random | text file | directory | JSONL (text or input_ids) | datasets.save_to_disk directory."
DEVICE_HELP = "auto (CUDA when visible, else CPU), cpu, cuda or cuda:N."
ALLOW_PICKLE_HELP = "Allow pickle weights (.bin); they can run code."
NO_FIGURES_HELP = "Skip the PNG figures (tables and tensors are still written)."

#: ``python_default`` of an option whose keyword has the field's own default
SAME = object()


# --------------------------------------------------------------------------------------------
# option values given as text (the CLI, and poslens.scan where a string is handy) or as Python values
# --------------------------------------------------------------------------------------------
def parse_int_list(text: str | None, flag: str) -> list[int] | None:
    """``"0,2,5-7"`` -> ``[0, 2, 5, 6, 7]``; None/empty/``all`` -> None."""
    if text is None or str(text).strip() in ("", "all"):
        return None
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
                a, b = int(a), int(b)
                if b - a > MAX_RANGE:  # no model has that many layers: refused before it is expanded
                    raise PoslensError(f"{flag} {text!r}: the range {a}-{b} spans more than {MAX_RANGE:,} numbers; "
                                       "name the layers the model has, e.g. 0-29.")
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise PoslensError(f"{flag} {text!r}: expected comma-separated integers or ranges like 0,2,5-7.") from None
    return sorted(set(out))


#: the widest range ``"a-b"`` an option of layer numbers expands
MAX_RANGE = 100_000


#: the ``--heads`` value that keeps every head's block-mean map (``head_maps``)
ALL_HEADS = "all"


def parse_heads(text: str | None, flag: str = "--heads") -> list[tuple[int, int]] | str:
    """``"3.5,10.2"`` -> ``[(3, 5), (10, 2)]`` (layer.head); ``"all"`` -> ``"all"`` (every head's
    block-mean map), which does not mix with pairs."""
    if not text:
        return []
    parts = [p.strip() for p in str(text).split(",")]
    if ALL_HEADS in (p.lower() for p in parts):
        if len(parts) > 1:
            raise PoslensError(f"{flag} {text!r}: 'all' keeps every head's map and does not mix with LAYER.HEAD "
                               "pairs; pass either all or pairs such as 3.5,10.2.")
        return ALL_HEADS
    out = []
    for part in parts:
        try:
            l, h = part.split(".")
            out.append((int(l), int(h)))
        except ValueError:
            raise PoslensError(f"{flag} {text!r}: expected LAYER.HEAD pairs separated by commas, e.g. 3.5,10.2, "
                               "or all.") from None
    return sorted(set(out))


def layer_list(value, name: str) -> list[int] | None:
    """Layer numbers: None or ``"all"`` (every layer), text such as ``"0,2,5-7"``, or numbers."""
    if value is None or isinstance(value, str):
        return parse_int_list(value, name)
    try:
        return [int(x) for x in value]
    except (TypeError, ValueError):
        raise PoslensError(f"{name} {value!r}: expected layer numbers, e.g. [0, 2] or '0,2,5-7'.") from None


def some_layers(value, name: str) -> list[int]:
    """Layer numbers as :func:`layer_list`; none given is the empty list."""
    return layer_list(value, name) or []


def head_pairs(value, name: str) -> list[tuple[int, int]] | str:
    """``(layer, head)`` pairs, text such as ``"3.5,10.2"``, or ``"all"`` (every head's block-mean map)."""
    if value is None or isinstance(value, str):
        return parse_heads(value, name)
    try:
        items = list(value)
    except TypeError:
        items = None
    if items is not None and any(isinstance(v, str) and v.strip().lower() == ALL_HEADS for v in items):
        raise PoslensError(f"{name} {value!r}: 'all' keeps every head's map and does not mix with (layer, head) pairs; "
                           "pass heads='all' or pairs such as [(3, 5), (10, 2)].")
    try:
        return [(int(l), int(h)) for l, h in items]
    except (TypeError, ValueError):
        raise PoslensError(f"{name} {value!r}: expected (layer, head) pairs, e.g. [(3, 5), (10, 2)] or "
                           "'3.5,10.2', or 'all'.") from None


def stat_names(value, name: str) -> list | None:
    """Statistics: None or ``"all"`` (every built-in one), comma-separated text, or a list of names and
    :class:`poslens.Statistic` objects."""
    if value is None or isinstance(value, str):
        return None if value in (None, "all") else [p.strip() for p in value.split(",")]
    if not isinstance(value, (list, tuple)):
        raise PoslensError(f"{name} {value!r}: expected statistic names and poslens.Statistic objects, e.g. "
                           "['scores', 'probs'] or 'scores,probs'.")
    return list(value)


# --------------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------------
def option(default: Any = MISSING, help: str = "", *, flag: str = "", flag_help: str = "", path: bool = False,
           convert: Callable[[Any, str], Any] | None = None, python: str | None = "keyword",
           python_default: Any = SAME, python_type: Any = None) -> Any:
    """A :class:`ScanConfig` field with its meaning and its spellings.

    ``default``: the field's default (none: the option is required; a list is copied per config).
    ``help``: what it means, shown by ``poslens scan --help`` and ``help(poslens.scan)``.
    ``flag``: the CLI's spelling when not ``--field-name``: ``--no-NAME`` for a flag that turns a
    True field off (its help then ``flag_help``), an upper-case name for the positional argument.
    ``path``: a file or directory (the CLI shows ``<path>``, the keyword takes any path-like).
    ``convert(value, name)``: the field's value from text or a Python value (``name`` for errors).
    ``python``: ``"keyword"``, ``"positional"`` (also positional after the model), or None (not a
    keyword of :func:`poslens.scan`, which takes it another way). ``python_default``: the keyword's
    default where a notebook's differs from the CLI's; ``python_type``: its annotation where it takes
    more than the field (by default the field's type, optional where the keyword's default is None)."""
    meta = {"option": dict(help=help, flag=flag, flag_help=flag_help, path=path, convert=convert, python=python,
                           python_default=python_default, python_type=python_type)}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass
class ScanConfig:
    """Every option of a scan: its type, default and meaning, declared here once (``poslens scan``'s
    flags and :func:`poslens.scan`'s keywords are made from these fields)."""

    model_dir: str = option(help=MODEL_DIR_HELP[:-1] + " (dequantised once into the cache, docs/models.md).",
                            flag="MODEL_DIR", path=True, python=None)
    out: str = option(help="Run directory to create (must be new unless --resume or --overwrite).", path=True,
                      python_default=None)
    data: str = option("stdlib", DATA_HELP, python="positional", python_type=Any)
    seq_len: int = option(256, "Tokens per sequence (at most the model's maximum).", python_default=None)
    beyond_context: bool = option(False, "Allow --seq-len past the model's trained context (max_position_embeddings); "
                                         "every reading is then marked as beyond it.")
    num_seqs: int = option(64, "Sequences to average over.", python_default=None)
    batch_size: int = option(4, "Sequences per forward pass.")
    seed: int = option(0, "Seed of --data random and of the --reservoir sample.")
    dtype: str = option("auto", "auto | bf16 | fp16 | fp32 (auto: fp32 on CPU, the checkpoint's half precision on "
                                "CUDA). Accumulators are float64 regardless.")
    device: str = option("auto", DEVICE_HELP + " Under torchrun: cuda:LOCAL_RANK.")
    device_map: str | None = option(None, "auto | balanced | sequential: spread a model too large for one device "
                                          "over all visible devices (accelerate); accumulators stay on the first GPU "
                                          "(or the CPU).")
    layers: list[int] | None = option(None, "Layers to capture, e.g. 0,1,8-11 (default: all).", convert=layer_list)
    heads: list[tuple[int, int]] | str = option(
        [], "LAYER.HEAD pairs that also get per-head S x S maps, e.g. 3.5,10.2; or all: every head of every scanned "
            f"layer keeps its mean weight map as block means on at most a {HEAD_MAP_MAX_SIDE} x {HEAD_MAP_MAX_SIDE} grid "
            "(head_maps, a few percent more CPU time; on CUDA those layers take the torch pass).", convert=head_pairs)
    no_rope_layers: list[int] = option([], "Control: attend with un-rotated q/k in these layers.", convert=some_layers)
    bidirectional: bool = option(False, "Control: drop the causal mask in every layer.")
    reservoir: int = option(256, "Token slots (a uniform sample of all sequence positions) whose pre-RoPE q/k vectors "
                                 "are kept in every layer; 0 = none.")
    stats: list[str] | None = option(
        None, "Statistics to accumulate, comma-separated: scores, probs, slash, cosine (residual stream), "
              "attn_cosine, qk (q/k second moments and the --reservoir sample), dim_logit; or all (default); or a "
              "user's poslens.Statistic by its importable name, e.g. mypkg.stats.Entropy (docs/statistics.md). "
              "Unrequested ones cost nothing; the summary reads them as null.", convert=stat_names,
        python_type=str | list | None)
    map_size: int = option(0, "Keep the S x S maps (scores, probs, cosine, attn_cosine, --heads maps) as exact block "
                              "means on an N x N grid (blocks of ceil(S/N) positions) for long contexts; slash "
                              "profiles and norms stay exact. 0 = full maps.")
    keep_checkpoint: bool = option(False, "Keep checkpoint.safetensors in the run directory after a finished scan "
                                          "(default: deleted, it is as large as the accumulators).")
    figures: bool = option(True, "Draw the PNG figures of the maps (tables and tensors are written either way).",
                           flag="--no-figures", flag_help=NO_FIGURES_HELP, python_default=False)
    resume: bool = option(False, "Continue from the run directory's checkpoint.safetensors (same options).")
    overwrite: bool = option(False, "Replace the run directory --out if it already exists (refused without it).")
    checkpoint_every: int = option(10, "Write an accumulator checkpoint every N batches.")
    chunk_elems: int = option(0, "Logits per capture chunk, which bounds the working memory; 0 = per device (CPU "
                                 "cache-sized, CUDA 2^28).")
    aps_max_positions: int = option(256, "Positions per sequence (evenly spaced) the per-sequence APS is computed "
                                         "on; its cost grows as their cube.")
    allow_pickle: bool = option(False, ALLOW_PICKLE_HELP)
    trust_remote_code: bool = option(False, "Allow custom model code from the model directory.")


@dataclass(frozen=True)
class ScanOption:
    """One option of a scan as both faces show it, made from a :class:`ScanConfig` field."""

    name: str  #: the field, and the keyword of :func:`poslens.scan`
    type: Any  #: the field's type
    default: Any  #: the field's default (``MISSING``: required)
    help: str
    flag: str  #: ``--seq-len``, ``--no-figures`` (turns the field off) or ``MODEL_DIR`` (the argument)
    flag_help: str  #: the help of the flag (``help``, unless the flag says the opposite of the field)
    path: bool  #: a file or directory
    convert: Callable[[Any, str], Any] | None
    python: str | None  #: ``"keyword"``, ``"positional"`` or None (not a keyword)
    python_default: Any  #: the keyword's default
    python_type: Any  #: the keyword's annotation

    @property
    def negated(self) -> bool:
        """The flag turns a True field off (``--no-figures``)."""
        return self.flag == "--no-" + self.name.replace("_", "-")

    @property
    def argument(self) -> bool:
        """The CLI takes it as a positional argument."""
        return not self.flag.startswith("--")

    @property
    def flag_default(self) -> Any:
        """The flag's default as the CLI shows it (a list-valued option is text, none given)."""
        if self.negated:
            return False
        return None if self.convert is not None else self.default

    @property
    def flag_type(self) -> type:
        """What the CLI parses the flag's text into (a list-valued option is text, see ``convert``)."""
        if self.path:
            return Path
        return self.type if self.type in (bool, int, float) else str

    def from_flag(self, value: Any) -> Any:
        """The field's value of the flag's parsed ``value``."""
        if self.negated:
            return not value
        return self._value(value, self.flag)

    def from_keyword(self, value: Any) -> Any:
        """The field's value of :func:`poslens.scan`'s keyword ``value``."""
        return self._value(value, self.name)

    def _value(self, value: Any, name: str) -> Any:
        if self.convert is not None:
            return self.convert(value, name)
        return os.fspath(value) if self.path and value is not None else value


def scan_options() -> list[ScanOption]:
    """The options of a scan, in the order of :class:`ScanConfig`'s fields (the order of ``--help``)."""
    hints = typing.get_type_hints(ScanConfig)
    out = []
    for f in dataclasses.fields(ScanConfig):
        m = f.metadata["option"]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        python_default = default if m["python_default"] is SAME else m["python_default"]
        python_type = m["python_type"]
        if python_type is None:
            python_type = str | os.PathLike if m["path"] else hints[f.name]
            if python_default is None and type(None) not in typing.get_args(python_type):
                python_type = python_type | None
        out.append(ScanOption(
            name=f.name, type=hints[f.name], default=default, help=m["help"],
            flag=m["flag"] or "--" + f.name.replace("_", "-"), flag_help=m["flag_help"] or m["help"], path=m["path"],
            convert=m["convert"], python=m["python"], python_default=python_default, python_type=python_type))
    return out
