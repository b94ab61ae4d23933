"""Exact ties kept exact (poslens.metrics.ties): whatever kernel rounded a product, identical vectors
get identical similarities, so the APS count does not take a last-bit difference for a rise."""

import torch

from poslens.metrics.neighborhood import adjacency_probability_score
from poslens.metrics.ties import equal_row_representatives, tie_columns


def test_representatives_find_bitwise_equal_rows_only():
    a = torch.randn(6, 5)
    a[3] = a[1]
    a[5] = a[1]
    a[4] = a[2].nextafter(torch.tensor(float("inf")))  # one ulp away: not a tie
    assert equal_row_representatives(a).tolist() == [0, 1, 2, 1, 4, 1]
    assert equal_row_representatives(torch.randn(4, 3)) is None
    assert equal_row_representatives(a.double()).tolist() == [0, 1, 2, 1, 4, 1]


def test_tie_columns_repairs_a_kernel_rounding_difference():
    g = torch.Generator().manual_seed(0)
    u = torch.nn.functional.normalize(torch.randn(1, 8, 4, generator=g), dim=-1)
    u[0, 5] = u[0, 2]  # a repeated token
    m = (u[:, :, None, :] * u[:, None, :, :]).sum(-1)
    exact = adjacency_probability_score(m.double())
    broken = m.clone()
    broken[0, 7, 5] = broken[0, 7, 5].nextafter(torch.tensor(2.0))  # what another kernel's rounding does
    assert adjacency_probability_score(broken.double()) != exact  # the tie is counted as a rise
    assert adjacency_probability_score(tie_columns(broken, u).double()) == exact
