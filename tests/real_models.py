"""The real pretrained test models (``poslens models fetch``) for the tests that read them: their GGUF
file, or a skip that says how to get it."""

from __future__ import annotations

import pytest

from poslens.models import realmodels


def real_model_file(name: str):
    """The cached GGUF file of real model ``name``; skips the test where it is absent."""
    p = realmodels.path(name)
    if p is None:
        pytest.skip(f"real model {name} absent: run `python -m poslens models fetch` (or set POSLENS_REAL_MODELS "
                    "to a directory holding its .gguf file)")
    return p
