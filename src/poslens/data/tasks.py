"""Character-level positional tasks: generators, batching and exact-match evaluation.

Every task draws an example of a given *length* ``n`` (the size of its variable-length input)
from a ``random.Random``. Most tasks are prompt -> answer; the sequence the model sees is
``<bos> prompt answer <eos>`` and the loss covers only the answer and the ``<eos>``.

===========  ==========================================  =====================  ==================
task         prompt (n = length)                          answer                 source
===========  ==========================================  =====================  ==================
copy         ``x|``, x = n random digits                  x                      arXiv 2305.19466
reverse      ``x|``, x = n random digits                  x reversed             arXiv 2501.00073
add          ``a+b=``, a, b with n digits (default 3)     a+b, digits reversed   arXiv 2501.00073
wherex       ``x?d=``, d a digit occurring in x           first index of d in x  arXiv 2501.00073
order        ``x|y=``, x = n distinct letters, y = shuffle  index in x of each    arXiv 2501.00073
                                                          letter of y (0-9a-z)
identify     ``x?d=``                                     1 if d in x else 0     arXiv 2501.00073
parity       ``x=``, x = n random bits                    number of 1s mod 2     arXiv 2501.00073
offset       ``x``, n random letters (no separator)       at each position t,    slash heads,
                                                          the letter x[t - Δ]    arXiv 2601.08297
===========  ==========================================  =====================  ==================

``offset`` is a tagging task: position t is trained to output the input token Δ positions back
(for t >= Δ), the behaviour of a Δ-slash-dominant head.

**Exact match** is measured with one teacher-forced forward pass: an example counts as correct
when the arg-max prediction is right at every target position. For prompt -> answer tasks this
equals greedy decoding of the answer (the first wrong token under teacher forcing is exactly
where greedy decoding would first diverge), and it includes predicting ``<eos>`` at the end.

**Length generalisation** (arXiv 2305.19466): training lengths are drawn uniformly from
``min_length..L`` and the long test set from ``L+1..2L``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from poslens.errors import PoslensError
from poslens.data.tokenizer import BOS, EOS, PAD, char_vocab

IGNORE = -100
DIGITS = "0123456789"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
INDEX_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    default_length: int  # L: training lengths are min_length..L
    min_length: int
    max_length: int  # largest n the task can express (2L must not exceed it)
    sample: Callable  # (rng, n, delta) -> (prompt, answer)  or, for tagging tasks, (text, None)
    max_tokens: Callable  # n -> longest token sequence (with <bos>/<eos>) at length n


def _digits(rng: random.Random, n: int, alphabet: str = DIGITS) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _copy(rng, n, delta):
    x = _digits(rng, n)
    return x + "|", x


def _reverse(rng, n, delta):
    x = _digits(rng, n)
    return x + "|", x[::-1]


def _add(rng, n, delta):
    lo = 0 if n == 1 else 10 ** (n - 1)
    a, b = rng.randint(lo, 10 ** n - 1), rng.randint(lo, 10 ** n - 1)
    return f"{a}+{b}=", str(a + b)[::-1]


def _wherex(rng, n, delta):
    x = _digits(rng, n)
    d = x[rng.randrange(n)]
    return f"{x}?{d}=", str(x.index(d))


def _order(rng, n, delta):
    x = "".join(rng.sample(LETTERS, n))
    y = "".join(rng.sample(x, n))
    return f"{x}|{y}=", "".join(INDEX_CHARS[x.index(c)] for c in y)


def _identify(rng, n, delta):
    x = _digits(rng, n)
    present = rng.random() < 0.5
    absent = [c for c in DIGITS if c not in x]
    if present or not absent:
        d = rng.choice(x)
    else:
        d = rng.choice(absent)
    return f"{x}?{d}=", "1" if d in x else "0"


def _parity(rng, n, delta):
    x = _digits(rng, n, "01")
    return x + "=", str(x.count("1") % 2)


def _offset(rng, n, delta):
    return _digits(rng, n, LETTERS), None


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("copy", "repeat the digit string", 16, 1, 10_000, _copy, lambda n: 2 * n + 3),
    Task("reverse", "the digit string reversed", 16, 1, 10_000, _reverse, lambda n: 2 * n + 3),
    Task("add", "n-digit addition, answer digits reversed", 3, 1, 1_000, _add, lambda n: 3 * n + 5),
    Task("wherex", "first index of a digit in the string", 16, 1, 10_000, _wherex,
         lambda n: n + 5 + len(str(max(n - 1, 0)))),
    Task("order", "the permutation taking x to its shuffle", 8, 1, len(LETTERS), _order, lambda n: 3 * n + 4),
    Task("identify", "whether a digit occurs in the string", 16, 1, 10_000, _identify, lambda n: n + 6),
    Task("parity", "parity of the number of ones", 16, 1, 10_000, _parity, lambda n: n + 4),
    Task("offset", "output the token delta positions back", 32, 1, 10_000, _offset, lambda n: n + 1),
)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise PoslensError(f"--task {name!r} is unknown; choose one of {', '.join(TASKS)} "
                           "(or leave it out to train a language model on a corpus).")
    return TASKS[name]


def validate_lengths(task: Task, max_len: int | None, delta: int = 1) -> int:
    """Check the training length L (default: the task's) and return it; the long test uses up to 2L."""
    L = task.default_length if max_len is None else max_len
    lo = task.min_length + (delta if task.name == "offset" else 0)
    if task.name == "offset" and delta < 0:
        raise PoslensError(f"--delta must be >= 0 (got {delta}).")
    if L < lo:
        raise PoslensError(f"--max-len {L} is below the smallest length {lo} of task {task.name}.")
    if 2 * L > task.max_length:
        raise PoslensError(f"--max-len {L}: task {task.name} needs 2L <= {task.max_length} for its long test set; "
                           f"use --max-len <= {task.max_length // 2}.")
    return L


def min_length(task: Task, delta: int = 1) -> int:
    return task.min_length + (delta if task.name == "offset" else 0)


def example_strings(task: Task | str, rng: random.Random, n: int, delta: int = 1) -> tuple[str, str | None]:
    """One example at length ``n``: ``(prompt, answer)``, or ``(text, None)`` for ``offset``."""
    task = get_task(task) if isinstance(task, str) else task
    return task.sample(rng, n, delta)


def encode_example(task: Task, rng: random.Random, n: int, vocab: dict[str, int], delta: int = 1
                   ) -> tuple[list[int], list[int]]:
    """Token ids and aligned targets: ``targets[t]`` is what position ``t`` must predict, or
    ``IGNORE``. Prompt/answer tasks predict the answer and ``<eos>``; ``offset`` predicts x[t-Δ]."""
    text, answer = task.sample(rng, n, delta)
    if answer is None:  # tagging (offset): position p holds x[p-1] (after <bos>)
        ids = [vocab[BOS]] + [vocab[c] for c in text]
        targets = [IGNORE] * len(ids)
        for p in range(1, len(ids)):
            src = p - 1 - delta
            if src >= 0:
                targets[p] = ids[1 + src]
        return ids, targets
    ids = [vocab[BOS]] + [vocab[c] for c in text] + [vocab[c] for c in answer] + [vocab[EOS]]
    start = 1 + len(text)  # first answer token
    targets = [IGNORE] * len(ids)
    for p in range(start - 1, len(ids) - 1):
        targets[p] = ids[p + 1]
    return ids, targets


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-pad to a ``(batch, time)`` pair of LongTensors. Padding sits after every real token,
    so under the causal mask it never influences a target and no attention mask is needed."""
    import torch

    T = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    targets = torch.full((len(examples), T), IGNORE, dtype=torch.long)
    for b, (ids, tg) in enumerate(examples):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        targets[b, : len(tg)] = torch.tensor(tg)
    return input_ids, targets


class TaskSource:
    """Deterministic batches of one task: the batch for step ``s`` depends only on (seed, s), so
    resuming at any step reproduces the data exactly without storing a data position."""

    def __init__(self, task: str, max_len: int | None = None, seed: int = 0, delta: int = 1):
        self.task = get_task(task)
        self.delta = delta
        self.L = validate_lengths(self.task, max_len, delta)
        self.lo = min_length(self.task, delta)
        self.seed = seed
        self.vocab = char_vocab()
        self.pad_id = self.vocab[PAD]

    @property
    def max_tokens(self) -> int:
        """Longest sequence in any split (the long test goes up to 2L)."""
        return self.task.max_tokens(2 * self.L)

    def examples(self, rng: random.Random, count: int, lo: int, hi: int):
        return [encode_example(self.task, rng, rng.randint(lo, hi), self.vocab, self.delta) for _ in range(count)]

    def train_batch(self, step: int, batch_size: int):
        rng = random.Random(f"train/{self.seed}/{step}")
        return collate(self.examples(rng, batch_size, self.lo, self.L), self.pad_id)

    def eval_examples(self, split: str, count: int):
        """Fixed evaluation examples: ``"in"`` (lengths min..L) or ``"long"`` (L+1..2L)."""
        return self.eval_examples_with_lengths(split, count)[0]

    def eval_examples_with_lengths(self, split: str, count: int):
        """``(examples, lengths)``: the same examples as :meth:`eval_examples` and each one's n."""
        if split not in ("in", "long"):
            raise PoslensError(f"evaluation split {split!r} is not 'in' or 'long'.")
        rng = random.Random(f"eval-{split}/{self.seed}")
        lo, hi = (self.lo, self.L) if split == "in" else (self.L + 1, 2 * self.L)
        lengths, examples = [], []
        for _ in range(count):
            n = rng.randint(lo, hi)
            lengths.append(n)
            examples.append(encode_example(self.task, rng, n, self.vocab, self.delta))
        return examples, lengths


def exact_match_counts(model, examples, pad_id: int, *, batch_size: int = 256, device: str = "cpu",
                       autocast_dtype=None) -> tuple[int, int, float]:
    """(correct examples, total, mean token-level loss) under teacher forcing; see module doc."""
    flags, loss = exact_match_flags(model, examples, pad_id, batch_size=batch_size, device=device,
                                    autocast_dtype=autocast_dtype)
    return sum(flags), len(flags), loss


def exact_match_flags(model, examples, pad_id: int, *, batch_size: int = 256, device: str = "cpu",
                      autocast_dtype=None) -> tuple[list[bool], float]:
    """Per-example exact match (teacher forced, see module doc) and the mean token-level loss."""
    import contextlib

    import torch
    import torch.nn.functional as F

    flags: list[bool] = []
    loss_sum, loss_n = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(examples), batch_size):
                ids, tg = collate(examples[i: i + batch_size], pad_id)
                ids, tg = ids.to(device), tg.to(device)
                ctx = torch.autocast("cuda", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
                with ctx:
                    logits = model(input_ids=ids).logits
                logits = logits.float()
                mask = tg != IGNORE
                pred = logits.argmax(-1)
                ok = ((pred == tg) | ~mask).all(dim=1)
                flags.extend(bool(v) for v in ok.tolist())
                loss_sum += float(F.cross_entropy(logits[mask], tg[mask], reduction="sum"))
                loss_n += int(mask.sum())
    finally:
        model.train(was_training)
    return flags, loss_sum / max(loss_n, 1)


def evaluate_task(model, task: str, *, max_len: int | None = None, count: int = 500, seed: int = 0,
                  delta: int = 1, device: str = "cpu") -> dict:
    """Exact-match accuracy of a model on the task's evaluation sets (the same examples the trainer
    scores for the same ``seed``/``count``): ``eval_accuracy`` (lengths min..L),
    ``eval_accuracy_long`` (L+1..2L), their losses, and ``accuracy_by_length`` {n: accuracy}."""
    src = TaskSource(task, max_len, seed, delta)
    out: dict = {}
    by_len: dict[int, list[bool]] = {}
    for split, key in (("in", "eval_accuracy"), ("long", "eval_accuracy_long")):
        examples, lengths = src.eval_examples_with_lengths(split, count)
        flags, loss = exact_match_flags(model, examples, src.pad_id, device=device)
        out[key] = sum(flags) / len(flags)
        out[key.replace("accuracy", "loss")] = loss
        for n, f in zip(lengths, flags):
            by_len.setdefault(n, []).append(f)
    out["accuracy_by_length"] = {n: sum(v) / len(v) for n, v in sorted(by_len.items())}
    return out
