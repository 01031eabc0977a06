"""Which contiguous slice of a stage's flat buffer each rank owns (uneven ZeRO, pure).

A stage's trainable state is one logical flat buffer of ``num_elements`` elements; rank i
of the group owns ``[start_i, end_i)``, of about ``fraction_i * num_elements`` elements.
The ideal sizes ``q_i = f_i * n`` are rarely integers; the integer sizes come from the
largest-remainder (Hamilton) method: every rank gets ``floor(q_i)`` and the elements left
over go, one each, to the ranks with the largest remainders ``q_i - floor(q_i)`` (ties to
the lower index). Among integer sizes summing to ``n``, these minimise the squared
deviation ``sum (a_i - q_i)^2`` (the unit tests check this by brute force). A fraction of
0 always gets an empty range. Ranges are laid out in group order, back to back, so they
tile ``[0, n)`` exactly.

No torch here: the planner and the checkpoint manifest reason about the same ranges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ShardRange", "back_to_back", "padded_shard_size", "shard_ranges", "shard_sizes"]

_FRACTION_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRange:
    """Elements ``[start, end)`` of a flat buffer."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"ShardRange [{self.start}, {self.end}): expected 0 <= start <= end")

    @property
    def numel(self) -> int:
        return self.end - self.start

    def intersect(self, other: ShardRange) -> ShardRange | None:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return ShardRange(start=start, end=end) if start < end else None


def shard_sizes(fractions: Sequence[float], *, num_elements: int) -> tuple[int, ...]:
    """Integer sizes summing to ``num_elements``, by largest remainder (module docstring)."""
    if num_elements < 0:
        raise ValueError(f"num_elements = {num_elements}; expected >= 0")
    if not fractions:
        raise ValueError("shard fractions: expected at least one")
    if any(not math.isfinite(f) or f < 0 for f in fractions):
        raise ValueError(f"shard fractions {list(fractions)}: expected finite values >= 0")
    total = math.fsum(fractions)
    if abs(total - 1.0) > _FRACTION_SUM_TOLERANCE:
        raise ValueError(f"shard fractions {list(fractions)} sum to {total}; expected 1")
    # Renormalise so rounding of fractions written to a file (0.333333) cannot leave a
    # remainder larger than the number of ranks.
    ideal = [f / total * num_elements for f in fractions]
    sizes = [math.floor(q) for q in ideal]
    left = num_elements - sum(sizes)
    # Only ranks with a positive fraction may receive a leftover element; a stable sort by
    # descending remainder breaks ties towards the lower index.
    order = sorted(
        (i for i, f in enumerate(fractions) if f > 0),
        key=lambda i: -(ideal[i] - sizes[i]),
    )
    assert 0 <= left <= len(order), (left, fractions)
    for i in order[:left]:
        sizes[i] += 1
    return tuple(sizes)


def shard_ranges(fractions: Sequence[float], *, num_elements: int) -> tuple[ShardRange, ...]:
    """Contiguous ranges, one per rank in group order, tiling ``[0, num_elements)``."""
    return back_to_back(shard_sizes(fractions, num_elements=num_elements))


def back_to_back(sizes: Sequence[int]) -> tuple[ShardRange, ...]:
    """Ranges of ``sizes`` elements laid one after the other from 0."""
    ranges: list[ShardRange] = []
    start = 0
    for size in sizes:
        ranges.append(ShardRange(start=start, end=start + size))
        start += size
    return tuple(ranges)


def padded_shard_size(ranges: Sequence[ShardRange]) -> int:
    """The size every shard is padded to for equal-size collectives (NCCL's ring RS/AG)."""
    return max((r.numel for r in ranges), default=0)
