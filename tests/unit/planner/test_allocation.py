"""Min-makespan allocation of identical micro-batches against brute force.

For a few machines and items every count vector summing to n can be enumerated; the
allocation must reach the smallest makespan max_i count_i * t_i among them.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from piebald.planner.allocation import min_makespan_counts, min_makespan_sized


def _makespan(counts: list[int] | tuple[int, ...], times: list[float]) -> float:
    return max(count * time for count, time in zip(counts, times, strict=True))


def _brute_force_makespan(times: list[float], num_items: int) -> float:
    return min(
        _makespan(counts, times)
        for counts in itertools.product(range(num_items + 1), repeat=len(times))
        if sum(counts) == num_items
    )


def test_seeded_random_instances_match_brute_force() -> None:
    rng = random.Random(20240601)
    for _ in range(400):
        times = [
            rng.choice([rng.uniform(0.1, 5.0), float(rng.randint(1, 6))])
            for _ in range(rng.randint(1, 4))
        ]
        num_items = rng.randint(0, 10)
        counts = min_makespan_counts(times, num_items)
        assert len(counts) == len(times)
        assert sum(counts) == num_items
        assert all(count >= 0 for count in counts)
        assert _makespan(counts, times) == pytest.approx(
            _brute_force_makespan(times, num_items), rel=1e-12
        ), (times, num_items, counts)


@given(
    times=st.lists(st.floats(0.05, 20.0, allow_nan=False), min_size=1, max_size=4),
    num_items=st.integers(0, 10),
)
def test_matches_brute_force(times: list[float], num_items: int) -> None:
    counts = min_makespan_counts(times, num_items)
    assert sum(counts) == num_items
    assert _makespan(counts, times) == pytest.approx(
        _brute_force_makespan(times, num_items), rel=1e-12
    )


def test_hand_example() -> None:
    # 1 s and 3 s per item, 8 items: 6 + 2 gives makespan 6 (5 + 3 would give 9).
    assert min_makespan_counts([1.0, 3.0], 8) == [6, 2]
    # Equal machines split evenly.
    assert min_makespan_counts([2.0, 2.0, 2.0], 6) == [2, 2, 2]


def test_faster_machines_never_get_fewer_items() -> None:
    times = [0.5, 1.0, 1.5, 4.0]
    for num_items in range(0, 30):
        counts = min_makespan_counts(times, num_items)
        assert counts == sorted(counts, reverse=True), (num_items, counts)


def test_no_items_no_counts() -> None:
    assert min_makespan_counts([1.0, 2.0], 0) == [0, 0]


@pytest.mark.parametrize(
    ("times", "num_items"),
    [([1.0], -1), ([], 3), ([1.0, 0.0], 3), ([1.0, -2.0], 3)],
)
def test_rejects_bad_input(times: list[float], num_items: int) -> None:
    with pytest.raises(ValueError):
        min_makespan_counts(times, num_items)


def _brute_force_sized(times: list[float], sizes: list[int], total: int) -> float | None:
    best = None
    ranges = [range(total // size + 1) for size in sizes]
    for counts in itertools.product(*ranges):
        if sum(c * b for c, b in zip(counts, sizes, strict=True)) == total:
            value = max(c * t for c, t in zip(counts, times, strict=True))
            best = value if best is None else min(best, value)
    return best


@settings(max_examples=150, deadline=None)
@given(
    machines=st.lists(
        st.tuples(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), st.sampled_from([1, 2, 3, 4])),
        min_size=1,
        max_size=4,
    ),
    total=st.integers(0, 12),
)
def test_sized_allocation_matches_brute_force(
    machines: list[tuple[float, int]], total: int
) -> None:
    times = [t for t, _ in machines]
    sizes = [b for _, b in machines]
    counts = min_makespan_sized(times, sizes, total)
    expected = _brute_force_sized(times, sizes, total)
    if expected is None:
        assert counts is None
        return
    assert counts is not None
    assert sum(c * b for c, b in zip(counts, sizes, strict=True)) == total
    assert max(c * t for c, t in zip(counts, times, strict=True)) == pytest.approx(expected)


def test_sized_allocation_gives_the_fast_big_batch_gpu_more() -> None:
    # GPU 0 runs micro-batches of 4 in 1 s, GPU 1 micro-batches of 1 in 1 s: 4x the speed.
    counts = min_makespan_sized([1.0, 1.0], [4, 1], 20)
    assert counts == [4, 4]
