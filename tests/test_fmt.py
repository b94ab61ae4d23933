"""poslens.fmt: the one number formatter's ``missing`` text (the format itself: tests/test_contract.py)."""

from poslens.fmt import MISSING, fmt


def test_missing_text_where_a_missing_value_has_a_meaning():
    assert fmt(None, missing="flat") == "flat" and fmt(float("nan"), missing="flat") == "flat"
    assert fmt(0.25, missing="flat") == "0.25"  # numbers are unaffected
    assert fmt(None, signed=True, missing="n/a") == "n/a" and fmt(0.25, signed=True, missing="n/a") == "+0.25"
    assert fmt([0.5, None], missing="flat") == "0.5, flat"
    assert fmt(None) == MISSING


def test_wide_table_splits_into_blocks_that_fit_80_columns_without_cutting_headers():
    import io

    from rich.console import Console

    from poslens.fmt import rich_table

    cols = ["layer.head", "best Δ", "SlashScore", "q σ1²/Σσ²", "k σ1²/Σσ²", "q eff. rank", "k eff. rank", "q n95",
            "k n95", "predicted Δ", "profile corr", "coherence", "band use high/med/low"]
    rows = [["16.0", 1, 0.776, 0.97, 0.86, 1.2, 1.5, 3, 4, 1, 0.999, 0.5, "0.14/0.0889/0.771"],
            ["11.1", 1, 0.657, 0.867, 0.944, 1.3, 1.4, 2, 3, 1, 0.98, 0.4, "0.1/0.2/0.7"]]
    title = "top heads by SlashScore over Δ = 1..16: rank-one measures of pre-RoPE q/k and the RoPE decomposition"
    buf = io.StringIO()
    Console(file=buf, width=80, force_terminal=False).print(rich_table(title, cols, rows))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    for c in cols:
        assert c in text  # every header whole, on one line
    assert text.count("layer.head") >= 2 and text.count("16.0") == text.count("layer.head")  # rows named in every block
    assert "decomposition" in text  # the title folded, not cut
