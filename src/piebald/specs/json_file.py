"""Reading a JSON file a user gave (a plan, a model's config.json, a profile) safely.

A thin name for :func:`piebald.specs.user_input.read_user_json`, which does the work for
every reader of a user's file: a regular file only, at most :data:`MAX_JSON_BYTES`, UTF-8,
at most :data:`MAX_NESTING` lists and mappings deep (a plan's deepest value,
``cost_inputs.links[i].between[j]``, is five levels down). Each refusal is one
:class:`~piebald.errors.SpecError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from piebald.specs.user_input import MAX_NESTING, nesting_depth, read_user_json

__all__ = ["MAX_JSON_BYTES", "MAX_NESTING", "nesting_depth", "read_json"]

# Far above any plan or profile (a plan of 2^16 micro-batches on 2^15 GPUs is tens of MB).
MAX_JSON_BYTES = 1 << 30


def read_json(path: Path, *, expected: str) -> Any:
    """The parsed JSON of ``path``; ``expected`` says what the file should be (``"a plan
    JSON file"``), for the error."""
    return read_user_json(path, source=str(path), max_bytes=MAX_JSON_BYTES, what=expected)
