"""The one random-token generator: i.i.d. uniform token ids, index-addressable.

Row ``n`` is drawn from a generator seeded with ``(seed, n)`` alone, so rows ``start .. stop-1``
are the same whether a run draws them in one go, in batches, after a resume or on one shard of a
distributed run. Every random-token input in poslens comes from here: the ``random`` scan source
(the out-of-distribution prompts of arXiv 2601.08297), the character prompts of ``neighborhood
--chars`` and ``probes``, and the printable-ASCII inputs of ``sweep``.
"""

from __future__ import annotations

from typing import Sequence

import torch

#: row n's generator seed is ``seed * SEED_STRIDE + n`` (distinct seeds never share a row for n < stride)
SEED_STRIDE = 1_000_003


def random_tokens(start: int, stop: int, seq_len: int, *, pool: int | Sequence[int], seed: int = 0,
                  bos: int | None = None) -> torch.Tensor:
    """Rows ``start .. stop-1`` as a LongTensor ``[stop - start, seq_len]``.

    ``pool`` is a vocabulary size (ids ``0 .. pool-1``) or the list of allowed ids; each entry is a
    uniform draw from it. With ``bos``, column 0 is ``bos`` and the draws fill the other columns.
    """
    ids = torch.arange(int(pool)) if isinstance(pool, int) else torch.as_tensor(list(pool), dtype=torch.long)
    if ids.numel() < 1:
        raise ValueError("random_tokens: the pool of token ids is empty")
    n = seq_len - (1 if bos is not None else 0)
    rows = []
    for i in range(start, stop):
        g = torch.Generator().manual_seed(seed * SEED_STRIDE + i)
        rows.append(ids[torch.randint(0, ids.numel(), (n,), generator=g)])
    x = torch.stack(rows) if rows else torch.empty(0, n, dtype=torch.long)
    if bos is not None:
        x = torch.cat([torch.full((x.shape[0], 1), bos, dtype=torch.long), x], 1)
    return x
