"""Flat layouts and the pieces a shard holds, checked element by element."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from piebald.runtime.distributed.flat_layout import build_flat_layout, pieces_in_range
from piebald.runtime.distributed.shard_layout import ShardRange

shapes = st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=3), min_size=1, max_size=5)


@given(shapes, st.data())
def test_pieces_cover_exactly_the_range(raw: list[list[int]], data: st.DataObject) -> None:
    layout = build_flat_layout([(f"p{i}", tuple(s)) for i, s in enumerate(raw)])
    n = layout.numel
    assert n == sum(math.prod(s) for s in raw)
    start = data.draw(st.integers(0, n))
    end = data.draw(st.integers(start, n))
    pieces = pieces_in_range(layout, ShardRange(start=start, end=end))
    # Brute force: the (name, element) owning every buffer position in [start, end).
    owner = [(slot.name, k) for slot in layout.slots for k in range(slot.numel)]
    got = [
        (piece.name, piece.param_offset + k, piece.buffer_offset + k)
        for piece in pieces
        for k in range(piece.numel)
    ]
    assert got == [(*owner[i], i) for i in range(start, end)]
    assert all(piece.numel > 0 for piece in pieces)


def test_layout_is_back_to_back_in_the_given_order() -> None:
    layout = build_flat_layout([("w", (2, 3)), ("b", (3,)), ("s", ())])
    assert [(s.name, s.offset, s.numel) for s in layout.slots] == [
        ("w", 0, 6),
        ("b", 6, 3),
        ("s", 9, 1),
    ]
    assert layout.numel == 10
    assert layout.slot("b").end == 9


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="twice"):
        build_flat_layout([("w", (2,)), ("w", (3,))])
