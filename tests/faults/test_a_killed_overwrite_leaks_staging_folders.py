"""Cause: a process killed (SIGKILL) during ``--overwrite`` left its staging folders beside OUT
(``.OUT.partial-*``, one holding a checkpoint, and ``.OUT.previous-*``), and no later run removed them.
A staging folder's name now says which process owns it; the next write of the run removes those whose
process is gone, and keeps those of a live one."""

from __future__ import annotations

import os
import subprocess
import sys

from poslens.rundir.staging import _STAGE, _make_stage, stage_prefix

from faultkit import SCAN


def _dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(p.stdout)


def _leftover(out, kind, pid, tail):
    d = out.parent / stage_prefix(out, kind).replace(f"-{os.getpid()}@", f"-{pid}@")
    d = d.with_name(d.name + tail)
    d.mkdir()
    (d / "checkpoint.safetensors").write_bytes(b"x" * 100)
    return d


def test_the_next_overwrite_sweeps_what_a_killed_one_left(cli, tiny, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("scan", tiny, "--out", out, *SCAN)
    assert code == 0, err
    dead = _dead_pid()
    stale = [_leftover(out, "partial", dead, "abcd1234"), _leftover(out, "previous", dead, "efgh5678")]
    live = _leftover(out, "partial", 1, "ijkl9012")  # pid 1 runs: its owner may still be writing
    other = tmp_path / ".other.partial-abcdefgh"  # another run's, in the old unnamed form
    other.mkdir()
    code, _, err = cli("scan", tiny, "--out", out, *SCAN, "--overwrite")
    assert code == 0, err
    assert not any(p.exists() for p in stale)
    assert live.is_dir() and other.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "run"])


def test_poslens_names_its_stages_by_their_owner(tmp_path):
    stage = _make_stage(tmp_path / "run")
    m = _STAGE.match(stage.name)
    assert m and m["run"] == "run" and m["kind"] == "partial" and int(m["pid"]) == os.getpid()
