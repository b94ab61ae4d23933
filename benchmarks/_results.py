"""Where a benchmark's numbers go, and the metadata that says which run they come from.

Each benchmark writes one file, ``benchmarks/results_<name>.json``, and a new run overwrites it
(git keeps the earlier ones). :func:`meta` is the run's date, arguments, machine and commit:
the only place a result is dated.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def default_path(name: str) -> str:
    """``benchmarks/results_<name>.json``."""
    return os.path.join(HERE, f"results_{name}.json")


def wanted(path: str | None) -> str | None:
    """The output path, or None where the user asked for none (``--json none``)."""
    return None if path in (None, "", "none") else path


def meta() -> dict:
    """The run's date (UTC), command-line arguments, CPU model, torch version and commit."""
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=HERE, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        commit = None
    torch = sys.modules.get("torch")
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv[1:],
            "machine": f"{cpu or platform.machine()}, {os.cpu_count()} CPUs",
            "torch": getattr(torch, "__version__", None), "commit": commit}
