"""Durations in hours and days ("24h", "2d": a mean time between failures) and durations
shown back in words; every expected number is worked out by hand."""

from __future__ import annotations

import pytest

from piebald.specs.units import QuantityRangeError, UnitError, format_duration, parse_duration_s


@pytest.mark.parametrize(
    ("text", "expected_s"),
    [
        ("24h", 86400.0),  # 24 x 3600
        ("1.5h", 5400.0),
        ("3600s", 3600.0),
        ("2d", 172800.0),  # 2 x 86400
        ("90min", 5400.0),
        (" 6 h ", 21600.0),
        ("0h", 0.0),
    ],
)
def test_parse_hours_and_days(text: str, expected_s: float) -> None:
    assert parse_duration_s(text) == pytest.approx(expected_s, rel=1e-12)


@pytest.mark.parametrize("text", ["24", "24hours", "1m", "h", "24 hr", "1w", ""])
def test_durations_without_a_known_unit_are_refused(text: str) -> None:
    with pytest.raises(UnitError, match="duration"):
        parse_duration_s(text)


@pytest.mark.parametrize("text", ["-1h", "1e999d"])
def test_negative_or_infinite_durations_are_refused(text: str) -> None:
    with pytest.raises(QuantityRangeError):
        parse_duration_s(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (2e-5, "20 us"),
        (0.0123, "12.3 ms"),
        (12.345, "12.3 s"),
        (150.0, "2.5 min"),
        (5400.0, "1.5 h"),
        (86400.0, "24 h"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
