"""Closed integer intervals."""

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    """The integers from ``start`` to ``end``, both included."""

    start: int
    end: int

    def __post_init__(self):
        if not isinstance(self.start, int) or not isinstance(self.end, int):
            raise TypeError("interval bounds must be integers")
        if self.start > self.end:
            raise ValueError(f"start {self.start} is greater than end {self.end}")

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __iter__(self):
        return iter(range(self.start, self.end + 1))

    def __str__(self) -> str:
        if self.start == self.end:
            return str(self.start)
        return f"{self.start}-{self.end}"

    def contains(self, item) -> bool:
        """True if *item*, an integer or an :class:`Interval`, lies inside."""
        return self.start <= item <= self.end

    def __contains__(self, item) -> bool:
        return self.contains(item)

    def overlaps(self, other: "Interval") -> bool:
        """True if the two intervals share at least one integer."""
        return self.start <= other.end and other.start <= self.end

    def is_adjacent(self, other: "Interval") -> bool:
        """True if *other* starts right after this one ends, or the reverse.

        ``Interval(1, 3)`` and ``Interval(4, 6)`` are adjacent: together they
        cover 1..6 without a gap and without sharing an integer.
        """
        return self.end == other.start or other.end == self.start

    def intersection(self, other: "Interval") -> "Interval | None":
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def hull(self, other: "Interval") -> "Interval":
        """The smallest interval covering both."""
        return Interval(min(self.start, other.start), max(self.end, other.end))
