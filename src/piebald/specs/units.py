"""Parse quantities with units ("80GiB", "200Gb/s", "900GB/s", "15ms", "24h") into SI numbers.

Units are parsed once, at the edge; everything inside piebald is bytes, bytes per second,
seconds and FLOP/s. Decimal prefixes (k, M, G, T, P) are powers of 1000, binary prefixes
(Ki, Mi, Gi, Ti, Pi) powers of 1024. A lowercase ``b`` means bits, an uppercase ``B`` bytes.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "QuantityRangeError",
    "UnitError",
    "format_bytes",
    "format_duration",
    "format_rate",
    "parse_bytes",
    "parse_duration_s",
    "parse_rate",
]

_PREFIX = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
}
# A sign is parsed so that "-5ms" is refused as negative, not as an unknown format.
_NUMBER = r"([+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?))"
_SIZE_RE = re.compile(rf"^{_NUMBER}\s*(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P|)(B|b)$")
_RATE_RE = re.compile(rf"^{_NUMBER}\s*(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P|)(B|b)(?:/s|ps)$")
_TIME_RE = re.compile(rf"^{_NUMBER}\s*(ns|us|µs|ms|s|min|h|d)$")
_TIME_SCALE = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}


class UnitError(ValueError):
    """A quantity string that does not parse; the caller adds file and field."""


class QuantityRangeError(UnitError):
    """A quantity that parses but is negative or not finite ("-5ms", "1e999GB")."""


def _finite_non_negative(number: float, text: str) -> float:
    if not math.isfinite(number) or number < 0:
        raise QuantityRangeError(f"{text!r} is not a finite non-negative quantity")
    return number


def parse_bytes(text: object) -> float:
    """``"80GiB"`` -> 85899345920.0; ``"40GB"`` -> 4e10; ``"8Gb"`` -> 1e9 (bits / 8)."""
    if not isinstance(text, str):
        raise UnitError(f"{text!r} is not a size string like '80GiB' or '40GB'")
    match = _SIZE_RE.match(text.strip())
    if match is None:
        raise UnitError(f"{text!r} is not a size like '80GiB' or '40GB'")
    number, prefix, unit = match.groups()
    value = float(number) * _PREFIX[prefix] / (8.0 if unit == "b" else 1.0)
    return _finite_non_negative(value, text)


def parse_rate(text: object) -> float:
    """Bandwidth in bytes per second: ``"200Gb/s"`` -> 2.5e10, ``"900GB/s"`` -> 9e11."""
    if not isinstance(text, str):
        raise UnitError(f"{text!r} is not a rate string like '200Gb/s' or '900GB/s'")
    match = _RATE_RE.match(text.strip())
    if match is None:
        raise UnitError(f"{text!r} is not a rate like '200Gb/s' or '900GB/s'")
    number, prefix, unit = match.groups()
    value = float(number) * _PREFIX[prefix] / (8.0 if unit == "b" else 1.0)
    return _finite_non_negative(value, text)


def parse_duration_s(text: object) -> float:
    """Duration in seconds: ``"15ms"`` -> 0.015, ``"2us"`` -> 2e-6, ``"24h"`` -> 86400.0
    (units ns, us or µs, ms, s, min, h, d; no "m", which could be minutes or milli)."""
    if not isinstance(text, str):
        raise UnitError(f"{text!r} is not a duration string like '15ms'")
    match = _TIME_RE.match(text.strip())
    if match is None:
        raise UnitError(f"{text!r} is not a duration like '15ms', '5us' or '24h'")
    number, unit = match.groups()
    return _finite_non_negative(float(number) * _TIME_SCALE[unit], text)


def format_bytes(num_bytes: float) -> str:
    """Human-readable binary size: 85899345920 -> '80.0 GiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """Human-readable duration in the largest unit that keeps it at least 1 (up to hours):
    0.0123 -> '12.3 ms', 12.345 -> '12.3 s', 150 -> '2.5 min', 86400 -> '24 h'."""
    value = float(seconds)
    for unit, scale in (("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e6:.3g} us" if value else "0 s"


def format_rate(bytes_per_s: float) -> str:
    """Human-readable network rate in bits: 2.5e10 -> '200 Gb/s'."""
    bits = float(bytes_per_s) * 8.0
    for unit, scale in (("Tb/s", 1e12), ("Gb/s", 1e9), ("Mb/s", 1e6)):
        if bits >= scale:
            return f"{bits / scale:.4g} {unit}"
    return f"{bits:.4g} b/s"
