"""A damaged kernel cache never kills a run: the cached C library is checked against its record
before it is loaded and built again when it does not match; the cache stays clean (no temporary
files after a killed compilation, mode 0755, a failing compiler remembered)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from poslens import native

from faultkit import SCAN

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler")

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """An empty kernel cache for this test (the process's loaded library forgotten, restored after)."""
    monkeypatch.setenv("POSLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(native.KERNEL_ENV, raising=False)
    monkeypatch.setattr(native, "_state", {})
    return tmp_path / "cache" / "native"


def _env(cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "POSLENS_CACHE": str(cache.parent), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg", "POSLENS_DEVICE": "cpu"}


def _scan(model: Path, out: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poslens", "scan", str(model), "--out", str(out), *SCAN],
                          env=_env(cache), capture_output=True, text=True, timeout=300)


def test_a_truncated_library_is_rebuilt_and_the_scan_gives_the_same_maps(cache, tiny, tmp_path):
    """Cause 4: a cut-short cached library (20,000, 14,004 or 4,096 bytes) used to end every scan with
    SIGBUS; it is rebuilt, with one warning line, and the maps are the same."""
    from safetensors.torch import load_file

    first = _scan(tiny, tmp_path / "a", cache)
    assert first.returncode == 0, first.stderr
    lib = native.library_path(native._compiler())
    whole = lib.read_bytes()
    maps = load_file(str(tmp_path / "a" / "maps.safetensors"))
    for i, size in enumerate((20000, 14004, 4096)):
        lib.write_bytes(whole[:size])
        p = _scan(tiny, tmp_path / f"b{i}", cache)
        assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
        warnings = [line for line in p.stderr.splitlines() if line.startswith("poslens: warning:")]
        assert len(warnings) == 1 and str(lib) in warnings[0], p.stderr
        assert lib.read_bytes() == whole
        again = load_file(str(tmp_path / f"b{i}" / "maps.safetensors"))
        assert again.keys() == maps.keys() and all(torch.equal(again[k], maps[k]) for k in maps)


def test_a_changed_library_is_never_loaded(cache, monkeypatch):
    """Cause 4: 16 flipped bytes of code (SIGILL) do not match the record: rebuilt before loading."""
    lib = native.library_path(native._compiler())
    native._build(native._compiler(), lib)  # built, not loaded: this process maps no copy of it
    data = bytearray(lib.read_bytes())
    data[len(data) // 2:len(data) // 2 + 16] = bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 16])
    lib.write_bytes(bytes(data))
    loaded = []
    real = native.ctypes.CDLL
    monkeypatch.setattr(native.ctypes, "CDLL", lambda p, *a, **k: loaded.append(Path(p).read_bytes()) or real(p))
    monkeypatch.setattr(native, "_state", {})
    with pytest.warns(native.PoslensWarning, match="does not match its record"):
        assert native.available()
    assert loaded and loaded[0] != bytes(data) and native._intact(lib)


def test_the_library_is_installed_0755_with_its_record(cache):
    """Cause 5: another user of a shared cache can load it."""
    assert native.available()
    lib = native.library_path(native._compiler())
    assert lib.stat().st_mode & 0o777 == 0o755
    rec = json.loads(native.record_path(lib).read_text())
    assert rec["size"] == lib.stat().st_size and rec["sha256"] == native._sha256(lib)
    assert sorted(p.name for p in cache.iterdir()) == sorted([lib.name, native.record_path(lib).name])


def test_a_killed_compilation_leaves_no_temporary_file(cache, tmp_path):
    """Cause 5: SIGKILL during compilation used to leave a 0-byte tmp*.so forever; the next process
    removes it."""
    slow = tmp_path / "slowcc"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    env = {**_env(cache), "CC": str(slow)}
    p = subprocess.Popen([sys.executable, "-c", "from poslens import native; native.available()"], env=env)
    t0 = time.time()
    while not (cache.is_dir() and any(cache.iterdir())):
        assert time.time() - t0 < 60 and p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    (cache / "tmpabc123.so").write_bytes(b"")  # what a compilation killed under the older naming left
    assert any(cache.iterdir())
    assert native.available()
    lib = native.library_path(native._compiler())
    assert sorted(q.name for q in cache.iterdir()) == sorted([lib.name, native.record_path(lib).name])


def test_a_failing_compiler_is_remembered(cache, tmp_path, monkeypatch):
    """Cause 5: a compiler that fails (or hangs until the timeout) is not run again by every new
    process: the failure is remembered beside the library, keyed like it."""
    calls = tmp_path / "calls"
    bad = tmp_path / "badcc"
    bad.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'no such flag' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("CC", str(bad))
    assert not native.available()
    assert "no such flag" in native.status()
    for _ in range(2):
        monkeypatch.setattr(native, "_state", {})
        assert not native.available()
        assert "remembered" in native.status()
    assert calls.read_text().count("x") == 1
    assert native.failure_path(native.library_path(str(bad))).is_file()
    monkeypatch.setattr(native, "COMPILE_TIMEOUT", 0.5)  # a hanging compiler counts as failed, remembered too
    hang = tmp_path / "hangcc"
    hang.write_text("#!/bin/sh\nsleep 20\n")
    hang.chmod(0o755)
    monkeypatch.setenv("CC", str(hang))
    monkeypatch.setattr(native, "_state", {})
    assert not native.available() and "did not finish" in native.status()
    assert native.failure_path(native.library_path(str(hang))).is_file()


def test_a_bad_kernel_setting_is_one_error(cli, tiny, tmp_path, monkeypatch):
    """Cause 17: POSLENS_CAPTURE_KERNEL=garbage is refused before anything is written."""
    from faultkit import one_error

    monkeypatch.setenv(native.KERNEL_ENV, "garbage")
    code, _, err = cli("scan", tiny, "--out", tmp_path / "o", *SCAN)
    one_error(code, err, native.KERNEL_ENV)
    assert not (tmp_path / "o").exists()
