"""unitconv: parse and convert everyday units."""

from .duration import UNIT_SECONDS, parse_duration
from .format import format_duration, humanize_duration
from .length import convert_length, parse_length
from .temperature import convert_temperature

__all__ = [
    "UNIT_SECONDS",
    "convert_length",
    "convert_temperature",
    "format_duration",
    "humanize_duration",
    "parse_duration",
    "parse_length",
]

__version__ = "0.1.0"
