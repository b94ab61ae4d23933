import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# The suite checks the CPU's semantics (CI has no GPU): `--device auto` means the CPU here even on a GPU
# machine (exact resume and the simulator's random stream are per device). Tests of the CUDA paths ask
# for cuda themselves; `POSLENS_DEVICE=auto pytest` runs every command's default path on a visible GPU.
os.environ.setdefault("POSLENS_DEVICE", "cpu")
# One thread: tests use tiny tensors, and on a shared 2-core machine two OpenMP threads can
# stall each other when another process is busy.
torch.set_num_threads(1)


def run_cli(*args):
    """Invoke the poslens CLI in-process through ``poslens.cli.main`` (its own error handling: a
    ``PoslensError`` becomes one ``poslens: error:`` line on stderr and exit code 2); returns
    ``(exit_code, stdout, stderr)`` with stderr's trailing newline removed. The same error paths
    are run in real subprocesses in tests/test_cli_errors.py."""
    import contextlib
    import io
    import signal

    from poslens.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_term = signal.getsignal(signal.SIGTERM)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main([str(a) for a in args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        signal.signal(signal.SIGTERM, old_term)  # main() installs its own SIGTERM handler
        torch.set_num_threads(1)  # a command's --threads holds for its process; tests keep one thread
    return code, out.getvalue(), err.getvalue().rstrip("\n")


@pytest.fixture
def cli():
    """:func:`run_cli`, for tests that take it as a fixture."""
    return run_cli
