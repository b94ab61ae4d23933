"""Cause: a user statistic's ``result()`` was checked only in part: a tensor named by a key that is not
a string, or a sparse tensor, reached safetensors and raised there. Each is one PoslensError naming the
statistic, before anything is stored."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

import poslens
from poslens.errors import PoslensError


class _Counts(poslens.Statistic):
    """Counts the rows it sees; ``result()`` returns what the test gives it."""

    needs = ("probs",)
    given: ClassVar[dict] = {}

    def __init__(self):
        self.rows = torch.zeros((), dtype=torch.float64)

    def add(self, layer, probs):
        self.rows += probs.shape[-2]

    def merge(self, other):
        self.rows += other.rows

    def state_dict(self):
        return {"rows": self.rows}

    def load_state_dict(self, state):
        self.rows = state["rows"]

    def result(self):
        return dict(self.given)


class IntKey(_Counts):
    given: ClassVar[dict] = {3: torch.ones(2)}


class Sparse(_Counts):
    given: ClassVar[dict] = {"rows": torch.eye(3).to_sparse()}


@pytest.mark.parametrize("stat", [IntKey, Sparse])
def test_a_bad_result_is_one_error_naming_the_statistic(tiny, tmp_path, stat):
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(0))
    out = tmp_path / "r"
    with pytest.raises(PoslensError) as e:
        poslens.scan(str(tiny), data=ids, stats=[stat()], progress=False, threads=1, out=out)
    msg = str(e.value)
    assert stat.__name__ in msg and "result()" in msg and "\n" not in msg
    assert "SafetensorError" not in type(e.value).__name__
    assert not out.exists()  # a new --out: nothing of the failed run stays
