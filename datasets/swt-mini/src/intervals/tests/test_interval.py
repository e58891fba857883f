import pytest

from intervals import Interval


def test_length_includes_both_ends():
    assert len(Interval(3, 7)) == 5
    assert len(Interval(4, 4)) == 1


def test_iteration():
    assert list(Interval(-1, 2)) == [-1, 0, 1, 2]


def test_start_after_end_rejected():
    with pytest.raises(ValueError):
        Interval(5, 4)


def test_non_integer_bounds_rejected():
    with pytest.raises(TypeError):
        Interval(1.5, 3)


def test_contains_integer():
    interval = Interval(1, 5)
    assert interval.contains(1)
    assert 5 in interval
    assert 6 not in interval


def test_overlaps():
    assert Interval(1, 5).overlaps(Interval(5, 9))
    assert not Interval(1, 5).overlaps(Interval(7, 9))


def test_not_adjacent_with_gap():
    assert not Interval(1, 3).is_adjacent(Interval(6, 8))


def test_intersection():
    assert Interval(1, 5).intersection(Interval(3, 9)) == Interval(3, 5)
    assert Interval(1, 2).intersection(Interval(4, 5)) is None


def test_hull():
    assert Interval(1, 2).hull(Interval(6, 8)) == Interval(1, 8)


def test_str():
    assert str(Interval(2, 2)) == "2"
    assert str(Interval(2, 9)) == "2-9"
