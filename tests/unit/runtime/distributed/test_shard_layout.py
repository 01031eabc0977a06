"""Shard ranges by largest remainder, checked against brute force over every integer split."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from piebald.runtime.distributed.shard_layout import (
    ShardRange,
    padded_shard_size,
    shard_ranges,
    shard_sizes,
)


def _squared_deviation(sizes: tuple[int, ...], fractions: tuple[float, ...], n: int) -> float:
    return sum((a - f * n) ** 2 for a, f in zip(sizes, fractions, strict=True))


def _brute_force_best(fractions: tuple[float, ...], n: int) -> float:
    """The least squared deviation over all non-negative integer splits of n that give
    nothing to a zero fraction."""
    best = math.inf
    for split in itertools.product(range(n + 1), repeat=len(fractions)):
        if sum(split) != n or any(a and not f for a, f in zip(split, fractions, strict=True)):
            continue
        best = min(best, _squared_deviation(split, fractions, n))
    return best


FRACTION_SETS = [
    (1.0,),
    (0.5, 0.5),
    (0.7, 0.3),
    (0.5, 0.3, 0.2),
    (0.5, 0.3, 0.2, 0.0),
    (0.0, 1.0),
    (1 / 3, 1 / 3, 1 / 3),
    (0.25, 0.25, 0.25, 0.25),
    (0.1, 0.2, 0.3, 0.4),
    (0.05, 0.0, 0.95),
]


@pytest.mark.parametrize("fractions", FRACTION_SETS)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 10, 11])
def test_sizes_are_a_least_squares_split(fractions: tuple[float, ...], n: int) -> None:
    sizes = shard_sizes(fractions, num_elements=n)
    assert sum(sizes) == n
    assert all(size == 0 for size, f in zip(sizes, fractions, strict=True) if f == 0)
    assert all(abs(size - f * n) < 1 for size, f in zip(sizes, fractions, strict=True))
    assert _squared_deviation(sizes, fractions, n) == pytest.approx(
        _brute_force_best(fractions, n), abs=1e-9
    )


@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=6).filter(lambda w: sum(w) > 0),
    st.integers(0, 10_000),
)
def test_ranges_tile_the_buffer(weights: list[int], n: int) -> None:
    fractions = tuple(w / sum(weights) for w in weights)
    ranges = shard_ranges(fractions, num_elements=n)
    assert ranges[0].start == 0 and ranges[-1].end == n
    assert all(a.end == b.start for a, b in itertools.pairwise(ranges))
    for r, f in zip(ranges, fractions, strict=True):
        assert abs(r.numel - f * n) < 1
        if f == 0:
            assert r.numel == 0
    assert padded_shard_size(ranges) == max(r.numel for r in ranges)


def test_ties_go_to_the_lower_index_and_results_are_deterministic() -> None:
    assert shard_sizes((0.5, 0.5), num_elements=3) == (2, 1)
    assert shard_sizes((0.25,) * 4, num_elements=6) == (2, 2, 1, 1)
    assert shard_ranges((0.5, 0.3, 0.2), num_elements=10) == (
        ShardRange(start=0, end=5),
        ShardRange(start=5, end=8),
        ShardRange(start=8, end=10),
    )


def test_fractions_rounded_in_a_file_still_split_exactly() -> None:
    sizes = shard_sizes((0.333333, 0.333333, 0.333334), num_elements=1_000_000_007)
    assert sum(sizes) == 1_000_000_007


@pytest.mark.parametrize("fractions", [(), (0.5, 0.6), (1.2, -0.2), (math.nan, 1.0), (0.0, 0.0)])
def test_bad_fractions_are_rejected(fractions: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="fraction"):
        shard_sizes(fractions, num_elements=10)


def test_intersection() -> None:
    a = ShardRange(start=2, end=6)
    assert a.intersect(ShardRange(start=5, end=9)) == ShardRange(start=5, end=6)
    assert a.intersect(ShardRange(start=6, end=9)) is None
    with pytest.raises(ValueError):
        ShardRange(start=3, end=2)
