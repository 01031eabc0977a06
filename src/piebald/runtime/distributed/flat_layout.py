"""Where each named parameter lives in a flat buffer, and which parts of it a range holds.

A bucket (a stage's parameters, or the tied embedding/head weight) is laid out as one flat
buffer: parameters back to back in the order given, each flattened row-major. A shard
range of that buffer cuts across parameters; :func:`pieces_in_range` says which parameter
elements it holds (``Piece``). Checkpoints store pieces with global parameter names and
element offsets, so a checkpoint is "slices of named flat tensors" and can be loaded by a
plan that cuts the buffers differently.

Pure (no torch): shapes are plain tuples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from piebald.runtime.distributed.shard_layout import ShardRange

__all__ = ["FlatLayout", "ParamSlot", "Piece", "build_flat_layout", "pieces_in_range"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamSlot:
    """One parameter's place in the flat buffer: elements ``[offset, offset + numel)``."""

    name: str  # global name, the same on every rank and in every plan
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def end(self) -> int:
        return self.offset + self.numel


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    """Elements ``[param_offset, param_offset + numel)`` of the flattened parameter ``name``,
    stored at ``[buffer_offset, buffer_offset + numel)`` of the flat buffer."""

    name: str
    param_offset: int
    buffer_offset: int
    numel: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FlatLayout:
    slots: tuple[ParamSlot, ...]

    @property
    def numel(self) -> int:
        return self.slots[-1].end if self.slots else 0

    def slot(self, name: str) -> ParamSlot:
        for slot in self.slots:
            if slot.name == name:
                return slot
        raise KeyError(name)


def build_flat_layout(named_shapes: Sequence[tuple[str, tuple[int, ...]]]) -> FlatLayout:
    """Parameters back to back, in the order given; names must be unique."""
    slots: list[ParamSlot] = []
    offset = 0
    seen: set[str] = set()
    for name, shape in named_shapes:
        if name in seen:
            raise ValueError(f"parameter name {name!r} appears twice in one flat buffer")
        seen.add(name)
        slot = ParamSlot(name=name, shape=tuple(shape), offset=offset)
        slots.append(slot)
        offset = slot.end
    return FlatLayout(slots=tuple(slots))


def pieces_in_range(layout: FlatLayout, shard: ShardRange) -> tuple[Piece, ...]:
    """The parts of parameters that ``shard`` holds, in buffer order (empty slots skipped)."""
    pieces: list[Piece] = []
    for slot in layout.slots:
        overlap = shard.intersect(ShardRange(start=slot.offset, end=slot.end))
        if overlap is None:
            continue
        pieces.append(
            Piece(
                name=slot.name,
                param_offset=overlap.start - slot.offset,
                buffer_offset=overlap.start,
                numel=overlap.numel,
            )
        )
    return tuple(pieces)
