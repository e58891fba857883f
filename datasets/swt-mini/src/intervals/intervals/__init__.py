"""intervals: integer range sets."""

from .interval import Interval
from .intervalset import IntervalSet
from .parse import format_ranges, parse_ranges

__all__ = ["Interval", "IntervalSet", "format_ranges", "parse_ranges"]

__version__ = "0.1.0"
