"""The one place the API checks its arguments' types and ranges, before any work: each check
raises :class:`~piebald.errors.ArgumentError` (a ``ValueError``) naming the argument as a
Python caller passed it, so a wrong type is one line, never a TypeError, AttributeError or
OSError from deep inside (the CLI reports the same error under its flag)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from piebald.errors import ArgumentError

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "check_bool",
    "check_callable",
    "check_finite",
    "check_instance",
    "check_int",
    "check_path",
    "check_str",
]

# Linux's NAME_MAX and PATH_MAX: a longer name is refused by the OS (ENAMETOOLONG).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def check_path(argument: str, value: object) -> Path:
    """``value`` as a Path: a str or an ``os.PathLike`` whose name fits the file system
    (each part at most 255 bytes, the whole at most 4096)."""
    if not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes):
        raise ArgumentError(
            argument=argument,
            value=value,
            expected="a path (str or pathlib.Path)",
        )
    text = os.fspath(value)
    if not isinstance(text, str):  # a PathLike returning bytes
        raise ArgumentError(argument=argument, value=text, expected="a path given as str")
    if not text or "\0" in text:
        raise ArgumentError(
            argument=argument, value=text, expected="a path: not empty, no NUL character"
        )
    encoded = os.fsencode(text)
    if len(encoded) > MAX_PATH_BYTES or any(
        len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")
    ):
        raise ArgumentError(
            argument=argument,
            value=text,
            expected=f"a path the file system can hold (each name at most {MAX_NAME_BYTES} "
            f"bytes, the whole at most {MAX_PATH_BYTES})",
        )
    return Path(text)


def check_str(argument: str, value: object) -> str:
    """``value``, a str."""
    if not isinstance(value, str):
        raise ArgumentError(argument=argument, value=value, expected="a str")
    return value


def check_int(argument: str, value: object, *, minimum: int = 1, optional: bool = False) -> None:
    """``value`` is an int (not a bool, not a float) of at least ``minimum`` (or None where
    ``optional``)."""
    if value is None and optional:
        return
    expected = f"a whole number >= {minimum}" + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(argument=argument, value=value, expected=expected)
    if value < minimum:
        raise ArgumentError(argument=argument, value=value, expected=expected)


def check_finite(
    argument: str,
    value: object,
    *,
    minimum: float | None = None,
    positive: bool = False,
    optional: bool = False,
) -> None:
    """``value`` is a finite real number (an int or a float, not a bool, not inf or nan), at
    least ``minimum``, above 0 where ``positive`` (or None where ``optional``)."""
    if value is None and optional:
        return
    bound = "> 0" if positive else f">= {minimum:g}" if minimum is not None else ""
    expected = " ".join(("a finite number", bound)).strip() + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(argument=argument, value=value, expected=expected)
    if (
        not math.isfinite(value)
        or (minimum is not None and value < minimum)
        or (positive and not value > 0)
    ):
        raise ArgumentError(argument=argument, value=value, expected=expected)


def check_bool(argument: str, value: object) -> None:
    """``value`` is a bool (True or False, not 0 or "yes")."""
    if not isinstance(value, bool):
        raise ArgumentError(argument=argument, value=value, expected="True or False")


def check_callable(argument: str, value: object) -> None:
    """``value`` is a callable or None (progress callbacks)."""
    if value is not None and not callable(value):
        raise ArgumentError(argument=argument, value=value, expected="a callable or None")


def check_instance(argument: str, value: object, kind: type, *, expected: str) -> None:
    """``value`` is a ``kind`` (``expected`` says how to make one)."""
    if not isinstance(value, kind):
        raise ArgumentError(argument=argument, value=value, expected=expected)
