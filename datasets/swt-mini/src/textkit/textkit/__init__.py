"""textkit: small string helpers."""

from .case import (
    camel_case,
    constant_case,
    kebab_case,
    pascal_case,
    snake_case,
    split_words,
)
from .slug import slugify
from .truncate import truncate, truncate_words
from .wrap import fill, wrap

__all__ = [
    "camel_case",
    "constant_case",
    "fill",
    "kebab_case",
    "pascal_case",
    "slugify",
    "snake_case",
    "split_words",
    "truncate",
    "truncate_words",
    "wrap",
]

__version__ = "0.1.0"
