"""Range lists such as ``"1-3,5,8-10"``."""

from .interval import Interval
from .intervalset import IntervalSet


def parse_ranges(text: str) -> IntervalSet:
    """Parse a comma-separated list of integers and ``a-b`` ranges.

    Whitespace around items is ignored, empty items are skipped and numbers
    may be negative (``"-5--2,0"``).  Raises :class:`ValueError` on bad input.
    """
    result = IntervalSet()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        start_text, dash, end_text = item.partition("-")
        try:
            start = int(start_text)
            end = int(end_text) if dash else start
            result.add(Interval(start, end))
        except ValueError:
            raise ValueError(f"invalid range: {item!r}") from None
    return result


def format_ranges(ranges: IntervalSet) -> str:
    """The inverse of :func:`parse_ranges`: ``"1-3,5,8-10"``."""
    return ",".join(str(interval) for interval in ranges)
