"""Conversions between identifier naming styles.

Words are found by splitting on anything that is not an ASCII letter or digit
and on case changes, keeping runs of capitals together as acronyms:
``"parseHTTPResponse2"`` splits into ``["parse", "HTTP", "Response", "2"]``.
"""

import re

_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def split_words(text: str) -> list[str]:
    """Split an identifier or phrase into its words."""
    words: list[str] = []
    for chunk in _SEPARATORS.split(text):
        words.extend(_WORD.findall(chunk))
    return words


def snake_case(text: str) -> str:
    """``"Parse HTTP response"`` -> ``"parse_http_response"``."""
    return "_".join(word.lower() for word in split_words(text))


def kebab_case(text: str) -> str:
    """``"Parse HTTP response"`` -> ``"parse-http-response"``."""
    return "-".join(word.lower() for word in split_words(text))


def constant_case(text: str) -> str:
    """``"parse http response"`` -> ``"PARSE_HTTP_RESPONSE"``."""
    return "_".join(word.upper() for word in split_words(text))


def pascal_case(text: str) -> str:
    """``"parse_http_response"`` -> ``"ParseHttpResponse"``."""
    return "".join(word.capitalize() for word in split_words(text))


def camel_case(text: str) -> str:
    """``"parse_http_response"`` -> ``"parseHttpResponse"``."""
    words = split_words(text)
    first = words[0].lower()
    return first + "".join(word.capitalize() for word in words[1:])
