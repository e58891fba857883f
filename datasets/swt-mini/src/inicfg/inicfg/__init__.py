"""inicfg: a tiny INI-style configuration reader."""

from .config import Config
from .errors import ParseError
from .parser import parse

__all__ = ["Config", "ParseError", "parse"]

__version__ = "0.1.0"
