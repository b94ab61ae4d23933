"""The CLI's allocator settings: freed activations are reused instead of unmapped and faulted in again."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from poslens import runtime

SRC = os.path.abspath(os.path.join(os.path.dirname(runtime.__file__), ".."))

# A 64 MiB tensor written and freed, then another, ten times over: the page faults of the last
# rounds. Under glibc's defaults every one is a fresh mmap (16,384 pages of 4 KiB fault in each
# time); with the settings the heap settles after a few rounds (posix_memalign's slack) and the
# freed block is reused: nothing faults.
PROBE = """
import resource, torch
def rounds():
    x = torch.empty(1 << 24); x.fill_(1.0); del x
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = torch.empty(1 << 24); y.fill_(2.0); del y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(max([rounds() for _ in range(10)][-3:]))
"""


def _run(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD", runtime.ALLOCATOR_ENV)}
    clean.update(env, PYTHONPATH=SRC)
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("env,reason", [
    ({}, None),
    ({"POSLENS_MALLOC": "system"}, "POSLENS_MALLOC=system"),
    ({"POSLENS_MALLOC": "Default "}, "POSLENS_MALLOC=Default "),
    ({"POSLENS_MALLOC": "poslens"}, None),
    ({"MALLOC_ARENA_MAX": "2"}, "a MALLOC_* variable is set"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "GLIBC_TUNABLES sets malloc"),
    ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, None),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "another allocator is preloaded"),
    ({"LD_PRELOAD": "/usr/lib/libfoo.so"}, None),
])
def test_user_choices_leave_the_allocator_alone(env, reason, monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    assert runtime.allocator_left_alone(env) == reason
    if reason is not None:
        assert runtime.configure_allocator(env) is False


def test_not_linux_is_left_alone(monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    assert runtime.allocator_left_alone({}) == "not Linux"
    assert runtime.configure_allocator({}) is False


glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                           reason="glibc's mallopt")


@glibc
def test_freed_memory_is_reused_after_configure_allocator():
    default = int(_run(PROBE))
    configured = _run("from poslens.runtime import configure_allocator; print(configure_allocator())\n" + PROBE)
    took, faults = configured.splitlines()
    assert took == "True"
    assert default > 8000  # 64 MiB faulted in again: the fresh mmap of glibc's defaults
    assert int(faults) < 100  # the freed block reused: nothing to fault in


@glibc
def test_the_cli_applies_it_and_the_user_can_opt_out():
    entry = ("import contextlib, io, sys, poslens.cli\nsys.argv = ['poslens', '--help']\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        poslens.cli.main()\n"
             "    except SystemExit:\n        pass\n")
    assert int(_run("import poslens.cli\n" + PROBE)) > 8000  # importing the CLI changes nothing
    assert int(_run(entry + PROBE)) < 100  # its entry point does
    assert int(_run(entry + PROBE, POSLENS_MALLOC="system")) > 8000
    assert int(_run(entry + PROBE, MALLOC_TRIM_THRESHOLD_="131072")) > 8000
