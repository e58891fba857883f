"""Greedy word wrapping."""


def wrap(
    text: str,
    width: int = 70,
    indent: str = "",
    subsequent_indent: str | None = None,
) -> list[str]:
    """Wrap *text* into lines of at most *width* characters.

    The width includes the indentation.  Runs of whitespace, newlines
    included, are collapsed to single spaces.  A word that does not fit on a
    line by itself is put on its own line and is never split.
    *subsequent_indent* defaults to *indent*.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    if subsequent_indent is None:
        subsequent_indent = indent
    lines: list[str] = []
    current = ""
    for word in text.split():
        if not current:
            current = (subsequent_indent if lines else indent) + word
        elif len(current) + 1 + len(word) < width:
            current += " " + word
        else:
            lines.append(current)
            current = subsequent_indent + word
    if current:
        lines.append(current)
    return lines


def fill(text: str, width: int = 70, **kwargs) -> str:
    """Like :func:`wrap` but return a single string with newlines."""
    return "\n".join(wrap(text, width, **kwargs))
