import pytest

from unitconv import convert_length, parse_length


def test_feet_to_centimeters():
    assert convert_length(3, "ft", "cm") == 91.44


def test_miles_to_kilometers():
    assert convert_length(1, "mi", "km") == 1.609344


def test_same_unit():
    assert convert_length(7, "m", "m") == 7


def test_unit_names_and_plurals():
    assert convert_length(2, "feet", "inch") == 24
    assert convert_length(1500, "metres", "kilometers") == 1.5


def test_unknown_unit():
    with pytest.raises(ValueError):
        convert_length(1, "furlong", "m")


def test_parse_length():
    assert parse_length("12.5cm") == 0.125


def test_parse_length_target_unit():
    assert parse_length("5 ft", "in") == 60


def test_parse_length_invalid():
    with pytest.raises(ValueError):
        parse_length("five feet")
