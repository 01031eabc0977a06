"""Unit parsing at the edge: sizes, rates and durations with hand-computed SI values.

Decimal prefixes are powers of 1000, binary prefixes (Ki, Mi, Gi, ...) powers of 1024; a
lowercase ``b`` is a bit, an uppercase ``B`` a byte. Every expected number below is worked
out by hand from those rules, not copied from the code.
"""

from __future__ import annotations

import pytest

from piebald.specs.units import (
    UnitError,
    format_bytes,
    format_rate,
    parse_bytes,
    parse_duration_s,
    parse_rate,
)

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "expected_bytes"),
    [
        ("80GiB", 80 * GIB),
        ("40GB", 4e10),
        ("8Gb", 1e9),  # 8 gigabits = 1 gigabyte
        ("1KiB", 1024),
        ("1kB", 1000),
        ("1KB", 1000),
        ("1.5MiB", 1.5 * 2**20),
        ("2TiB", 2 * 2**40),
        ("1PB", 1e15),
        ("8b", 1),
        ("0B", 0),
        ("80 GiB", 80 * GIB),  # a space between number and unit is allowed
        ("  40GB ", 4e10),  # surrounding whitespace is ignored
        (".5GB", 5e8),
        ("1e3MB", 1e9),
    ],
)
def test_parse_bytes(text: str, expected_bytes: float) -> None:
    assert parse_bytes(text) == pytest.approx(expected_bytes, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "expected_bytes_per_s"),
    [
        ("200Gb/s", 2.5e10),  # 200e9 bits / 8
        ("900GB/s", 9e11),
        ("100Gbps", 1.25e10),  # the "ps" spelling
        ("25Gb/s", 3.125e9),
        ("1.6TB/s", 1.6e12),
        ("10 Mb/s", 1.25e6),
        ("1GiB/s", GIB),
        ("0B/s", 0),
    ],
)
def test_parse_rate(text: str, expected_bytes_per_s: float) -> None:
    assert parse_rate(text) == pytest.approx(expected_bytes_per_s, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "expected_s"),
    [
        ("15ms", 0.015),
        ("5us", 5e-6),
        ("5µs", 5e-6),
        ("100ns", 1e-7),
        ("2s", 2.0),
        ("2min", 120.0),
        ("0s", 0.0),
        ("1.5 ms", 1.5e-3),
    ],
)
def test_parse_duration_s(text: str, expected_s: float) -> None:
    assert parse_duration_s(text) == pytest.approx(expected_s, rel=1e-12)


@pytest.mark.parametrize("prefix", ["", "k", "M", "G", "T", "Ki", "Gi"])
def test_bits_are_an_eighth_of_bytes(prefix: str) -> None:
    assert parse_bytes(f"64{prefix}b") * 8 == pytest.approx(parse_bytes(f"64{prefix}B"))
    assert parse_rate(f"64{prefix}b/s") * 8 == pytest.approx(parse_rate(f"64{prefix}B/s"))


def test_binary_and_decimal_prefixes_differ() -> None:
    assert parse_bytes("1GiB") / parse_bytes("1GB") == pytest.approx(2**30 / 1e9)


_BAD_QUANTITIES = [
    "80",  # no unit
    "-5GB",  # negative
    "abc",
    "",
    "GB",  # no number
    "1e999GB",  # overflows to infinity
    "infGB",
    "nanGB",
    "80 GiB GiB",
    "80gib",  # lowercase prefix "gi" is not a prefix
    "80Gbit",
]


@pytest.mark.parametrize("text", [*_BAD_QUANTITIES, None, 5, 5.0, ["80GiB"]])
def test_parse_bytes_rejects(text: object) -> None:
    with pytest.raises(UnitError):
        parse_bytes(text)


@pytest.mark.parametrize(
    "text",
    [*_BAD_QUANTITIES, "200Gb", "200Gbit/s", "200Gb/min", "1e999GB/s", None, 200, True],
)
def test_parse_rate_rejects(text: object) -> None:
    with pytest.raises(UnitError):
        parse_rate(text)


@pytest.mark.parametrize(
    "text", ["15", "-15ms", "15 hours", "ms", "abc", "1e999s", "15GB", None, 15, 0.015]
)
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(UnitError):
        parse_duration_s(text)


def test_unit_error_is_a_value_error() -> None:
    # Loaders catch UnitError and re-raise it as a SpecError naming file and field.
    with pytest.raises(ValueError, match="abc"):
        parse_bytes("abc")


@pytest.mark.parametrize(
    ("num_bytes", "expected"),
    [
        (80 * GIB, "80.0 GiB"),
        (512, "512 B"),
        (0, "0 B"),
        (1536, "1.5 KiB"),
        (3 * 2**20, "3.0 MiB"),
        (2 * 2**40, "2.0 TiB"),
        (2**50, "1024.0 TiB"),  # TiB is the largest unit
    ],
)
def test_format_bytes(num_bytes: float, expected: str) -> None:
    assert format_bytes(num_bytes) == expected


@pytest.mark.parametrize(
    ("bytes_per_s", "expected"),
    [
        (2.5e10, "200 Gb/s"),
        (1.25e8, "1 Gb/s"),
        (3.125e9, "25 Gb/s"),
        (1.25e11, "1 Tb/s"),
        (1.25e6, "10 Mb/s"),
        (1e3, "8000 b/s"),
    ],
)
def test_format_rate(bytes_per_s: float, expected: str) -> None:
    assert format_rate(bytes_per_s) == expected


@pytest.mark.parametrize("bytes_per_s", [2.5e10, 3.125e9, 1.25e11, 1.25e6, 1e3])
def test_format_rate_parses_back(bytes_per_s: float) -> None:
    assert parse_rate(format_rate(bytes_per_s)) == pytest.approx(bytes_per_s, rel=1e-3)
