"""URL slug generation."""

import re
import unicodedata

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def _to_ascii(text: str) -> str:
    """Reduce *text* to ASCII, dropping what has no ASCII form."""
    normalized = unicodedata.normalize("NFC", text)
    return normalized.encode("ascii", "ignore").decode("ascii")


def slugify(text: str, sep: str = "-", max_length: int | None = None) -> str:
    """Turn *text* into a lowercase ASCII slug.

    Accented letters are reduced to their base letter ("é" becomes "e"), every
    run of characters that is not a letter or a digit becomes a single *sep*,
    and separators at either end are removed.  Characters without any ASCII
    counterpart (CJK, emoji, ...) are dropped.

    When *max_length* is given the slug is shortened to at most *max_length*
    characters, cutting at a separator when possible so that words are kept
    whole.
    """
    if not sep:
        raise ValueError("sep must not be empty")
    ascii_text = _to_ascii(text).lower()
    slug = _NON_ALNUM.sub(sep, ascii_text).strip(sep)
    if max_length is not None and len(slug) > max_length:
        head = slug[: max_length + len(sep)]
        if sep in head:
            slug = head[: head.rindex(sep)]
        else:
            slug = slug[:max_length]
        slug = slug.strip(sep)
    return slug
