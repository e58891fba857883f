from intervals import Interval, IntervalSet


def make(*pairs):
    return IntervalSet(Interval(a, b) for a, b in pairs)


def test_overlapping_intervals_are_merged():
    assert list(make((1, 5), (3, 8))) == [Interval(1, 8)]


def test_disjoint_intervals_are_sorted():
    assert list(make((10, 12), (1, 2))) == [Interval(1, 2), Interval(10, 12)]


def test_add_bridging_interval():
    s = make((1, 2), (6, 7), (10, 11))
    s.add(Interval(2, 10))
    assert list(s) == [Interval(1, 11)]


def test_membership():
    s = make((1, 3), (10, 20))
    assert 2 in s
    assert 15 in s
    assert 5 not in s


def test_remove_splits_interval():
    s = make((1, 10))
    s.remove(Interval(4, 6))
    assert list(s) == [Interval(1, 3), Interval(7, 10)]


def test_union_and_difference():
    a = make((1, 5))
    b = make((8, 9))
    assert list(a | b) == [Interval(1, 5), Interval(8, 9)]
    assert list((a | b) - make((2, 8))) == [Interval(1, 1), Interval(9, 9)]


def test_intersection():
    a = make((1, 5), (10, 15))
    b = make((4, 11))
    assert list(a & b) == [Interval(4, 5), Interval(10, 11)]


def test_size_and_len():
    s = make((1, 3), (10, 10))
    assert s.size() == 4
    assert len(s) == 2


def test_span_and_gaps():
    s = make((1, 3), (6, 6), (9, 10))
    assert s.span() == Interval(1, 10)
    assert s.gaps() == [Interval(4, 5), Interval(7, 8)]


def test_span_of_empty_set():
    assert IntervalSet().span() is None


def test_density():
    assert make((1, 3), (8, 10)).density() == 0.6


def test_equality_and_repr():
    assert make((1, 2)) == make((1, 2))
    assert repr(make((1, 2), (5, 5))) == "IntervalSet([1-2, 5])"
