"""Sequence sources for scans: deterministic and index-addressable.

Every source yields exactly ``num_seqs`` sequences of exactly ``seq_len`` token ids, and
``source.batch(start, stop)`` returns sequences ``start .. stop-1`` identically on every call,
so a resumed run (or a shard of a distributed one) sees the same tokens as an uninterrupted run.

- ``random``: i.i.d. uniform token ids (the out-of-distribution prompts of arXiv 2601.08297);
  sequence n is drawn from a generator seeded with ``(seed, n)``.
- ``stdlib`` / text file / directory / JSONL with ``text``: documents tokenised in order, joined
  with the tokenizer's EOS token (when it has one) and cut into consecutive ``seq_len`` chunks.
- JSONL with ``input_ids``: pre-tokenised records, concatenated and cut the same way.
- a ``datasets.save_to_disk`` directory (``input_ids`` or ``text`` column), when ``datasets`` is
  installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from poslens.data.corpus import iter_jsonl, iter_texts
from poslens.data.tokens import random_tokens
from poslens.errors import PoslensError


class SequenceSource:
    """``num_seqs`` sequences of ``seq_len`` ids; ``batch(start, stop)`` -> LongTensor ``[n, seq_len]``."""

    kind = "base"

    def __init__(self, seq_len: int, num_seqs: int):
        self.seq_len = int(seq_len)
        self.num_seqs = int(num_seqs)

    def batch(self, start: int, stop: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> dict:
        return {"kind": self.kind, "seq_len": self.seq_len, "num_seqs": self.num_seqs}


class RandomTokens(SequenceSource):
    kind = "random"

    def __init__(self, seq_len: int, num_seqs: int, vocab_size: int, seed: int = 0):
        super().__init__(seq_len, num_seqs)
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)

    def batch(self, start: int, stop: int) -> torch.Tensor:
        return random_tokens(start, stop, self.seq_len, pool=self.vocab_size, seed=self.seed)

    def describe(self) -> dict:
        return {**super().describe(), "vocab_size": self.vocab_size, "seed": self.seed}


class PackedTokens(SequenceSource):
    """Consecutive ``seq_len`` chunks of one token stream (held in memory: ``num_seqs x seq_len`` ids)."""

    kind = "packed"

    def __init__(self, ids: torch.Tensor, origin: str, requested: int):
        super().__init__(ids.shape[1], ids.shape[0])
        self.ids = ids
        self.origin = origin
        self.requested = requested

    def batch(self, start: int, stop: int) -> torch.Tensor:
        return self.ids[start:stop].clone()

    def describe(self) -> dict:
        return {**super().describe(), "origin": self.origin, "requested_seqs": self.requested}


def _pack(stream: Iterator[list[int]], seq_len: int, num_seqs: int, origin: str, vocab_size: int | None) -> PackedTokens:
    need = seq_len * num_seqs
    buf: list[int] = []
    for ids in stream:
        buf.extend(int(t) for t in ids)
        if len(buf) >= need:
            break
    n = min(num_seqs, len(buf) // seq_len)
    if n == 0:
        raise PoslensError(f"--data {origin}: {len(buf)} tokens, fewer than one sequence of --seq-len {seq_len}; "
                           "pass more data or a smaller --seq-len.")
    try:
        ids = torch.tensor(buf[: n * seq_len], dtype=torch.long, device="cpu").reshape(n, seq_len)
    except (OverflowError, RuntimeError, ValueError):  # an id beyond int64
        big = max(buf[: n * seq_len], key=abs)
        where = "data" if origin == "data" else f"--data {origin}"
        raise PoslensError(f"{where}: token id {big} is out of range (beyond a 64-bit integer); token ids index the "
                           "model's vocabulary: the data is damaged or not token ids.") from None
    if vocab_size is not None and ids.numel() and (int(ids.max()) >= vocab_size or int(ids.min()) < 0):
        raise PoslensError(f"--data {origin}: token id {int(ids.max())} outside the model's vocabulary "
                           f"(size {vocab_size}); the data was tokenised for another model.")
    return PackedTokens(ids, origin, num_seqs)


def _jsonl_records(path: Path) -> Iterator[dict]:
    yield from iter_jsonl(path, lambda o: isinstance(o.get("input_ids"), list) or isinstance(o.get("text"), str),
                          "an 'input_ids' list or a 'text' string field")


def _jsonl_kind(path: Path) -> str | None:
    for obj in _jsonl_records(path):
        return "input_ids" if isinstance(obj.get("input_ids"), list) else "text"
    return None


def _text_stream(texts: Iterator[str], tokenizer, origin: str) -> Iterator[list[int]]:
    if tokenizer is None:
        raise PoslensError(f"--data {origin} is text but the model directory has no tokenizer; "
                           "pass --data random or pre-tokenised JSONL with 'input_ids'.")
    eos = getattr(tokenizer, "eos_token_id", None)
    for t in texts:
        if not t:
            continue
        ids = tokenizer(t, add_special_tokens=False, verbose=False)["input_ids"]  # long texts are cut into chunks
        yield list(ids) + ([eos] if eos is not None else [])


def make_source(data: str, *, seq_len: int, num_seqs: int, seed: int = 0, tokenizer=None,
                vocab_size: int | None = None) -> SequenceSource:
    """Build the source named by ``--data`` (see module docstring)."""
    if seq_len < 2:
        raise PoslensError(f"--seq-len {seq_len}: need at least 2 tokens.")
    if num_seqs < 1:
        raise PoslensError(f"--num-seqs {num_seqs}: need at least 1 sequence.")
    if data == "random":
        if not vocab_size:
            raise PoslensError("--data random needs the model's vocab_size in config.json.")
        return RandomTokens(seq_len, num_seqs, vocab_size, seed)
    if data == "stdlib":
        return _pack(_text_stream(iter_texts("stdlib"), tokenizer, data), seq_len, num_seqs, data, vocab_size)
    path = Path(data)
    if not path.exists():
        raise PoslensError(f"--data {data}: no such file or directory; pass stdlib, random, a text/JSONL file, "
                           "or a datasets directory.")
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "state.json").exists()
                          or (path / "dataset_dict.json").exists()):
        return _from_datasets(path, seq_len, num_seqs, tokenizer, vocab_size)
    if path.is_file() and path.suffix == ".jsonl":
        kind = _jsonl_kind(path)
        if kind is None:
            raise PoslensError(f"--data {data}: the JSONL file is empty; pass a file with records.")
        if kind == "input_ids":
            stream = (list(r["input_ids"]) for r in _jsonl_records(path) if isinstance(r.get("input_ids"), list))
            return _pack(stream, seq_len, num_seqs, data, vocab_size)
        stream = _text_stream((r["text"] for r in _jsonl_records(path) if isinstance(r.get("text"), str)), tokenizer, data)
        return _pack(stream, seq_len, num_seqs, data, vocab_size)
    return _pack(_text_stream(iter_texts(path), tokenizer, data), seq_len, num_seqs, data, vocab_size)


def _from_datasets(path: Path, seq_len, num_seqs, tokenizer, vocab_size) -> PackedTokens:
    try:
        import datasets  # noqa: F401
        from datasets import load_from_disk
    except ImportError:
        raise PoslensError(f"--data {path} is a datasets directory but the 'datasets' package is not installed; "
                           "pip install 'poslens[datasets]'.") from None
    try:
        ds = load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - a damaged or partly copied directory: arrow, JSON or file errors
        raise PoslensError(f"--data {path}: the datasets directory cannot be read ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:160]}); save it again with save_to_disk.") from None
    if hasattr(ds, "keys") and not hasattr(ds, "column_names") or isinstance(getattr(ds, "column_names", None), dict):
        split = "train" if "train" in ds else sorted(ds.keys())[0]
        ds = ds[split]
    cols = ds.column_names
    if "input_ids" in cols:
        stream = (list(r) for r in ds["input_ids"])
    elif "text" in cols:
        stream = _text_stream((t for t in ds["text"]), tokenizer, str(path))
    else:
        raise PoslensError(f"--data {path}: the dataset has neither an 'input_ids' nor a 'text' column (has {cols}).")
    return _pack(stream, seq_len, num_seqs, str(path), vocab_size)


# --------------------------------------------------------------------------------------------
# data passed from Python (poslens.scan(model, data=...))
# --------------------------------------------------------------------------------------------
def is_python_data(data) -> bool:
    """True for data given as Python objects rather than a ``--data`` string: a tensor, a list of
    strings or a list of token-id lists."""
    return not isinstance(data, (str, bytes)) and not hasattr(data, "__fspath__")


def python_source(data, *, seq_len: int | None, num_seqs: int | None, tokenizer=None,
                  vocab_size: int | None = None) -> tuple[SequenceSource, str]:
    """A source for data passed from Python, packed as the CLI packs the same data from a file, so that
    ``poslens.scan(model, data=ids)`` and ``poslens scan DIR --data ids.jsonl`` see the same batches.

    - an ``[N, S]`` integer tensor (or array): its rows, ``seq_len`` = S unless given;
    - a list of token-id lists: concatenated and cut into ``seq_len`` chunks (as JSONL ``input_ids``);
      ``seq_len`` defaults to the length of the lists when they all have one length;
    - a list of strings: tokenised with ``tokenizer``, joined with its EOS token, cut the same way
      (as JSONL ``text``); ``seq_len`` defaults to 256.

    ``num_seqs`` defaults to every whole sequence the data holds. Returns ``(source, label)``: the label
    (kind, shape and a hash of the ids) is what ``config.json`` records as the data."""
    import hashlib

    if isinstance(data, torch.Tensor) or hasattr(data, "__array__") and not isinstance(data, (list, tuple)):
        ids = torch.as_tensor(data)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() != 2:
            raise PoslensError(f"data: a tensor of token ids must be an integer tensor [N, S]; got {ids.dtype} "
                               f"{list(ids.shape)}.")
        if ids.numel() == 0:
            raise PoslensError("data: the tensor of token ids is empty; pass at least one sequence.")
        if seq_len is None:
            seq_len = ids.shape[1]
        stream = (row.tolist() for row in ids.cpu())
        kind = "token-id tensor"
    else:
        if isinstance(data, (int, float, complex, bool, dict, set)) or not hasattr(data, "__iter__"):  # a number
            raise PoslensError(f"data={data!r}: not sequences; pass 'stdlib', 'random', a file or directory path, a "
                               "list of strings or of token-id lists, or an [N, S] integer tensor.")
        items = list(data)
        if not items:
            raise PoslensError("data: the list is empty; pass strings or token-id lists, 'stdlib' or 'random'.")
        if all(isinstance(x, str) for x in items):
            if tokenizer is None:
                raise PoslensError("data: a list of strings needs a tokenizer, and the model has none poslens can "
                                   "find; pass tokenizer= (e.g. AutoTokenizer.from_pretrained(...)) or token ids.")
            if seq_len is None:
                seq_len = 256
            stream = _text_stream(iter(items), tokenizer, "data")
            kind = "texts"
        elif all(isinstance(x, (list, tuple)) or isinstance(x, torch.Tensor) and x.dim() == 1 for x in items):
            rows = [x.tolist() if isinstance(x, torch.Tensor) else list(x) for x in items]
            if not all(isinstance(t, int) and not isinstance(t, bool) for r in rows for t in r):
                raise PoslensError("data: token-id lists must hold integers only.")
            if seq_len is None:
                lengths = {len(r) for r in rows}
                if len(lengths) != 1:
                    raise PoslensError(f"data: the token-id lists have {len(lengths)} different lengths; pass seq_len= "
                                       "(they are concatenated and cut into sequences of that length).")
                seq_len = lengths.pop()
            stream = iter(rows)
            kind = "token-id lists"
        else:
            raise PoslensError("data: expected a list of strings, a list of token-id lists or an [N, S] integer "
                               "tensor (or 'stdlib', 'random', a .jsonl/.txt path).")
    if seq_len < 2:
        raise PoslensError(f"seq_len {seq_len}: need at least 2 tokens.")
    if num_seqs is not None and num_seqs < 1:
        raise PoslensError(f"num_seqs {num_seqs}: need at least 1 sequence.")
    buf: list[int] = []
    for ids in stream:
        buf.extend(int(t) for t in ids)
        if num_seqs is not None and len(buf) >= num_seqs * seq_len:
            break
    n = len(buf) // seq_len if num_seqs is None else num_seqs
    source = _pack(iter([buf]), seq_len, n if n else 1, "data", vocab_size)
    digest = hashlib.sha256(source.ids.numpy().tobytes()).hexdigest()[:16]
    return source, f"python:{kind}:{source.num_seqs}x{source.seq_len}:sha256={digest}"
