from unitconv import format_duration, humanize_duration


def test_zero():
    assert format_duration(0) == "0s"


def test_hours_and_minutes():
    assert format_duration(5400) == "1h30m"


def test_skips_empty_units():
    assert format_duration(86400 + 5) == "1d5s"


def test_max_units():
    assert format_duration(93784, max_units=2) == "1d2h"


def test_weeks():
    assert format_duration(2 * 604800) == "2w"


def test_humanize():
    assert humanize_duration(3661) == "1 hour, 1 minute, 1 second"


def test_humanize_plural():
    assert humanize_duration(7320) == "2 hours, 2 minutes"


def test_humanize_zero():
    assert humanize_duration(0) == "0 seconds"
