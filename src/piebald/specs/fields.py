"""Typed reading of user mappings (YAML/JSON) with errors that name file, field and value.

Every loader (cluster YAML, catalog, model config.json, plan JSON) reads through
:class:`Fields`, so every mistake becomes one :class:`~piebald.errors.SpecError` line and
nothing else ever escapes a loader.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from piebald.errors import SpecError
from piebald.specs.limits import limit_text
from piebald.specs.units import (
    QuantityRangeError,
    UnitError,
    parse_bytes,
    parse_duration_s,
    parse_rate,
)

__all__ = ["Fields", "suggest"]

T = TypeVar("T")
# Numbers in scientific notation without a dot ("1e-30", "5E+3"), which YAML 1.1 reads as
# strings (its float pattern needs a dot) and every other reader as numbers.
_EXPONENT_ONLY = re.compile(r"^[-+]?[0-9]+[eE][-+]?[0-9]+$")
_MISSING = object()


def suggest(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'A100-80GB'?)`` or an empty string."""
    options = list(choices)
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    if not close:
        lowered = {option.lower(): option for option in options}
        close = [lowered[name.lower()]] if name.lower() in lowered else []
    return f" (did you mean {close[0]!r}?)" if close else ""


class Fields:
    """A mapping read from ``source`` at dotted ``path``; every getter validates its type."""

    def __init__(self, data: object, *, source: str, path: str = "") -> None:
        if not isinstance(data, Mapping):
            raise SpecError(
                source=source,
                field=path or "<top level>",
                value=data,
                expected="a mapping of field: value",
            )
        for key in data:
            if not isinstance(key, str):
                raise SpecError(
                    source=source,
                    field=path or "<top level>",
                    value=key,
                    expected="string field names",
                )
        self.data: Mapping[str, Any] = data
        self.source = source
        self.path = path

    def field(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, value: object, expected: str) -> SpecError:
        return SpecError(source=self.source, field=self.field(name), value=value, expected=expected)

    def has(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def raw(self, name: str, default: object = _MISSING) -> Any:
        if not self.has(name):
            if default is _MISSING:
                raise SpecError(
                    source=self.source,
                    field=self.field(name),
                    has_value=False,
                    expected="this field (it is required)",
                )
            return default
        return self.data[name]

    def reject_unknown(self, allowed: Iterable[str]) -> None:
        known = list(allowed)
        for key in self.data:
            if key not in known:
                raise SpecError(
                    source=self.source,
                    field=self.field(key),
                    has_value=False,
                    expected=f"one of the fields {known}{suggest(key, known)}",
                )

    def string(self, name: str, default: str | None = None) -> str:
        value = self.raw(name, _MISSING if default is None else default)
        if not isinstance(value, str) or not value.strip():
            raise self.error(name, value, "a non-empty string")
        return value

    def boolean(self, name: str, default: bool | None = None) -> bool:
        value = self.raw(name, _MISSING if default is None else default)
        if not isinstance(value, bool):
            raise self.error(name, value, "true or false")
        return value

    def integer(
        self,
        name: str,
        *,
        default: int | None = None,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int:
        """A whole number; ``maximum``: one of ``piebald.specs.limits``, named in the error."""
        value = self.raw(name, _MISSING if default is None else default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, value, "a whole number")
        if minimum is not None and value < minimum:
            raise self.error(name, value, f"a whole number >= {minimum}")
        if maximum is not None and value > maximum:
            raise self.error(name, value, limit_text(maximum))
        return value

    def number(
        self,
        name: str,
        *,
        default: float | None = None,
        minimum: float = 0.0,
        maximum: float = math.inf,
        strictly_positive: bool = False,
    ) -> float:
        value = self.raw(name, _MISSING if default is None else default)
        if isinstance(value, str) and _EXPONENT_ONLY.match(value.strip()):
            # YAML 1.1 (PyYAML) reads a float only with a dot: 1e-30 arrives as a string.
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(name, value, "a number")
        try:
            number = float(value)
        except OverflowError:  # an integer with hundreds of digits
            number = math.inf
        too_small = number <= minimum if strictly_positive else number < minimum
        if not math.isfinite(number) or too_small or number > maximum:
            bound = ">" if strictly_positive else ">="
            upper = f" and <= {maximum:g}" if math.isfinite(maximum) else ""
            raise self.error(name, value, f"a finite number {bound} {minimum:g}{upper}")
        return number

    def optional_number(
        self,
        name: str,
        *,
        minimum: float = 0.0,
        maximum: float = math.inf,
        strictly_positive: bool = False,
    ) -> float | None:
        """:meth:`number` where the field is present (and not null), else None."""
        if not self.has(name):
            return None
        return self.number(
            name, minimum=minimum, maximum=maximum, strictly_positive=strictly_positive
        )

    def _quantity(
        self,
        name: str,
        parse: Callable[[object], float],
        example: str,
        default: str | None,
        positive: bool,
    ) -> float:
        value = self.raw(name, _MISSING if default is None else default)
        try:
            number = parse(value)
        except QuantityRangeError:
            raise self.error(
                name, value, f"a finite non-negative quantity, like {example}"
            ) from None
        except UnitError:
            raise self.error(name, value, f"a quantity with a unit, like {example}") from None
        if positive and number <= 0:
            raise self.error(name, value, f"a quantity > 0, like {example}")
        return number

    def size_bytes(self, name: str, default: str | None = None) -> float:
        return self._quantity(name, parse_bytes, "'80GiB' or '40GB'", default, positive=True)

    def rate_bytes_per_s(self, name: str, default: str | None = None) -> float:
        return self._quantity(name, parse_rate, "'200Gb/s' or '900GB/s'", default, positive=True)

    def duration_s(self, name: str, default: str | None = None) -> float:
        return self._quantity(name, parse_duration_s, "'15ms' or '5us'", default, positive=False)

    def choice(self, name: str, choices: Iterable[str], default: str | None = None) -> str:
        options = list(choices)
        value = self.raw(name, _MISSING if default is None else default)
        if not isinstance(value, str) or value not in options:
            hint = suggest(value, options) if isinstance(value, str) else ""
            raise self.error(name, value, f"one of {options}{hint}")
        return value

    def sub(self, name: str) -> Fields:
        return Fields(self.raw(name), source=self.source, path=self.field(name))

    def items(
        self, name: str, *, default_empty: bool = False, non_empty: bool = False
    ) -> list[Any]:
        value = self.raw(name, [] if default_empty else _MISSING)
        if not isinstance(value, list):
            raise self.error(name, value, "a list")
        if non_empty and not value:
            raise self.error(name, value, "a non-empty list")
        return value

    def sub_list(
        self, name: str, *, default_empty: bool = False, non_empty: bool = False
    ) -> list[Fields]:
        entries = self.items(name, default_empty=default_empty, non_empty=non_empty)
        return [
            Fields(entry, source=self.source, path=f"{self.field(name)}[{index}]")
            for index, entry in enumerate(entries)
        ]
