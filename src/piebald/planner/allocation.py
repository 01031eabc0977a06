"""Exact allocation of identical work items to machines of different speeds.

Assigning n identical micro-batches to ranks whose per-item times differ is scheduling
identical jobs on uniform machines (Q|p_j=1|C_max). Giving each item in turn to the rank
that would finish it earliest is optimal for this problem (Dessouky et al. 1990), so no
solver is needed.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

__all__ = ["min_makespan_counts"]


def min_makespan_counts(item_times_s: Sequence[float], num_items: int) -> list[int]:
    """Counts per machine minimising max_i count_i * item_times_s[i]; ties go to lower i."""
    if num_items < 0:
        raise ValueError(f"num_items = {num_items}; expected >= 0")
    if not item_times_s or any(t <= 0 for t in item_times_s):
        raise ValueError(f"item times must be positive, got {list(item_times_s)}")
    counts = [0] * len(item_times_s)
    heap = [(time_s, index) for index, time_s in enumerate(item_times_s)]
    heapq.heapify(heap)
    for _ in range(num_items):
        finish_s, index = heapq.heappop(heap)
        counts[index] += 1
        heapq.heappush(heap, (finish_s + item_times_s[index], index))
    return counts
