"""Where pipeline stages start: the depths to try, speed-quantile cuts, required cuts.

Stages are contiguous runs of units in an order; a cut is the index of the first unit of
a stage. Pure functions of the units.
"""

from __future__ import annotations

import itertools

import numpy as np

from piebald.planner.search_units import Unit
from piebald.planner.strategies import Strategy

__all__ = ["depths_to_try", "quantile_cuts", "required_cuts", "stages_of"]


def depths_to_try(limit: int) -> list[int]:
    """Every depth up to 8, then a geometric-ish ladder up to 64."""
    small = list(range(1, min(limit, 8) + 1))
    large = [d for d in (10, 12, 16, 20, 24, 32, 40, 48, 64) if d <= limit]
    return small + large


def quantile_cuts(
    units: tuple[Unit, ...], depth: int, required: frozenset[int]
) -> tuple[int, ...] | None:
    """Cut positions (1..K-1) splitting summed peak FLOP/s into equal parts, plus required."""
    free = depth - 1 - len(required)
    if free < 0:
        return None
    speeds = np.cumsum([u.peak_flops for u in units])
    cuts = set(required)
    for i in range(1, depth):
        if len(cuts) >= depth - 1:
            break
        target = speeds[-1] * i / depth
        position = int(np.searchsorted(speeds, target)) + 1
        for offset in range(len(units)):  # nearest free position
            for candidate in (position - offset, position + offset):
                if 0 < candidate < len(units) and candidate not in cuts:
                    cuts.add(candidate)
                    break
            else:
                continue
            break
    return tuple(sorted(cuts)) if len(cuts) == depth - 1 else None


def stages_of(units: tuple[Unit, ...], cuts: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    edges = (0, *cuts, len(units))
    return tuple(
        tuple(itertools.chain.from_iterable(unit.ranks for unit in units[a:b]))
        for a, b in itertools.pairwise(edges)
    )


def required_cuts(units: tuple[Unit, ...], strategy: Strategy) -> frozenset[int]:
    """Cut positions a strategy requires (type or domain changes between neighbours)."""
    required = set()
    for position in range(1, len(units)):
        left, right = units[position - 1], units[position]
        if strategy.type_homogeneous_stages and left.device != right.device:
            required.add(position)
        if strategy.domain_stages and left.domain != right.domain:
            required.add(position)
    return frozenset(required)
