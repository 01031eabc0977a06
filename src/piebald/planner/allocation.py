"""Exact allocation of identical work items to machines of different speeds.

Assigning n identical micro-batches to ranks whose per-item times differ is scheduling
identical jobs on uniform machines (Q|p_j=1|C_max). Giving each item in turn to the rank
that would finish it earliest is optimal for this problem (Dessouky et al. 1990), so no
solver is needed.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

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


def min_makespan_sized(
    item_times_s: Sequence[float], item_sizes: Sequence[int], total_size: int
) -> list[int] | None:
    """Counts m_i minimising max_i m_i * item_times_s[i] with sum_i m_i * item_sizes[i] equal
    to ``total_size`` exactly: machines that each take items of their own size (a GPU with
    its own micro-batch size, as in Cephalo). None when no counts reach the total exactly.

    A small MILP solved by HiGHS: identical machines are merged into one class with
    variables x (items of the class) and y (items on its busiest machine, x <= n y), so the
    model has two integers per class whatever the number of GPUs.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp  # planning-time only

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
    keys = list(classes)
    k = len(keys)
    # Variables: x_0..x_{k-1}, y_0..y_{k-1}, T.
    objective = np.zeros(2 * k + 1)
    objective[-1] = 1.0
    rows, lower, upper = [], [], []
    for j, (time_s, size) in enumerate(keys):
        split = np.zeros(2 * k + 1)  # x_j - n_j y_j <= 0
        split[j], split[k + j] = 1.0, -len(classes[time_s, size])
        makespan = np.zeros(2 * k + 1)  # t_j y_j - T <= 0
        makespan[k + j], makespan[-1] = time_s, -1.0
        rows += [split, makespan]
        lower += [-np.inf, -np.inf]
        upper += [0.0, 0.0]
    total = np.zeros(2 * k + 1)
    total[:k] = [size for _, size in keys]
    rows.append(total)
    lower.append(total_size)
    upper.append(total_size)
    result = milp(
        objective,
        constraints=LinearConstraint(np.array(rows), lower, upper),
        integrality=np.array([1] * (2 * k) + [0]),
        bounds=Bounds(np.zeros(2 * k + 1), np.full(2 * k + 1, np.inf)),
    )
    if result.status != 0 or result.x is None:
        return None
    counts = [0] * len(item_times_s)
    for j, key in enumerate(keys):
        members = classes[key]
        items = round(result.x[j])
        base, extra = divmod(items, len(members))
        for position, index in enumerate(members):
            counts[index] = base + (1 if position < extra else 0)
    return counts
