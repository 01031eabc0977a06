"""Exact contiguous split of layers over pipeline stages (a bottleneck dynamic program).

Given, for every stage s, the matrix ``cost[s][a, b]`` of running layers [a, b) on that
stage (``inf`` where they do not fit its memory or where b <= a), find boundaries
0 = e_0 < e_1 < ... < e_p = L minimising max_s cost[s][e_s, e_{s+1}]. The recurrence is
Alpa's stage DP (Zheng et al. 2022) with a bottleneck instead of a sum:

    best[s][b] = min_a max(best[s-1][a], cost[s][a, b])

Each stage is one vectorised numpy step over an (L+1) x (L+1) matrix, O(p L^2) in all.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["split_layers", "uniform_bounds"]

FloatMatrix = npt.NDArray[np.float64]


def split_layers(costs: Sequence[FloatMatrix]) -> tuple[float, tuple[int, ...]]:
    """(bottleneck cost, boundaries e_0..e_p) of the best split; (inf, ()) if none fits.

    Ties go to the split that gives earlier stages fewer layers (the argmin's first hit).
    """
    if not costs:
        raise ValueError("no stages to split layers over")
    size = costs[0].shape[0]
    for index, cost in enumerate(costs):
        if cost.shape != (size, size):
            raise ValueError(f"stage {index}: cost matrix {cost.shape}, expected {(size, size)}")
    num_layers = size - 1
    best = np.full(size, np.inf)
    best[0] = 0.0
    choices: list[npt.NDArray[np.intp]] = []
    for cost in costs:
        # candidate[a, b] = max(best[a], cost[a, b]); the new best[b] minimises over a.
        candidate = np.maximum(best[:, None], cost)
        argmin = np.argmin(candidate, axis=0)
        best = candidate[argmin, np.arange(size)]
        choices.append(argmin)
    value = float(best[num_layers])
    if not np.isfinite(value):
        return float("inf"), ()
    bounds = [num_layers]
    for argmin in reversed(choices):
        bounds.append(int(argmin[bounds[-1]]))
    bounds.reverse()
    assert bounds[0] == 0 and all(a < b for a, b in itertools.pairwise(bounds))
    return value, tuple(bounds)


def uniform_bounds(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers split as evenly as possible, earlier stages taking the remainder."""
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for index in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if index < extra else 0))
    return tuple(bounds)
