import pytest

from unitconv import convert_temperature


def test_celsius_to_fahrenheit():
    assert convert_temperature(100, "C", "F") == pytest.approx(212.0)


def test_fahrenheit_to_celsius():
    assert convert_temperature(-40, "F", "C") == pytest.approx(-40.0)


def test_celsius_to_kelvin():
    assert convert_temperature(25, "C", "K") == pytest.approx(298.15)


def test_fahrenheit_to_kelvin():
    assert convert_temperature(32, "F", "K") == pytest.approx(273.15)


def test_same_unit():
    assert convert_temperature(300, "K", "K") == 300.0


def test_unit_names():
    assert convert_temperature(0, "celsius", "Fahrenheit") == pytest.approx(32.0)


def test_unknown_unit():
    with pytest.raises(ValueError):
        convert_temperature(1, "C", "R")


def test_below_absolute_zero():
    with pytest.raises(ValueError):
        convert_temperature(-300, "C", "F")
