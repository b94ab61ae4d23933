"""The planted bugs of ``benchmarks/planted_bugs.py`` stay plantable: each one's snippet still
occurs exactly once in the module it names, and each names a test file that exists (a refactor that
moves the code otherwise turns the check into a crash, or into a plant of nothing)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _plants():
    spec = importlib.util.spec_from_file_location("planted_bugs", ROOT / "benchmarks" / "planted_bugs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # defines P and main(); runs nothing
    return mod.P


@pytest.mark.parametrize("plant", _plants(), ids=lambda p: p[0].split(" ", 1)[0])
def test_each_plant_matches_once_and_names_real_tests(plant):
    name, module, old, new, tests = plant
    text = (ROOT / "src" / module).read_text()
    assert text.count(old) == 1, f"plant {name!r}: its snippet occurs {text.count(old)} times in {module}"
    assert old != new
    assert (ROOT / "tests" / tests).is_file()
