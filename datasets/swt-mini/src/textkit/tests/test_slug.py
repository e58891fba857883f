import pytest

from textkit import slugify


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_collapses_runs_of_punctuation():
    assert slugify("a -- b __ c") == "a-b-c"


def test_strips_separators_at_ends():
    assert slugify("  --Hello there--  ") == "hello-there"


def test_custom_separator():
    assert slugify("Release notes 2024", sep="_") == "release_notes_2024"


def test_digits_are_kept():
    assert slugify("Top 10 tips for 2024") == "top-10-tips-for-2024"


def test_characters_without_ascii_form_are_dropped():
    assert slugify("\u6771\u4eac guide") == "guide"


def test_max_length_cuts_at_word_boundary():
    assert slugify("the quick brown fox", max_length=12) == "the-quick"


def test_max_length_exactly_at_boundary():
    assert slugify("the quick brown fox", max_length=15) == "the-quick-brown"


def test_max_length_single_long_word():
    assert slugify("supercalifragilistic", max_length=5) == "super"


def test_empty_separator_rejected():
    with pytest.raises(ValueError):
        slugify("abc", sep="")
