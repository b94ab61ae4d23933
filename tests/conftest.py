import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# One thread: tests use tiny tensors, and on a shared 2-core machine two OpenMP threads can
# stall each other (measured ~9x slower per training step under load).
torch.set_num_threads(1)


@pytest.fixture
def cli():
    """Invoke the poslens CLI in-process; returns (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from poslens.cli import app
    from poslens.errors import PoslensError

    runner = CliRunner()

    def run(*args):
        res = runner.invoke(app, [str(a) for a in args], catch_exceptions=True)
        if isinstance(res.exception, PoslensError):
            return 2, res.stdout, str(res.exception)
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            raise res.exception
        return res.exit_code, res.stdout, getattr(res, "stderr", "")

    return run
