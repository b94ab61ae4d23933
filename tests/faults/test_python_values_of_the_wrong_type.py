"""Cause: ``data=`` and ``stats=`` values of the wrong Python type reached ``list()`` (``TypeError: 'int'
object is not iterable``). Each is one PoslensError naming the keyword and the forms it takes."""

from __future__ import annotations

import pytest
import torch

import poslens
from poslens.errors import PoslensError


@pytest.mark.parametrize("call,kw,words", [
    ("scan", {"data": 123}, "data=123"),
    ("scan", {"data": 12.5}, "data=12.5"),
    ("scan", {"data": torch.randint(3, 60, (2, 8)), "stats": 123}, "stats 123"),
    ("ablate", {"data": 123}, "data=123"),
])
def test_a_value_of_the_wrong_type_is_one_error_naming_the_keyword(tiny, call, kw, words):
    with pytest.raises(PoslensError) as e:
        getattr(poslens, call)(str(tiny), progress=False, threads=1, **kw)
    assert words in str(e.value) and "\n" not in str(e.value)
