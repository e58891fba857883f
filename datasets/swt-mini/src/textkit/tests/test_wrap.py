import pytest

from textkit import fill, wrap

TEXT = "The quick brown fox jumps over the lazy dog"


def test_wrap_simple():
    assert wrap(TEXT, 16) == ["The quick brown", "fox jumps over", "the lazy dog"]


def test_wrap_collapses_whitespace():
    assert wrap("one   two\n\tthree", 70) == ["one two three"]


def test_wrap_empty_text():
    assert wrap("", 10) == []
    assert wrap("   \n ", 10) == []


def test_long_word_gets_its_own_line():
    assert wrap("a supercalifragilistic word", 8) == ["a", "supercalifragilistic", "word"]


def test_indent():
    assert wrap(TEXT, 19, indent="> ") == [
        "> The quick brown",
        "> fox jumps over",
        "> the lazy dog",
    ]


def test_subsequent_indent():
    assert wrap(TEXT, 19, indent="- ", subsequent_indent="  ") == [
        "- The quick brown",
        "  fox jumps over",
        "  the lazy dog",
    ]


def test_fill_joins_lines():
    assert fill(TEXT, 16) == "The quick brown\nfox jumps over\nthe lazy dog"


def test_invalid_width():
    with pytest.raises(ValueError):
        wrap(TEXT, 0)
