from cdc_dagster.text import shorten


def test_short_text_is_kept_on_one_line() -> None:
    assert shorten("a  b\nc", 10) == "a b c"


def test_long_text_is_cut_after_a_word_and_says_how_much_was_left_out() -> None:
    text = "Parquet magic bytes not found in footer. Either the file is corrupted or this is not"
    out = shorten(text, 50)
    assert out == "Parquet magic bytes not found in footer. Either ... [37 more characters]"
    assert len(text) - len("Parquet magic bytes not found in footer. Either") == 37


def test_one_long_word_is_cut_at_the_limit() -> None:
    assert shorten("x" * 30, 10) == "x" * 10 + " ... [20 more characters]"
