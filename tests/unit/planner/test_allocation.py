"""Min-makespan allocation of identical micro-batches against brute force.

For a few machines and items every count vector summing to n can be enumerated; the
allocation must reach the smallest makespan max_i count_i * t_i among them. Sized items
are also checked on larger totals against a dynamic programme over the sums.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
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


def _dp_sized(times: list[float], sizes: list[int], total: int) -> float | None:
    """Smallest makespan reaching ``total`` exactly, machine by machine: best[s] is the
    least makespan with which the machines so far make the sum s."""
    best = np.full(total + 1, np.inf)
    best[0] = 0.0
    for time_s, size in zip(times, sizes, strict=True):
        extended = best.copy()  # this machine takes no items
        for count in range(1, total // size + 1):
            shifted = np.full(total + 1, np.inf)
            shifted[count * size :] = best[: total + 1 - count * size]
            extended = np.minimum(extended, np.maximum(shifted, count * time_s))
        best = extended
    return None if np.isinf(best[total]) else float(best[total])


def _check_sized(times: list[float], sizes: list[int], total: int, expected: float | None) -> None:
    counts = min_makespan_sized(times, sizes, total)
    if expected is None:
        assert counts is None, (times, sizes, total, counts)
        return
    assert counts is not None, (times, sizes, total)
    assert len(counts) == len(times)
    assert all(count >= 0 for count in counts)
    assert sum(c * b for c, b in zip(counts, sizes, strict=True)) == total
    assert _makespan(counts, times) == pytest.approx(expected, rel=1e-9), (times, sizes, total)
    # Identical machines share their class's items evenly, the extra ones to the first.
    keys = list(zip(times, sizes, strict=True))
    for machine in set(keys):
        members = [c for c, key in zip(counts, keys, strict=True) if key == machine]
        assert members == sorted(members, reverse=True), (machine, counts)
        assert members[0] - members[-1] <= 1, (machine, counts)


def test_dp_oracle_agrees_with_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(60):
        machines = rng.randint(1, 3)
        times = [rng.choice([0.5, 1.0, 1.5, 3.0]) for _ in range(machines)]
        sizes = [rng.choice([2, 3, 4]) for _ in range(machines)]
        total = rng.randint(0, 14)
        assert _dp_sized(times, sizes, total) == _brute_force_sized(times, sizes, total)


@settings(max_examples=150, deadline=None)
@given(
    kinds=st.lists(
        st.tuples(st.sampled_from([0.1, 0.3, 0.7, 1.0, 2.5]), st.sampled_from([1, 2, 3, 4, 8])),
        min_size=1,
        max_size=3,
        unique=True,
    ),
    picks=st.lists(st.integers(0, 2), min_size=1, max_size=8),
    total=st.integers(0, 60),
)
def test_sized_allocation_with_duplicate_machines_matches_dp(
    kinds: list[tuple[float, int]], picks: list[int], total: int
) -> None:
    machines = [kinds[pick % len(kinds)] for pick in picks]
    times = [t for t, _ in machines]
    sizes = [b for _, b in machines]
    _check_sized(times, sizes, total, _dp_sized(times, sizes, total))


def test_sized_allocation_on_large_totals_matches_dp() -> None:
    rng = random.Random(20240602)
    for _ in range(12):
        kinds = [
            (rng.uniform(0.2, 3.0), rng.choice([1, 2, 4, 8])) for _ in range(rng.randint(2, 4))
        ]
        machines = [rng.choice(kinds) for _ in range(rng.randint(2, 7))]
        times = [t for t, _ in machines]
        sizes = [b for _, b in machines]
        total = rng.randint(200, 1200)
        _check_sized(times, sizes, total, _dp_sized(times, sizes, total))


def test_sized_allocation_when_the_sizes_cannot_make_the_total() -> None:
    # Only even sizes: no odd total.
    assert min_makespan_sized([1.0, 0.5, 2.0], [2, 4, 2], 1001) is None
    # 3s and 5s make 8 but not 7 (nor 1, 2, 4).
    for total in (1, 2, 4, 7):
        assert min_makespan_sized([1.0, 1.0], [3, 5], total) is None
    assert min_makespan_sized([1.0, 1.0], [3, 5], 8) == [1, 1]


def test_sized_allocation_of_nothing_is_all_zeros() -> None:
    assert min_makespan_sized([1.0, 2.0, 2.0], [4, 2, 2], 0) == [0, 0, 0]


def test_sized_allocation_spreads_a_class_evenly() -> None:
    # Three identical machines and one twice as slow with twice the size: 9 items of 1 on
    # the three fast machines is makespan 3, and the slow one takes 2 items of 2 in 4.
    counts = min_makespan_sized([1.0, 2.0, 1.0, 1.0], [1, 2, 1, 1], 11)
    assert counts is not None
    assert _makespan(counts, [1.0, 2.0, 1.0, 1.0]) == pytest.approx(3.0)
    assert counts == [3, 1, 3, 3]
    assert min_makespan_sized([1.0, 1.0, 1.0], [1, 1, 1], 7) == [3, 2, 2]


def test_sized_allocation_ties_favour_less_time_per_unit_of_size() -> None:
    # 0 + 2 and 2 + 1 items (of sizes 1 and 2) both finish in 2 s: the size-2 machine, at
    # 0.5 s per unit of size, takes as many as it can.
    assert min_makespan_sized([1.0, 1.0], [1, 2], 4) == [0, 2]


def test_sized_allocation_counts_items_that_end_a_rounding_error_late() -> None:
    # 3 * 0.7 is 2.0999999999999996 and that over 0.7 is 2.9999999999999996: a makespan of
    # 3 items on the 0.7 s machine must still count 3 of them, or 3 + 2 at 2.1 s is missed.
    counts = min_makespan_sized([0.7, 1.0], [1, 1], 5)
    assert counts == [3, 2]


@pytest.mark.parametrize(
    ("times", "sizes", "total", "message"),
    [
        ([1.0], [1, 2], 4, "1 times for 2 sizes"),
        ([], [], 4, "0 times for 0 sizes"),
        ([1.0, 0.0], [1, 2], 4, "bad allocation input"),
        ([1.0, 1.0], [1, 0], 4, "bad allocation input"),
        ([1.0], [1], -1, "bad allocation input"),
    ],
)
def test_sized_allocation_rejects_bad_input(
    times: list[float], sizes: list[int], total: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        min_makespan_sized(times, sizes, total)
