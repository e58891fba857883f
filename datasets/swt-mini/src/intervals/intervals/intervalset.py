"""Sets of integers stored as sorted, disjoint intervals."""

from collections.abc import Iterable

from .interval import Interval


class IntervalSet:
    """A set of integers kept as a sorted list of disjoint intervals.

    Intervals that overlap or touch are merged, so ``{1-3} + {4-6}`` is stored
    as the single interval ``1-6``.
    """

    def __init__(self, intervals: Iterable[Interval] = ()):
        self._items: list[Interval] = []
        for interval in intervals:
            self.add(interval)

    def add(self, interval: Interval) -> None:
        merged = interval
        keep = []
        for item in self._items:
            if item.overlaps(merged):
                merged = merged.hull(item)
            else:
                keep.append(item)
        keep.append(merged)
        keep.sort()
        self._items = keep

    def remove(self, interval: Interval) -> None:
        keep = []
        for item in self._items:
            if not item.overlaps(interval):
                keep.append(item)
                continue
            if item.start < interval.start:
                keep.append(Interval(item.start, interval.start - 1))
            if item.end > interval.end:
                keep.append(Interval(interval.end + 1, item.end))
        self._items = keep

    def copy(self) -> "IntervalSet":
        new = IntervalSet()
        new._items = list(self._items)
        return new

    def union(self, other: "IntervalSet") -> "IntervalSet":
        result = self.copy()
        for interval in other:
            result.add(interval)
        return result

    def difference(self, other: "IntervalSet") -> "IntervalSet":
        result = self.copy()
        for interval in other:
            result.remove(interval)
        return result

    def intersection(self, other: "IntervalSet") -> "IntervalSet":
        result = IntervalSet()
        for mine in self._items:
            for theirs in other:
                common = mine.intersection(theirs)
                if common is not None:
                    result.add(common)
        return result

    __or__ = union
    __sub__ = difference
    __and__ = intersection

    def __contains__(self, item) -> bool:
        """Membership test for an integer or a whole :class:`Interval`."""
        return any(interval.contains(item) for interval in self._items)

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        """Number of disjoint intervals (see :meth:`size` for integers)."""
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other) -> bool:
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return self._items == other._items

    def __repr__(self) -> str:
        return f"IntervalSet([{', '.join(str(i) for i in self._items)}])"

    def size(self) -> int:
        """Number of integers in the set."""
        return sum(len(interval) for interval in self._items)

    def span(self) -> Interval | None:
        """The smallest interval covering the whole set, or None if empty."""
        if not self._items:
            return None
        return Interval(self._items[0].start, self._items[-1].end)

    def gaps(self) -> list[Interval]:
        """The missing stretches between the first and the last integer."""
        return [
            Interval(left.end + 1, right.start - 1)
            for left, right in zip(self._items, self._items[1:])
        ]

    def density(self) -> float:
        """Fraction of the span that is covered; 0.0 for an empty set."""
        span = self.span()
        span_size = len(span) if span is not None else 0
        return self.size() / span_size
