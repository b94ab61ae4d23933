"""Cause: huge counts were accepted, and memory grew without limit (``ablate --num-seqs 10^20`` reached
12.8 GB); ``scan`` and ``fingerprint`` left ``config.json`` and ``scans/`` behind. A count whose work or
memory cannot fit is refused before anything is allocated or written, in one line naming the input and
its bound; and SIGINT ends a run even when a shell started it with SIGINT ignored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import one_error

import poslens
from poslens.conventions import MAX_COUNT
from poslens.errors import PoslensError

HUGE = "100000000000000000000"


@pytest.mark.parametrize("args,flag", [
    (["ablate", "{m}", "--data", "random", "--seq-len", "16", "--num-seqs", HUGE], "--num-seqs"),
    (["ablate", "{m}", "--data", "random", "--seq-len", "64", "--num-seqs", str(MAX_COUNT)], "--num-seqs"),  # held
    (["scan", "{m}", "--data", "random", "--seq-len", "16", "--num-seqs", HUGE], "--num-seqs"),
    (["fingerprint", "{m}", "--seq-len", "16", "--num-seqs", HUGE], "--num-seqs"),
    (["simulate", "--samples", HUGE], "--samples"),
    (["demo", "--samples", HUGE], "--samples"),
    (["reproduce", "kim-fig1", "--samples", HUGE], "--samples"),
    (["train", "--pe", "none", "--preset", "tiny", "--task", "copy", "--steps", "2", "--batch-size", HUGE],
     "--batch-size"),
])
def test_a_huge_count_is_refused_before_anything_is_written(cli, tiny, tmp_path, args, flag):
    out = tmp_path / "out"
    code, _, err = cli(*[a.format(m=tiny) for a in args], "--out", out, "--quiet")
    line = one_error(code, err, flag)
    assert any(f"{n:,}" in line for n in (MAX_COUNT, 2**28)), line  # the bound it is held to
    assert not out.exists()


def test_the_api_refuses_a_huge_num_seqs(tiny, tmp_path):
    with pytest.raises(PoslensError) as e:
        poslens.scan(str(tiny), data="random", seq_len=8, num_seqs=10**20, progress=False, threads=1,
                     out=tmp_path / "r")
    msg = str(e.value)
    assert "100000000000000000000" in msg and f"{MAX_COUNT:,}" in msg and not (tmp_path / "r").exists()


def test_sigint_ends_a_run_started_with_sigint_ignored(tiny, tmp_path):
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = tmp_path / "o"
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the child, as `cmd &` in a script gives it
    try:
        p = subprocess.Popen([sys.executable, "-m", "poslens", "ablate", str(tiny), "--data", "random", "--seq-len",
                              "16", "--num-seqs", "10000000", "--out", str(out), "--threads", "1"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, old)
    time.sleep(8)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("SIGINT did not end the run")
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err.splitlines()[-1] and not out.exists()
