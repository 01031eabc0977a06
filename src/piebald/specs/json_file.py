"""Reading a JSON file a user gave (a plan, a model's config.json, a profile) safely.

Unreadable, malformed or absurdly nested files become one :class:`SpecError` naming the
file: ``json.loads`` of ``[[[[...`` two hundred thousand deep raises RecursionError, and
a structure just under the interpreter's limit would raise it later, in whatever walks
it, so nesting is limited here, once, far above what any of these files uses (a plan's
deepest value, ``cost_inputs.links[i].between[j]``, is five levels down).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from piebald.errors import SpecError

__all__ = ["MAX_NESTING", "nesting_depth", "read_json"]

MAX_NESTING = 64


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


def read_json(path: Path, *, expected: str) -> Any:
    """The parsed JSON of ``path``; ``expected`` says what the file should be (``"a plan
    JSON file"``), for the error."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # unreadable, not UTF-8, not JSON, a huge int
        raise SpecError(
            source=str(path), field="", has_value=False, expected=f"{expected} ({error})"
        ) from None
    except RecursionError:
        data = None  # reported as too deep below
    else:
        if nesting_depth(data) <= MAX_NESTING:
            return data
    raise SpecError(
        source=str(path),
        field="",
        has_value=False,
        expected=f"{expected} with lists and mappings at most {MAX_NESTING} levels deep",
    )
