"""Exact allocation of identical work items to machines of different speeds.

Assigning n identical micro-batches to ranks whose per-item times differ is scheduling
identical jobs on uniform machines (Q|p_j=1|C_max). Giving each item in turn to the rank
that would finish it earliest is optimal for this problem (Dessouky et al. 1990).

When each machine takes items of its own size and the sizes must add up to a total
exactly, the optimum is found by a search over makespans, each decided by an exact
bounded subset sum. Neither case needs a solver.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Sequence

__all__ = ["min_makespan_counts", "min_makespan_sized"]


def min_makespan_counts(item_times_s: Sequence[float], num_items: int) -> list[int]:
    """Counts per machine minimising max_i count_i * item_times_s[i]; ties go to lower i."""
    if num_items < 0:
        raise ValueError(f"num_items = {num_items}; expected >= 0")
    if not item_times_s or any(t <= 0 for t in item_times_s):
        raise ValueError(f"item times must be positive, got {list(item_times_s)}")
    # At most n items finish by the continuous bound T = n / sum_i (1 / t_i), so the greedy
    # hands out every item finishing before T first: start after them (a rank's k-th item
    # finishes at k t_i) and leave only the last few items to the heap.
    bound_s = num_items / sum(1.0 / t for t in item_times_s)
    counts = [max(0, int(bound_s / t) - 1) for t in item_times_s]
    heap = [
        ((count + 1) * t, i) for i, (count, t) in enumerate(zip(counts, item_times_s, strict=True))
    ]
    heapq.heapify(heap)
    for _ in range(num_items - sum(counts)):
        _, index = heapq.heappop(heap)
        counts[index] += 1
        heapq.heappush(heap, ((counts[index] + 1) * item_times_s[index], index))
    return counts


# A makespan T lets a machine of per-item time t finish floor(T / t + _EPS) items: a T
# short of y * t by less than 1e-9 of an item time still counts as y items, so products
# such as 3 * 0.1 and 0.3 name one makespan.
_EPS = 1e-9


def _items_within(makespan_s: float, time_s: float) -> int:
    return int(makespan_s / time_s + _EPS)


def _add_class(reachable: int, size: int, count: int, mask: int) -> int:
    """The sums in the bitset ``reachable`` plus 0..count items of ``size``, below ``mask``.

    The count is split into parts 1, 2, 4, ... and a remainder, whose subsets make every
    number 0..count: one shift per part instead of one per item.
    """
    part = 1
    while count > 0:
        take = min(part, count)
        reachable |= (reachable << (take * size)) & mask
        count -= take
        part *= 2
    return reachable


def _most_items(rest: int, remaining: int, size: int, cap: int) -> int:
    """The largest x <= cap with remaining - x * size a sum in the bitset ``rest``."""
    top = min(cap, remaining // size)
    low = remaining - top * size  # the sum the rest must make when x = top
    # Bits of rest at low, low + size, ..., remaining: the sums some x in 0..top leaves.
    stride = ((1 << (size * (top + 1))) - 1) // ((1 << size) - 1)
    hits = (rest >> low) & stride
    if not hits:
        raise AssertionError("no count completes a sum known to be reachable")
    return top - ((hits & -hits).bit_length() - 1) // size


def min_makespan_sized(
    item_times_s: Sequence[float], item_sizes: Sequence[int], total_size: int
) -> list[int] | None:
    """Counts m_i minimising max_i m_i * item_times_s[i] with sum_i m_i * item_sizes[i] equal
    to ``total_size`` exactly: machines that each take items of their own size (a GPU with
    its own micro-batch size, as in Cephalo). None when no counts reach the total exactly.

    Identical machines (same time and size) form a class of n machines whose items are
    spread evenly, one more to the earlier ones. A makespan T allows class j at most
    cap_j(T) = n_j * floor(T / t_j + 1e-9) items, and T is feasible when the total is a sum
    of b_j x_j with 0 <= x_j <= cap_j(T): a bounded subset sum, decided exactly on a bitset
    of the reachable sums (a Python int, after dividing sizes and total by their gcd).
    Feasibility only grows with T and the optimum is some t_j y, so the search doubles a
    step above the bound total / sum_j(n_j b_j / t_j) until T is feasible, then bisects the
    products t_j y in between. Among the optimal count vectors, classes in increasing order
    of time per unit of size t_j / b_j (ties in input order) each take as many items as the
    classes after them can complete to the total.
    """
    if len(item_times_s) != len(item_sizes) or not item_times_s:
        raise ValueError(f"{len(item_times_s)} times for {len(item_sizes)} sizes")
    if any(t <= 0 for t in item_times_s) or any(b < 1 for b in item_sizes) or total_size < 0:
        raise ValueError(
            f"bad allocation input: times {list(item_times_s)}, sizes "
            f"{list(item_sizes)}, total {total_size}"
        )
    classes: dict[tuple[float, int], list[int]] = {}
    for index, key in enumerate(zip(item_times_s, item_sizes, strict=True)):
        classes.setdefault(key, []).append(index)
    keys = sorted(classes, key=lambda key: key[0] / key[1])  # stable: ties keep input order
    divisor = math.gcd(*(size for _, size in keys))
    if total_size % divisor:
        return None
    total = total_size // divisor
    times = [time_s for time_s, _ in keys]
    sizes = [size // divisor for _, size in keys]
    machines = [len(classes[key]) for key in keys]
    limits = [total // size for size in sizes]  # more items of a class overshoot the total
    mask = (1 << (total + 1)) - 1

    def caps(makespan_s: float) -> list[int]:
        return [
            min(n * _items_within(makespan_s, t), limit)
            for t, n, limit in zip(times, machines, limits, strict=True)
        ]

    def feasible(makespan_s: float) -> bool:
        counts = caps(makespan_s)
        if sum(b * c for b, c in zip(sizes, counts, strict=True)) < total:
            return False
        reachable = 1
        for size, count in zip(sizes, counts, strict=True):
            reachable = _add_class(reachable, size, count, mask)
        return bool(reachable >> total & 1)

    # Every class can take all the items it could ever use.
    top_s = max(t * -(-limit // n) for t, n, limit in zip(times, machines, limits, strict=True))
    if not feasible(top_s):
        return None
    # A feasible T has total <= sum_j b_j n_j (T / t_j + 1e-9); the margin covers rounding.
    rate = sum(n * b / t for t, b, n in zip(times, sizes, machines, strict=True))
    low_s = max(0.0, (total - _EPS * sum(map(operator.mul, sizes, machines))) / rate)
    low_s *= 1 - 1e-12
    step_s = max(times)
    # The optimum is at least low_s: first the bound, then each T found infeasible.
    while True:
        high_s = low_s + step_s
        if high_s >= top_s:
            high_s = top_s
            break
        if feasible(high_s):
            break
        low_s, step_s = high_s, 2 * step_s
    # The optimum t_j y lies in (low_s, high_s]: bisect those products.
    candidates = sorted(
        {t * y for t in times for y in range(_items_within(low_s, t), _items_within(high_s, t) + 1)}
    )
    first, last = 0, len(candidates)  # candidates[last:] are feasible, high_s too
    while first < last:
        middle = (first + last) // 2
        if feasible(candidates[middle]):
            last = middle
        else:
            first = middle + 1
    best = caps(candidates[last] if last < len(candidates) else high_s)
    # Sums the classes after position j can make, then each class takes its share in turn.
    after = [1] * len(keys)
    for j in range(len(keys) - 1, 0, -1):
        after[j - 1] = _add_class(after[j], sizes[j], best[j], mask)
    counts = [0] * len(item_times_s)
    remaining = total
    for j, key in enumerate(keys):
        items = _most_items(after[j], remaining, sizes[j], best[j])
        remaining -= items * sizes[j]
        members = classes[key]
        base, extra = divmod(items, len(members))
        for position, index in enumerate(members):
            counts[index] = base + (1 if position < extra else 0)
    return counts
