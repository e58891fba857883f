"""Exceptions raised by inicfg."""


class ParseError(ValueError):
    """Raised for malformed input.

    ``lineno`` is the 1-based number of the offending line and ``line`` its
    text.
    """

    def __init__(self, message: str, lineno: int, line: str):
        super().__init__(f"line {lineno}: {message}: {line.strip()!r}")
        self.message = message
        self.lineno = lineno
        self.line = line
