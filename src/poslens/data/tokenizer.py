"""Tokenizers saved with every model as a ``PreTrainedTokenizerFast``.

- :func:`train_bpe_tokenizer`: a byte-level BPE (the GPT-2 scheme) trained with ``tokenizers``
  on a corpus, for language-model runs;
- :func:`char_tokenizer`: one token per character over :data:`TASK_ALPHABET`, for the positional
  tasks (the character-level setting of arXiv 2501.00073).

Both use the same three special tokens, so a task model and a corpus model have the same
``pad``/``bos``/``eos`` conventions.
"""

from __future__ import annotations

from typing import Iterable

from poslens.errors import PoslensError

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)
# Every character a positional task may emit: digits, letters, and the task separators.
TASK_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+=|?>:,"


def _wrap(tok, model_max_length: int):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=None,
        model_max_length=model_max_length, clean_up_tokenization_spaces=False,
    )


def bpe_training_sample(texts: list[str], max_chars: int | None) -> list[str]:
    """Documents spread evenly over ``texts`` (every k-th) up to about ``max_chars`` characters.

    BPE merges are learned from this sample only (training on the whole 12 MB standard library
    costs minutes on a busy CPU and changes the merges little); the whole corpus is encoded."""
    total = sum(len(t) for t in texts)
    if max_chars is None or total <= max_chars:
        return list(texts)
    stride = max(1, round(total / max_chars))
    out, size = [], 0
    for t in texts[::stride]:
        out.append(t)
        size += len(t)
        if size >= max_chars:
            break
    return out


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 8192, *, model_max_length: int = 4096,
                        max_chars: int | None = 2_000_000):
    """Byte-level BPE trained on ``texts`` (a sample of about ``max_chars`` characters, see
    :func:`bpe_training_sample`); ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<eos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = bpe_training_sample(list(texts), max_chars)
    min_vocab = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_vocab:
        raise PoslensError(f"--vocab-size {vocab_size} is too small for a byte-level BPE; use at least {min_vocab}.")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _wrap(tok, model_max_length)


def char_vocab(alphabet: str = TASK_ALPHABET) -> dict[str, int]:
    """Character -> id, specials first, then ``alphabet`` in order."""
    if len(set(alphabet)) != len(alphabet):
        raise PoslensError("character alphabet has repeated characters.")
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    return vocab


def char_tokenizer(alphabet: str = TASK_ALPHABET, *, model_max_length: int = 4096):
    """One token per character of ``alphabet`` (ids in :func:`char_vocab` order); decoding joins
    characters without spaces. Characters outside the alphabet are an encoding error."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=char_vocab(alphabet), unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _wrap(tok, model_max_length)


def char_ids(tokenizer, chars: str, flag: str) -> list[int]:
    """One token id per character of ``chars``; a clear error if a character is not a single token."""
    ids = []
    for c in dict.fromkeys(chars):
        try:
            enc = tokenizer(c, add_special_tokens=False)["input_ids"]
        except Exception:  # e.g. a character-level vocabulary without this character
            enc = []
        if len(enc) != 1:
            raise PoslensError(f"{flag} {chars!r}: character {c!r} is not one token of this tokenizer ({len(enc)} "
                               "tokens); pass characters that are single tokens.")
        ids.append(int(enc[0]))
    if len(ids) < 2:
        raise PoslensError(f"{flag} {chars!r}: need at least 2 distinct characters.")
    return ids
