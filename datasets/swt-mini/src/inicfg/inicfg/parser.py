"""Parsing of INI-style text into nested dictionaries.

Syntax:

* ``[name]`` starts a section; section names are case-sensitive.
* ``key = value`` or ``key: value`` sets an option; keys are lower-cased.
* Lines starting with ``#`` or ``;`` are comments.  A ``#`` or ``;`` preceded
  by whitespace starts an inline comment, so ``url = a#b`` keeps its ``#``.
* An indented line continues the value of the previous option; the parts
  are joined with newlines.
"""

from .errors import ParseError

COMMENT_PREFIXES = ("#", ";")


def _strip_inline_comment(value: str) -> str:
    for prefix in COMMENT_PREFIXES:
        if prefix in value:
            value = value[: value.index(prefix)]
    return value.rstrip()


def _split_option(stripped: str, lineno: int, line: str) -> tuple[str, str]:
    positions = [p for p in (stripped.find("="), stripped.find(":")) if p != -1]
    if not positions:
        raise ParseError("expected 'key = value'", lineno, line)
    pos = min(positions)
    key = stripped[:pos].strip().lower()
    if not key:
        raise ParseError("empty option name", lineno, line)
    value = _strip_inline_comment(stripped[pos + 1 :].strip())
    return key, value


def parse(text: str) -> dict[str, dict[str, str]]:
    """Parse *text* and return ``{section: {key: raw value}}``."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    last_key: str | None = None
    for lineno, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if not stripped or stripped.startswith(COMMENT_PREFIXES):
            continue
        if line[0].isspace() and current is not None and last_key is not None:
            current[last_key] = (current[last_key] + "\n" + stripped).lstrip("\n")
            continue
        if stripped.startswith("["):
            if not stripped.endswith("]"):
                raise ParseError("unterminated section header", lineno, line)
            name = stripped[1:-1].strip()
            if not name:
                raise ParseError("empty section name", lineno, line)
            if name in sections:
                raise ParseError(f"duplicate section {name!r}", lineno, line)
            current = sections[name] = {}
            last_key = None
            continue
        if current is None:
            raise ParseError("option outside of any section", lineno, line)
        key, value = _split_option(stripped, lineno, line)
        current[key] = value
        last_key = key
    return sections
