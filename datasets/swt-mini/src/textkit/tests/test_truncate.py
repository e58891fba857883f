import pytest

from textkit import truncate, truncate_words


def test_short_text_unchanged():
    assert truncate("short", 10) == "short"


def test_truncate_adds_ellipsis():
    assert truncate("A rather long sentence", 10) == "A rather\u2026"


def test_truncate_custom_suffix():
    assert truncate("abcdefghij", 6, suffix="...") == "abc..."


def test_width_smaller_than_suffix():
    with pytest.raises(ValueError):
        truncate("abcdef", 2, suffix="...")


def test_truncate_words():
    assert truncate_words("one two three four", 2) == "one two\u2026"


def test_truncate_words_not_needed():
    assert truncate_words("one  two", 5) == "one two"


def test_truncate_words_negative_count():
    with pytest.raises(ValueError):
        truncate_words("a b", -1)
