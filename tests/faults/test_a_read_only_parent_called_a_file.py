"""Cause: ``--out`` under a directory that cannot be written was described as "(a file)" whatever it was,
so a directory on a read-only file system was called a file (``scan``, ``train``). The line says what
the parent is: a directory on a read-only file system, one this user may not write, or a file."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from faultkit import SCAN, one_error


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """``tmp_path/ro``: a directory that looks as on a read-only file system (root writes anywhere else)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    access, statvfs = os.access, os.statvfs
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if os.fspath(p) == str(ro) and mode == os.W_OK
                        else access(p, mode, **k))
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_flag=os.ST_RDONLY) if os.fspath(p) == str(ro)
                        else statvfs(p))
    return ro


def test_scan_says_read_only_file_system(cli, tiny, read_only):
    code, _, err = cli("scan", tiny, "--out", read_only / "run", *SCAN)
    msg = one_error(code, err, str(read_only / "run"), "read-only file system", "writable")
    assert "a file" not in msg
    assert list(read_only.iterdir()) == []


def test_train_says_read_only_file_system(cli, read_only):
    code, _, err = cli("train", "--out", read_only / "m", "--preset", "micro", "--steps", "1", "--quiet")
    msg = one_error(code, err, str(read_only / "m"), "read-only file system")
    assert "a file" not in msg
    assert list(read_only.iterdir()) == []


def test_a_parent_that_is_a_file_is_still_called_a_file(cli, tiny, tmp_path):
    (tmp_path / "f").write_text("x")
    code, _, err = cli("scan", tiny, "--out", tmp_path / "f" / "run", *SCAN)
    msg = one_error(code, err, "a file")
    assert "read-only" not in msg
