"""Typed access to parsed configuration."""

from .parser import parse

_MISSING = object()
_BOOLEANS = {
    "1": True, "yes": True, "true": True, "on": True,
    "0": False, "no": False, "false": False, "off": False,
}


class Config:
    """Configuration read from INI-style text.

    Every getter takes an optional *fallback*, returned when the option (or
    its whole section) is absent.  Without a fallback a missing option raises
    :class:`KeyError`.
    """

    def __init__(self, data: dict[str, dict[str, str]] | None = None):
        self._data = {
            name: {key.lower(): value for key, value in options.items()}
            for name, options in (data or {}).items()
        }

    @classmethod
    def from_string(cls, text: str) -> "Config":
        return cls(parse(text))

    @classmethod
    def from_file(cls, path, encoding: str = "utf-8") -> "Config":
        with open(path, encoding=encoding) as handle:
            return cls.from_string(handle.read())

    def sections(self) -> list[str]:
        return list(self._data)

    def has_section(self, section: str) -> bool:
        return section in self._data

    def has_option(self, section: str, key: str) -> bool:
        return key.lower() in self._data.get(section, {})

    def options(self, section: str) -> list[str]:
        return list(self._data[section])

    def get(self, section: str, key: str, fallback=_MISSING) -> str:
        """Return the raw string value of *key* in *section*."""
        try:
            options = self._data[section]
        except KeyError:
            raise KeyError(f"no section {section!r}") from None
        key = key.lower()
        if key in options:
            return options[key]
        if fallback is _MISSING:
            raise KeyError(f"no option {key!r} in section {section!r}")
        return fallback

    def _converted(self, section, key, fallback, convert, what):
        if fallback is not _MISSING and not self.has_option(section, key):
            return fallback
        raw = self.get(section, key)
        try:
            return convert(raw)
        except ValueError:
            raise ValueError(f"{section}.{key}: expected {what}, got {raw!r}") from None

    def getint(self, section: str, key: str, fallback=_MISSING) -> int:
        return self._converted(section, key, fallback, int, "an integer")

    def getfloat(self, section: str, key: str, fallback=_MISSING) -> float:
        return self._converted(section, key, fallback, float, "a number")

    def getboolean(self, section: str, key: str, fallback=_MISSING) -> bool:
        def convert(raw: str) -> bool:
            try:
                return _BOOLEANS[raw.strip().lower()]
            except KeyError:
                raise ValueError(raw) from None

        return self._converted(section, key, fallback, convert, "a boolean")

    def getlist(self, section: str, key: str, fallback=_MISSING, sep=None) -> list[str]:
        """Split the value into a list.

        Items are separated by *sep* (a comma by default) or by line breaks,
        so a value continued over several lines gives one item per line.
        Items are stripped and empty items are dropped.
        """

        def convert(raw: str) -> list[str]:
            items = []
            for line in raw.splitlines():
                items.extend(item.strip() for item in line.split(sep))
            return [item for item in items if item]

        return self._converted(section, key, fallback, convert, "a list")

    def as_dict(self) -> dict[str, dict[str, str]]:
        return {name: dict(options) for name, options in self._data.items()}
