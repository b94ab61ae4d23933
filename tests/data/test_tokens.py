"""The one random-token generator (poslens.data.tokens): index-addressable, uniform, seeded per row."""

import torch

from poslens.data.sources import make_source
from poslens.data.tokens import SEED_STRIDE, random_tokens


def test_rows_do_not_depend_on_how_they_are_batched():
    whole = random_tokens(0, 10, 12, pool=50, seed=3)
    parts = torch.cat([random_tokens(a, b, 12, pool=50, seed=3) for a, b in ((0, 1), (1, 4), (4, 10))])
    assert torch.equal(whole, parts)
    assert torch.equal(random_tokens(7, 8, 12, pool=50, seed=3)[0], whole[7])  # a resumed run's row 7
    assert not torch.equal(random_tokens(0, 10, 12, pool=50, seed=4), whole)


def test_row_n_is_its_own_seeded_draw():
    """Independent reference: row n is torch.randint from a generator seeded with seed * stride + n."""
    got = random_tokens(5, 8, 9, pool=31, seed=2)
    for i, n in enumerate(range(5, 8)):
        g = torch.Generator().manual_seed(2 * SEED_STRIDE + n)
        assert torch.equal(got[i], torch.randint(0, 31, (9,), generator=g))


def test_pool_of_ids_and_bos():
    ids = [7, 11, 13]
    x = random_tokens(0, 200, 20, pool=ids, seed=0, bos=1)
    assert x.shape == (200, 20) and x.dtype == torch.long
    assert (x[:, 0] == 1).all()
    body = x[:, 1:]
    assert set(body.unique().tolist()) == set(ids)
    # uniform over the pool: each id about a third of 200 x 19 draws (binomial sd ~ 20)
    counts = torch.stack([(body == i).sum() for i in ids]).double()
    assert (counts - body.numel() / 3).abs().max() < 6 * (body.numel() * (1 / 3) * (2 / 3)) ** 0.5
    assert random_tokens(0, 0, 5, pool=4).shape == (0, 5)


def test_scan_random_source_uses_the_same_rows():
    src = make_source("random", seq_len=8, num_seqs=6, seed=1, vocab_size=40)
    assert torch.equal(src.batch(2, 5), random_tokens(2, 5, 8, pool=40, seed=1))
