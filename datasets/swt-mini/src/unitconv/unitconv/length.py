"""Length conversion between metric and imperial units."""

import re

#: Metres per unit.
METERS = {
    "mm": 0.001,
    "cm": 0.01,
    "m": 1.0,
    "km": 1000.0,
    "in": 0.0254,
    "ft": 0.3048,
    "yd": 0.9144,
    "mi": 1609.344,
}

_ALIASES = {
    "millimeter": "mm", "millimeters": "mm", "millimetre": "mm", "millimetres": "mm",
    "centimeter": "cm", "centimeters": "cm", "centimetre": "cm", "centimetres": "cm",
    "meter": "m", "meters": "m", "metre": "m", "metres": "m",
    "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km",
    "inch": "in", "inchs": "in", '"': "in",
    "foot": "ft", "feet": "ft", "'": "ft",
    "yard": "yd", "yards": "yd",
    "mile": "mi", "miles": "mi",
}

_QUANTITY = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)\s*(\S+)\s*")


def _meters_per(unit: str) -> float:
    key = unit.strip().lower()
    key = _ALIASES.get(key, key)
    try:
        return METERS[key]
    except KeyError:
        raise ValueError(f"unknown length unit: {unit!r}") from None


def convert_length(value: float, from_unit: str, to_unit: str, ndigits: int = 6) -> float:
    """Convert *value* between length units, rounded to *ndigits* decimals.

    Units may be abbreviations (``"ft"``) or names, singular or plural
    (``"foot"``, ``"feet"``, ``"metres"``).
    """
    meters = value * _meters_per(from_unit)
    return round(meters / _meters_per(to_unit), ndigits)


def parse_length(text: str, to_unit: str = "m") -> float:
    """Parse a quantity such as ``"5 ft"`` or ``"12.5cm"`` into *to_unit*."""
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"invalid length: {text!r}")
    number, unit = match.groups()
    return convert_length(float(number), unit, to_unit)
