"""The coarse structures a search prices with the DP: pipeline depths over an order of
units, the cuts between stages, and Megatron's grids.

Cuts are enumerated exhaustively while there are few (``SearchSettings.most_exhaustive_cuts``);
otherwise they start at the speed quantiles and move by halving steps while the DP's
estimate improves (a local search, never Zorse's repeated min-cuts or Metis' full
enumeration).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

from piebald.planner.cuts import depths_to_try, quantile_cuts, required_cuts, stages_of
from piebald.planner.improvement import improves
from piebald.planner.search.records import DepthScan
from piebald.planner.search.state import SearchState
from piebald.planner.search_units import Unit

__all__ = ["grid_candidates", "scan_depths"]


def scan_depths(
    state: SearchState,
    units: tuple[Unit, ...],
    size: int,
    *,
    refine: bool,
    depths: Iterable[int] | None = None,
) -> list[DepthScan]:
    """The best proxy of every depth tried for one order and micro-batch size (``depths``,
    or every depth ``cuts.depths_to_try`` gives, stopping once ``depth_patience`` depths
    that fit bring no improvement in a row); ``refine``: cuts beyond exhaustive reach get a
    local search."""
    required = required_cuts(units, state.strategy)
    limit = min(len(units), state.model.num_layers, state.strategy.max_stages)
    results: list[DepthScan] = []
    best, patience = math.inf, 0
    for depth in depths if depths is not None else depths_to_try(limit):
        if depth - 1 < len(required) or depth > limit:
            continue
        value = _best_cuts(state, units, depth, size, required, refine=refine)
        results.append(DepthScan(proxy_s=value, depth=depth))
        if improves(value, best):
            best, patience = value, 0
        elif math.isfinite(value):
            # Only a depth that fits and is no faster counts: one that fits nowhere says
            # nothing about deeper ones (a one-stage ZeRO-3 plan can fit where shallow
            # pipelines, ZeRO-1 at most, do not; deeper ones hold fewer layers per rank).
            patience += 1
            if patience >= state.settings.depth_patience and depths is None:
                break
    return results


def _best_cuts(
    state: SearchState,
    units: tuple[Unit, ...],
    depth: int,
    size: int,
    required: frozenset[int],
    *,
    refine: bool,
) -> float:
    """The best proxy over the cuts of ``depth`` stages: every combination while there are
    few, else the speed quantiles, moved by a local search with ``refine``."""
    positions = [p for p in range(1, len(units)) if p not in required]
    free = depth - 1 - len(required)
    if math.comb(len(positions), free) <= state.settings.most_exhaustive_cuts(depth):
        best = math.inf
        for chosen in itertools.combinations(positions, free):
            cuts = tuple(sorted((*required, *chosen)))
            best = min(best, state.price(stages_of(units, cuts), size))
        return best
    start = quantile_cuts(units, depth, required)
    if start is None:
        return math.inf
    cuts = start
    value = state.price(stages_of(units, cuts), size)
    if refine:
        cuts, value = _local_search(state, units, size, cuts, value, required)
    return value


def _local_search(
    state: SearchState,
    units: tuple[Unit, ...],
    size: int,
    cuts: tuple[int, ...],
    value: float,
    required: frozenset[int],
) -> tuple[tuple[int, ...], float]:
    """Move one cut at a time by halving steps while the estimate improves: one sweep per
    step size, the whole schedule at most ``local_search_rounds`` times."""
    for _ in range(state.settings.local_search_rounds):
        start_value = value
        step = max(1, len(units) // (2 * (len(cuts) + 1)))
        while step >= 1:
            for index, cut in enumerate(cuts):
                if cut in required:
                    continue
                low = cuts[index - 1] if index else 0
                high = cuts[index + 1] if index + 1 < len(cuts) else len(units)
                for moved in (cut - step, cut + step):
                    if not low < moved < high:
                        continue
                    trial = (*cuts[:index], moved, *cuts[index + 1 :])
                    trial_value = state.price(stages_of(units, trial), size)
                    if improves(trial_value, value):
                        cuts, value = trial, trial_value
                        break
            step //= 2
        if not improves(value, start_value):
            break
    return cuts, value


def grid_candidates(state: SearchState, size: int) -> None:
    """Megatron's p x d grids over the fastest GPUs, layers split evenly."""
    gpus = sorted(
        state.cluster.gpus,
        key=lambda g: (-g.device.training_peak_flops(state.job.precision), g.rank),
    )
    total = len(gpus)
    # Useful grid sizes: the whole cluster, or exactly the fastest k types.
    sizes = {total}
    for k in range(1, total):
        if gpus[k].device != gpus[k - 1].device:
            sizes.add(k)
    for depth in depths_to_try(min(total, state.model.num_layers, state.strategy.max_stages)):
        for used in sizes:
            degree = used // depth
            if degree < 1:
                continue
            chosen = sorted(g.rank for g in gpus[: depth * degree])
            stages = tuple(tuple(chosen[i * degree : (i + 1) * degree]) for i in range(depth))
            state.price(stages, size)
