"""Reading a file a user named: one way, with the same refusals everywhere.

Every reader of a user's file (a ``--config`` TOML, a token file's sidecar, a JSONL
document file, a ``tokenizer_config.json``, a plan, a profile) goes through these
functions, so every such file is

* a regular file: a FIFO, a device node (``/dev/zero``, also behind a symbolic link), a
  directory or a socket is refused before it is opened, and checked again on the open
  descriptor (opened with ``O_NONBLOCK``, so a FIFO swapped in between cannot block);
* at most ``max_bytes`` long: at most ``max_bytes + 1`` bytes are ever read;
* UTF-8 text, for the text readers: an invalid byte or an encoded surrogate is refused;
* at most ``max_depth`` lists and mappings deep, for JSON and TOML: their parsers recurse,
  so ``[[[[...`` a hundred thousand deep is a RecursionError inside them, and a value just
  under the interpreter's limit would be one later, in whatever walks it.

Every refusal is one :class:`~piebald.errors.SpecError` line naming ``source`` (the flag
or the file the user knows), the path when ``source`` is not the path itself, and what
was expected.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from piebald.errors import SpecError
from piebald.outputs import file_kind

__all__ = [
    "MAX_NESTING",
    "check_regular_file",
    "check_unicode",
    "nesting_depth",
    "parse_user_json",
    "read_user_bytes",
    "read_user_json",
    "read_user_text",
    "read_user_toml",
]

MAX_NESTING = 64  # lists and mappings; a plan's deepest value is five levels down
_CHUNK = 1 << 20


def nesting_depth(value: object, *, limit: int = MAX_NESTING) -> int:
    """How many lists and mappings deep ``value`` goes, counted without recursion and
    without looking further than ``limit + 1`` levels (so a value built to be deep costs
    nothing more than reaching the limit)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _refuse(path: Path, source: str, expected: str) -> SpecError:
    if source == str(path):
        return SpecError(source=source, field="", has_value=False, expected=expected)
    return SpecError(source=source, field="", value=str(path), expected=expected)


def _size_text(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


def check_regular_file(path: Path, *, source: str) -> os.stat_result:
    """The ``os.stat`` of ``path`` (symbolic links followed) if it is a regular file;
    otherwise one SpecError line (missing, unreadable, a FIFO, a device, a directory)."""
    try:
        info = os.stat(path)
    except (OSError, ValueError) as error:  # ValueError: an embedded NUL
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise _refuse(path, source, f"a readable file ({reason})") from None
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, source, f"a regular file (it is {file_kind(info.st_mode)})")
    return info


def read_user_bytes(path: Path, *, source: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them."""
    check_regular_file(path, source=source)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise _refuse(path, source, f"a readable file ({error.strerror})") from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise _refuse(path, source, f"a regular file (it is {file_kind(mode)})")
        parts: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            part = os.read(descriptor, min(left, _CHUNK))
            if not part:
                break
            parts.append(part)
            left -= len(part)
    except OSError as error:
        raise _refuse(path, source, f"a readable file ({error.strerror})") from None
    finally:
        os.close(descriptor)
    if left <= 0:
        raise _refuse(path, source, f"a file of at most {_size_text(max_bytes)}")
    return b"".join(parts)


def read_user_text(path: Path, *, source: str, max_bytes: int) -> str:
    """The UTF-8 text of the regular file ``path`` (at most ``max_bytes`` bytes)."""
    data = read_user_bytes(path, source=source, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        byte = data[error.start]
        line = data.count(b"\n", 0, error.start) + 1
        raise _refuse(
            path, source, f"UTF-8 text (byte 0x{byte:02x} on line {line} is not UTF-8)"
        ) from None


def check_unicode(text: str, *, source: str, field: str) -> str:
    """``text`` if it can be written as UTF-8; a lone surrogate (JSON's ``"\\ud800"``)
    cannot, and is one SpecError line naming ``source`` and ``field``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise SpecError(
            source=source,
            field=field,
            has_value=False,
            expected=f"text without lone surrogates (U+{ord(text[error.start]):04X} at "
            f"character {error.start})",
        ) from None
    return text


def _too_deep(source: str, field: str, what: str, max_depth: int) -> SpecError:
    return SpecError(
        source=source,
        field=field,
        has_value=False,
        expected=f"{what} with lists and mappings at most {max_depth} levels deep",
    )


def parse_user_json(
    text: str | bytes,
    *,
    source: str,
    field: str = "",
    what: str = "JSON",
    max_depth: int = MAX_NESTING,
) -> Any:
    """The parsed JSON ``text`` (a line of a JSONL file, say), at most ``max_depth``
    deep; a parse error is one SpecError line naming ``source`` and ``field``."""
    try:
        data = json.loads(text)
    except RecursionError:
        data = None  # reported as too deep below
    except ValueError as error:  # not JSON, not UTF-8, an int past the digit limit
        raise SpecError(
            source=source, field=field, has_value=False, expected=f"{what} ({error})"
        ) from None
    else:
        if nesting_depth(data, limit=max_depth) <= max_depth:
            return data
    raise _too_deep(source, field, what, max_depth)


def read_user_json(
    path: Path,
    *,
    source: str,
    max_bytes: int,
    max_depth: int = MAX_NESTING,
    what: str = "JSON",
) -> Any:
    """The parsed JSON of the regular file ``path``; ``what`` names the content in errors
    (``"a plan JSON file"``)."""
    text = read_user_text(path, source=source, max_bytes=max_bytes)
    where = f"{source}: {path}" if source != str(path) else source
    return parse_user_json(text, source=where, what=what, max_depth=max_depth)


def read_user_toml(
    path: Path,
    *,
    source: str,
    max_bytes: int,
    max_depth: int = MAX_NESTING,
    what: str = "TOML",
) -> dict[str, Any]:
    """The parsed TOML table of the regular file ``path``, at most ``max_depth`` deep."""
    text = read_user_text(path, source=source, max_bytes=max_bytes)
    where = f"{source}: {path}" if source != str(path) else source
    try:
        table = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(where, "", what, max_depth) from None
    except tomllib.TOMLDecodeError as error:
        raise SpecError(
            source=where, field="", has_value=False, expected=f"{what} ({error})"
        ) from None
    if nesting_depth(table, limit=max_depth) > max_depth:
        raise _too_deep(where, "", what, max_depth)
    return table
