"""Formatting of second counts as durations."""

from .duration import UNIT_SECONDS

_NAMES = {"w": "week", "d": "day", "h": "hour", "m": "minute", "s": "second"}


def _split(seconds: int) -> tuple[str, list[tuple[str, int]]]:
    sign = "-" if seconds < 0 else ""
    remaining = int(seconds)
    parts = []
    for unit, size in UNIT_SECONDS.items():
        count, remaining = divmod(remaining, size)
        if count:
            parts.append((unit, count))
    return sign, parts


def format_duration(seconds: int, max_units: int | None = None) -> str:
    """Format *seconds* compactly, e.g. ``5400`` -> ``"1h30m"``.

    This is the inverse of :func:`unitconv.parse_duration`.  Zero is
    ``"0s"``; negative values get a leading ``-``.  *max_units* keeps only the
    largest units (``format_duration(93784, max_units=2) == "1d2h"``).
    """
    if seconds == 0:
        return "0s"
    sign, parts = _split(seconds)
    if max_units is not None:
        parts = parts[:max_units]
    return sign + "".join(f"{count}{unit}" for unit, count in parts)


def humanize_duration(seconds: int) -> str:
    """Format *seconds* for people, e.g. ``3661`` -> ``"1 hour, 1 minute, 1 second"``."""
    if seconds == 0:
        return "0 seconds"
    sign, parts = _split(seconds)
    words = []
    for unit, count in parts:
        name = _NAMES[unit] + ("" if count == 1 else "s")
        words.append(f"{count} {name}")
    return sign + ", ".join(words)
