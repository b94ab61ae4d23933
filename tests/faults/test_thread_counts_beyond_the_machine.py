"""Cause: a ``--threads`` / ``threads=`` count was handed to torch unchecked: 99999999999999999999 overflowed
inside torch (a traceback) and 10**6 made the OpenMP runtime crash the process. A count above four per CPU
is refused in one line naming the option."""

from __future__ import annotations

import pytest
import torch

import poslens
from poslens.errors import PoslensError
from poslens.runtime import max_threads

from faultkit import SCAN, one_error, tree


@pytest.mark.parametrize("n", ["99999999999999999999", str(10**6)])
def test_the_cli_refuses_a_thread_count_beyond_the_machine(cli, tiny, tmp_path, n):
    args = [a if a != "1" or i == 0 else a for i, a in enumerate(SCAN)]
    args = args[:args.index("--threads")] + args[args.index("--threads") + 2:]
    code, _, err = cli("scan", tiny, "--out", tmp_path / "o", *args, "--threads", n)
    one_error(code, err, "--threads", str(max_threads()))
    assert not (tmp_path / "o").exists()


def test_python_refuses_a_thread_count_beyond_the_machine(tiny, tmp_path):
    before = tree(tmp_path)
    with pytest.raises(PoslensError, match="threads=1000000") as e:
        poslens.scan(str(tiny), data=torch.randint(3, 60, (2, 8)), threads=10**6, progress=False)
    assert "\n" not in str(e.value) and tree(tmp_path) == before
