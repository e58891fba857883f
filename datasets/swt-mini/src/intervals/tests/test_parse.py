import pytest

from intervals import Interval, format_ranges, parse_ranges


def test_parse_single_numbers_and_ranges():
    assert list(parse_ranges("1-3,5,8-10")) == [Interval(1, 3), Interval(5, 5), Interval(8, 10)]


def test_parse_whitespace_and_empty_items():
    assert list(parse_ranges(" 1 - 3 , , 7 ")) == [Interval(1, 3), Interval(7, 7)]


def test_parse_merges_overlaps():
    assert list(parse_ranges("1-5,4-8")) == [Interval(1, 8)]


def test_parse_empty_string():
    assert not parse_ranges("")


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_ranges("1-3,x")


def test_parse_rejects_reversed_range():
    with pytest.raises(ValueError):
        parse_ranges("5-1")


def test_format_round_trip():
    assert format_ranges(parse_ranges("8-10,1-3,5")) == "1-3,5,8-10"
