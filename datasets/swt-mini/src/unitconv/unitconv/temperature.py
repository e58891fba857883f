"""Temperature conversion between Celsius, Fahrenheit and Kelvin."""

ABSOLUTE_ZERO_C = -273.15

_UNIT_NAMES = {
    "c": "C", "celsius": "C", "\u00b0c": "C",
    "f": "F", "fahrenheit": "F", "\u00b0f": "F",
    "k": "K", "kelvin": "K",
}


def _normalize_unit(unit: str) -> str:
    try:
        return _UNIT_NAMES[unit.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown temperature unit: {unit!r}") from None


def _to_celsius(value: float, unit: str) -> float:
    if unit == "C":
        return value
    if unit == "F":
        return (value - 32) * 5 / 9
    return value + 273.15


def _from_celsius(value: float, unit: str) -> float:
    if unit == "C":
        return value
    if unit == "F":
        return value * 9 / 5 + 32
    return value + 273.15


def convert_temperature(value: float, from_unit: str, to_unit: str) -> float:
    """Convert *value* from *from_unit* to *to_unit*.

    Units are ``"C"``, ``"F"`` and ``"K"`` (case-insensitive; full names such as
    ``"celsius"`` are accepted too).  Temperatures below absolute zero raise
    :class:`ValueError`.
    """
    source = _normalize_unit(from_unit)
    target = _normalize_unit(to_unit)
    celsius = _to_celsius(float(value), source)
    if celsius < ABSOLUTE_ZERO_C:
        raise ValueError(f"{value} {source} is below absolute zero")
    if source == target:
        return float(value)
    return _from_celsius(celsius, target)
