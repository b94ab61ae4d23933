"""Positional tasks: answers checked by independent oracles, splits, determinism, exact match."""

import random

import pytest
import torch

from poslens.errors import PoslensError
from poslens.data.tasks import (IGNORE, INDEX_CHARS, TASKS, TaskSource, collate, encode_example, example_strings,
                           exact_match_counts, get_task)
from poslens.data.tokenizer import BOS, EOS, char_tokenizer, char_vocab


def _oracle(name, prompt):
    """Recompute the answer from the prompt text alone."""
    if name in ("copy", "reverse"):
        x = prompt.rstrip("|")
        return x if name == "copy" else x[::-1]
    if name == "add":
        a, b = prompt.rstrip("=").split("+")
        return str(int(a) + int(b))[::-1]
    if name in ("wherex", "identify"):
        x, d = prompt.rstrip("=").split("?")
        return str(x.find(d)) if name == "wherex" else str(int(d in x))
    if name == "order":
        x, y = prompt.rstrip("=").split("|")
        return "".join(INDEX_CHARS[x.index(c)] for c in y)
    if name == "parity":
        return str(prompt.rstrip("=").count("1") % 2)
    raise AssertionError(name)


@pytest.mark.parametrize("name", [n for n in TASKS if n != "offset"])
def test_answers_match_oracle(name):
    rng = random.Random(0)
    for n in (1, 2, 3, 7, 12):
        for _ in range(30):
            prompt, answer = example_strings(name, rng, n)
            assert answer == _oracle(name, prompt), (prompt, answer)


def test_wherex_digit_present_and_identify_balanced():
    rng = random.Random(1)
    for _ in range(200):
        p, a = example_strings("wherex", rng, 8)
        assert int(a) >= 0
    answers = [example_strings("identify", rng, 5)[1] for _ in range(1000)]
    assert 0.4 < answers.count("1") / 1000 < 0.6


@pytest.mark.parametrize("name", list(TASKS))
def test_encoding_targets_and_length_bound(name):
    vocab = char_vocab()
    task = get_task(name)
    rng = random.Random(2)
    for n in (2, 5, 13):
        ids, tg = encode_example(task, rng, n, vocab, delta=2)
        assert len(ids) == len(tg) <= task.max_tokens(n)
        assert ids[0] == vocab[BOS]
        if name == "offset":
            assert all(t == IGNORE for t in tg[:3])
            assert all(tg[p] == ids[p - 2] for p in range(3, len(ids)))
        else:
            # targets are exactly the next tokens over the answer span, ending with <eos>
            span = [p for p, t in enumerate(tg) if t != IGNORE]
            assert span == list(range(span[0], len(ids) - 1))
            assert [tg[p] for p in span] == ids[span[0] + 1:]
            assert ids[-1] == vocab[EOS]


def test_char_tokenizer_agrees_with_task_vocab(tmp_path):
    from transformers import AutoTokenizer

    tok = char_tokenizer()
    tok.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    vocab = char_vocab()
    rng = random.Random(3)
    for name in TASKS:
        prompt, answer = example_strings(name, rng, 6, 2)
        text = prompt + (answer or "")
        assert tok(text, add_special_tokens=False).input_ids == [vocab[c] for c in text]
        assert tok.decode([vocab[c] for c in text]) == text


def test_splits_and_determinism():
    src = TaskSource("copy", max_len=6, seed=0)
    lens_in = [ids.index(char_vocab()["|"]) - 1 for ids, _ in src.eval_examples("in", 300)]
    lens_long = [ids.index(char_vocab()["|"]) - 1 for ids, _ in src.eval_examples("long", 300)]
    assert min(lens_in) == 1 and max(lens_in) == 6
    assert min(lens_long) == 7 and max(lens_long) == 12
    a, b = src.train_batch(5, 8), TaskSource("copy", max_len=6, seed=0).train_batch(5, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(src.train_batch(6, 8)[0], a[0]) or src.train_batch(6, 8)[0].shape != a[0].shape
    assert src.eval_examples("in", 50) == TaskSource("copy", max_len=6, seed=0).eval_examples("in", 50)
    assert src.eval_examples("in", 50) != TaskSource("copy", max_len=6, seed=1).eval_examples("in", 50)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(task="sort"), "unknown"),
    (dict(task="order", max_len=14), "2L"),
    (dict(task="copy", max_len=0), "below"),
    (dict(task="offset", max_len=3, delta=3), "below"),
])
def test_bad_task_options(kwargs, msg):
    with pytest.raises(PoslensError, match=msg):
        TaskSource(**kwargs)


class _Oracle(torch.nn.Module):
    """Fake causal LM whose logits put all mass on the right target (except for chosen rows)."""

    def __init__(self, examples, vocab_size, wrong_rows=()):
        super().__init__()
        self.table = {tuple(ids): tg for ids, tg in examples}
        self.vocab_size, self.wrong_rows = vocab_size, set(wrong_rows)

    def forward(self, input_ids):
        B, T = input_ids.shape
        logits = torch.zeros(B, T, self.vocab_size)
        for b in range(B):
            ids = [i for i in input_ids[b].tolist()]
            while ids and tuple(ids) not in self.table:
                ids.pop()  # strip padding
            tg = self.table[tuple(ids)]
            for t, y in enumerate(tg):
                if y != IGNORE:
                    logits[b, t, (y + (1 if b in self.wrong_rows and t == len(tg) - 2 else 0)) % self.vocab_size] = 30.0
        return type("Out", (), {"logits": logits})()


def test_exact_match_counts_oracle():
    src = TaskSource("reverse", max_len=5, seed=0)
    ex = src.eval_examples("in", 20)
    V = len(char_vocab())
    c, n, loss = exact_match_counts(_Oracle(ex, V), ex, src.pad_id, batch_size=8)
    assert (c, n) == (20, 20) and loss < 1e-3
    # one wrong token (the <eos> prediction) in rows 0 and 3 of every batch of 8 -> 3 batches, 6 wrong
    c, n, _ = exact_match_counts(_Oracle(ex, V, wrong_rows=(0, 3)), ex, src.pad_id, batch_size=8)
    assert (c, n) == (14, 20)


def test_collate_pads_after_content():
    ids, tg = collate([([1, 5, 6], [IGNORE, 6, 2]), ([1, 5], [IGNORE, 2])], pad_id=0)
    assert ids.tolist() == [[1, 5, 6], [1, 5, 0]]
    assert tg.tolist() == [[IGNORE, 6, 2], [IGNORE, 2, IGNORE]]
