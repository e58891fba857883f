import pytest

from unitconv import parse_duration


def test_bare_seconds():
    assert parse_duration("90") == 90


def test_hours_and_minutes():
    assert parse_duration("1h30m") == 5400


def test_all_units():
    assert parse_duration("1w1d1h1m1s") == 604800 + 86400 + 3600 + 60 + 1


def test_spaces_between_parts():
    assert parse_duration(" 2d 4h ") == 2 * 86400 + 4 * 3600


def test_fractional_part():
    assert parse_duration("1.5h") == 5400


def test_negative_single_unit():
    assert parse_duration("-45s") == -45


def test_negative_bare_seconds():
    assert parse_duration("-30") == -30


def test_empty_rejected():
    with pytest.raises(ValueError):
        parse_duration("   ")


def test_garbage_rejected():
    with pytest.raises(ValueError):
        parse_duration("1 hour")
