"""Parsing of human-written durations such as ``"1h30m"`` or ``"2d 4h"``."""

import re

#: Seconds per unit, largest unit first.
UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}

_BARE = re.compile(r"[+-]?\d+")
_FULL = re.compile(r"[+-]?(?:\d+(?:\.\d+)?\s*[wdhms]\s*)+")
_PART = re.compile(r"([+-]?\d+(?:\.\d+)?)\s*([wdhms])")


def parse_duration(text: str) -> int:
    """Return the number of seconds described by *text*.

    Accepted forms are a bare integer (seconds) or a sequence of
    ``<number><unit>`` parts with units ``w d h m s``, for example ``"1h30m"``,
    ``"2d 4h"`` or ``"1.5h"``.  A leading ``-`` makes the whole duration
    negative.  Fractional results are rounded to the nearest second.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    if _BARE.fullmatch(s):
        return int(s)
    if not _FULL.fullmatch(s):
        raise ValueError(f"invalid duration: {text!r}")
    total = 0.0
    for number, unit in _PART.findall(s):
        total += float(number) * UNIT_SECONDS[unit]
    return round(total)
