"""poslens.fmt: the one number formatter's ``missing`` text (the format itself: tests/test_contract.py)."""

from poslens.fmt import MISSING, fmt


def test_missing_text_where_a_missing_value_has_a_meaning():
    assert fmt(None, missing="flat") == "flat" and fmt(float("nan"), missing="flat") == "flat"
    assert fmt(0.25, missing="flat") == "0.25"  # numbers are unaffected
    assert fmt(None, signed=True, missing="n/a") == "n/a" and fmt(0.25, signed=True, missing="n/a") == "+0.25"
    assert fmt([0.5, None], missing="flat") == "0.5, flat"
    assert fmt(None) == MISSING
