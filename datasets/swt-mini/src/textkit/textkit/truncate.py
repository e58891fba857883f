"""Shortening text for display."""

ELLIPSIS = "\u2026"


def truncate(text: str, width: int, suffix: str = ELLIPSIS) -> str:
    """Shorten *text* to at most *width* characters, suffix included.

    Text that already fits is returned unchanged.  Trailing whitespace before
    the suffix is removed.
    """
    if width < len(suffix):
        raise ValueError("width is smaller than the suffix")
    if len(text) <= width:
        return text
    return text[: width - len(suffix)].rstrip() + suffix


def truncate_words(text: str, count: int, suffix: str = ELLIPSIS) -> str:
    """Keep the first *count* words of *text*, appending *suffix* if cut."""
    if count < 0:
        raise ValueError("count must not be negative")
    words = text.split()
    if len(words) <= count:
        return " ".join(words)
    return " ".join(words[:count]) + suffix
