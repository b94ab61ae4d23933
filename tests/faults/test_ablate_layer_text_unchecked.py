"""Cause: ``ablate --layers`` text that names no layer (``''``, ``each:``) reached the layer check as None
(a TypeError), and a range such as ``0-99999999999999999999`` was expanded before it was checked (an
OverflowError, or memory without bound); ``--noise-groups 1`` was taken, leaving every standard error
None. Each is one line naming the option, exit 2, nothing written."""

from __future__ import annotations

import pytest

from faultkit import one_error

ABL = ["--data", "random", "--seq-len", "8", "--num-seqs", "4", "--quiet", "--threads", "1", "--no-figures"]


@pytest.mark.parametrize("args,words", [
    (["--layers", ""], "--layers"),
    (["--layers", "each:"], "--layers"),
    (["--layers", "0-99999999999999999999"], "--layers"),
    (["--noise-groups", "1"], "--noise-groups 1"),
])
def test_ablate_refuses_what_names_no_layer_or_no_noise(cli, tiny, tmp_path, args, words):
    code, _, err = cli("ablate", tiny, "--out", tmp_path / "o", *ABL, *args)
    one_error(code, err, words)
    assert not (tmp_path / "o").exists()
