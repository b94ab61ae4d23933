"""Cause: an option's error was written once, as the CLI's flag, so ``poslens.scan(m, seq_len=0)`` said
"--seq-len 0"; and the one error of a weights file said "not a GGUF model" of a pickle checkpoint. One
error type (:class:`poslens.errors.OptionError`) carries both spellings of the option, and each face
prints its own: Python the keyword (``seq_len=0``), the CLI the flag (``--seq-len 0``)."""

from __future__ import annotations

import pytest
import torch

import poslens
from poslens.errors import OptionError, PoslensError

from faultkit import SCAN, one_error, tree


def _without(args, flag):
    i = args.index(flag)
    return args[:i] + args[i + 2:]


@pytest.mark.parametrize("kw,keyword,flag", [
    ({"seq_len": 0}, "seq_len=0", "--seq-len"),
    ({"num_seqs": 0}, "num_seqs=0", "--num-seqs"),
    ({"batch_size": 0}, "batch_size=0", "--batch-size"),
    ({"layers": [7]}, "layers=[7]", "--layers"),
])
def test_python_names_the_keyword(tiny, tmp_path, kw, keyword, flag):
    before = tree(tmp_path)
    with pytest.raises(PoslensError) as e:
        poslens.scan(str(tiny), data="random", **{"seq_len": 8, "num_seqs": 2, **kw}, progress=False, threads=1)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(keyword) and flag not in msg, msg
    assert tree(tmp_path) == before


def test_python_names_the_keywords_of_the_fix(tiny):
    with pytest.raises(PoslensError) as e:  # the tiny model's trained context is 64 positions
        poslens.scan(str(tiny), data="random", seq_len=100, num_seqs=2, progress=False, threads=1)
    msg = str(e.value)
    assert "\n" not in msg and "seq_len=100" in msg and "seq_len=64" in msg and "beyond_context=True" in msg, msg
    assert "--" not in msg, msg


def test_the_cli_names_the_flag(cli, tiny, tmp_path):
    code, _, err = cli("scan", tiny, "--out", tmp_path / "o", *_without(SCAN, "--seq-len"), "--seq-len", "0")
    msg = one_error(code, err, "--seq-len 0", "positive integer")
    assert "seq_len" not in msg
    code, _, err = cli("scan", tiny, "--out", tmp_path / "o", *_without(SCAN, "--seq-len"), "--seq-len", "100")
    msg = one_error(code, err, "--seq-len 100", "--seq-len 64", "--beyond-context")
    assert "seq_len" not in msg and "=True" not in msg
    assert not (tmp_path / "o").exists()


def test_one_error_both_spellings():
    e = OptionError("--num-layers", 0, "must be a positive integer; see {seq_len=4} and {rope!}.", keyword="layers")
    msg = str(e)
    assert msg == "layers=0: must be a positive integer; see seq_len=4 and rope=True."
    msg = e.cli()
    assert msg == "--num-layers 0: must be a positive integer; see --seq-len 4 and --rope."


@pytest.mark.parametrize("name", ["model.bin", "weights.pt"])
def test_a_bare_pickle_checkpoint_is_named_with_how_to_allow_it(cli, tmp_path, name):
    f = tmp_path / name
    torch.save({"w": torch.zeros(2)}, f)
    with pytest.raises(PoslensError) as e:
        poslens.scan(str(f), data="random", seq_len=8, num_seqs=2, progress=False, threads=1)
    msg = str(e.value)
    assert "\n" not in msg and name in msg and "pickle checkpoint" in msg and "allow_pickle=True" in msg, msg
    assert "GGUF" not in msg and "config.json" in msg
    code, _, err = cli("scan", f, "--out", tmp_path / "o", *SCAN)
    msg = one_error(code, err, name, "pickle checkpoint", "--allow-pickle", "config.json")
    assert "GGUF" not in msg and not (tmp_path / "o").exists()
