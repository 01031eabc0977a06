"""A stage's price of every layer range: the matrices the layer-split DP reads.

For a stage, ``cost[a, b]`` is the time it needs per step for layers [a, b): its busy
time plus its data-parallel sync, under the best setting (``stage_settings``) that fits
every rank's memory, ``inf`` where none fits. Only Little's in-flight budget depends on
how many ranks the stage has to the pipeline's end, so ``stage_cost`` chooses among a
stage's settings for one count, range by range where the DP first asks (it needs only the
ranges that can cost less than its split's slowest stage: docs/design.md, section 6).

Where no setting fits with Little's in-flight budget, the range is priced as the exact
build (``stage_builder``) would make it: the fewest round trips rho whose budgets
w = ceil(n / rho) fit (``range_memory``: closed-form bounds, then bisection, all ranges
at once), its busy time stretched by rho over Little's round trips in ``cost_s`` so the
split steers away from it, and rho in ``rounds`` for the pipeline proxy's round-trip
bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from piebald.cost.in_flight import little_budget, mean_in_flight
from piebald.planner.layer_ranges import (
    Flags,
    Matrix,
    Positions,
    Ranges,
    range_positions,
    valid_ranges,
)
from piebald.planner.range_memory import fits_ranges
from piebald.planner.setting_pairs import SettingPairs, Shrunk
from piebald.planner.stage_settings import StageSettings

__all__ = ["TIE", "RangePrices", "StageCost", "price_ranges", "stage_cost"]

TIE = 1e-9  # relative: costs this close are equal (rounding of equal collectives)


@dataclass(frozen=True, slots=True, kw_only=True)
class RangePrices:
    """A stage's prices of some layer ranges (``price_ranges``), one entry each."""

    cost_s: Ranges  # busy (x extra round trips) + sync per step; inf: no fit
    busy_s: Ranges  # the busiest rank's compute over the step
    pass_s: Ranges  # one micro-batch through the stage on its slowest rank
    sync_s: Ranges  # the end-of-step data-parallel collectives (part of cost_s)
    optimizer_s: Ranges  # the stage's optimizer step (not part of cost_s)
    # Round trips per step a lowered in-flight budget forces; 0 where Little's fits.
    rounds: Ranges


class StageCost:
    """A stage's ``RangePrices`` of every layer range [a, b), as matrices, each range
    priced where first asked (:meth:`ensure`): the DP needs only the ranges that can beat
    the best split's slowest stage, known from ``lower_s``, below every range's cost
    whether priced or not. Where not priced yet, ``cost_s`` is inf."""

    __slots__ = (
        "_price",
        "busy_s",
        "cost_s",
        "lower_s",
        "optimizer_s",
        "pass_s",
        "priced",
        "priced_below",
        "rounds",
        "sync_s",
    )

    def __init__(self, price: Callable[[Positions], RangePrices], *, lower_s: Matrix) -> None:
        """``price``: the prices of the given ranges (positions in ``Ranges`` order)."""
        self._price, self.lower_s = price, lower_s
        self.cost_s = np.full(lower_s.shape, np.inf)
        self.busy_s = np.full(lower_s.shape, np.inf)
        self.pass_s = np.full(lower_s.shape, np.inf)
        self.sync_s = np.zeros(lower_s.shape)
        self.optimizer_s = np.zeros(lower_s.shape)
        self.rounds = np.zeros(lower_s.shape)
        self.priced = ~valid_ranges(len(lower_s))  # [a, b) with b <= a: nothing to price
        self.priced_below = -math.inf  # every range whose lower bound is below it is priced

    def ensure(self, where: Flags) -> None:
        """Price the ranges ``where`` (a matrix) not priced yet."""
        todo = where & ~self.priced
        if np.any(todo):
            prices = self._price(range_positions(len(todo))[todo])
            self.cost_s[todo] = prices.cost_s
            self.busy_s[todo] = prices.busy_s
            self.pass_s[todo] = prices.pass_s
            self.sync_s[todo] = prices.sync_s
            self.optimizer_s[todo] = prices.optimizer_s
            self.rounds[todo] = prices.rounds
            self.priced |= todo

    def ensure_below(self, bound_s: float) -> None:
        """Price every range whose lower bound is at most ``bound_s``."""
        if bound_s > self.priced_below:
            self.ensure(self.lower_s <= bound_s)
            self.priced_below = bound_s

    def ensure_at(self, layer_start: int, layer_end: int) -> None:
        """Price layers [``layer_start``, ``layer_end``) if not priced yet."""
        if not self.priced[layer_start, layer_end]:
            where = np.zeros(self.priced.shape, dtype=bool)
            where[layer_start, layer_end] = True
            self.ensure(where)


def stage_cost(stage: StageSettings, *, ranks_to_end: int) -> StageCost:
    """The stage's prices with ``ranks_to_end`` ranks from it to the pipeline's end, each
    range priced where first asked (``price_ranges``)."""

    def price(ranges: Positions) -> RangePrices:
        return price_ranges(stage, ranks_to_end=ranks_to_end, ranges=ranges)

    return StageCost(price, lower_s=stage.lower_s)


# inf and 0 entries (ranges that fit nowhere) divide freely; they are masked at the end.
@np.errstate(divide="ignore", invalid="ignore")
def price_ranges(stage: StageSettings, *, ranks_to_end: int, ranges: Positions) -> RangePrices:
    """The prices of ``ranges`` (ascending positions in ``Ranges`` order) with
    ``ranks_to_end`` ranks from the stage to the pipeline's end.

    Each range takes the cheapest setting; of equals, the one with the shorter optimizer
    step (ZeRO-1 syncs as much as none, a reduce-scatter and an all-gather for an
    all-reduce, and steps a shard), as the exact build chooses; Little's in-flight budget
    wherever some setting fits with it, and a shrunk budget (more round trips) only where
    none does. Each choice runs over a range's settings in order, but only over those near
    its cheapest: the others cannot take it (docs/design.md, section 6)."""
    # Where no setting takes a range, its cost is inf.
    prices = RangePrices(
        cost_s=np.full(len(ranges), np.inf),
        busy_s=np.full(len(ranges), np.inf),
        pass_s=np.full(len(ranges), np.inf),
        sync_s=np.zeros(len(ranges)),
        optimizer_s=np.zeros(len(ranges)),
        rounds=np.zeros(len(ranges)),
    )
    pairs = None if stage.pairs is None else stage.pairs.of_ranges(ranges)
    if pairs is None or not len(pairs.range):
        return prices  # no setting holds one micro-batch in flight there
    num_ranges = stage.num_layers * (stage.num_layers + 1) // 2
    best = np.full(num_ranges, np.inf)
    won = np.full(num_ranges, -1)  # the pair that takes each range
    rounds = np.zeros(num_ranges)
    # Little's law counts the stage's tensor groups (one pipeline lane each).
    groups_to_end = (ranks_to_end - stage.num_ranks) + pairs.groups
    littles = [
        little_budget(
            mean_in_flight(
                ranks_to_end=groups_to_end, rank_micro_batches=share, stage_micro_batches=1.0
            ),
            slack=0,
            most=kind.micro_batches,
        )
        for kind, share in zip(pairs.kinds, pairs.shares, strict=True)
    ]
    fits = fits_ranges(pairs.kinds, littles, even_shards=pairs.even, num_ranks=pairs.groups)
    cost = np.where(fits, pairs.cost, np.inf)
    _cheapest(pairs, pairs.near(cost), cost=cost, best=best, won=won)
    none_fit = np.isinf(best)
    if np.any(none_fit):
        shrunk = pairs.shrunk(littles, where=none_fit[pairs.range])
        _cheapest_shrunk(pairs, shrunk, best=best, won=won, rounds=rounds)
    won = won[ranges]
    taken = won >= 0
    at = won[taken]
    for values, of_winners in (
        (prices.cost_s, best[ranges][taken]),
        (prices.busy_s, pairs.busy[at]),
        (prices.pass_s, pairs.slowest[at]),
        (prices.sync_s, pairs.sync[at]),
        (prices.optimizer_s, pairs.optimizer[at]),
        (prices.rounds, rounds[ranges][taken]),
    ):
        values[taken] = of_winners
    return prices


def _cheapest(
    pairs: SettingPairs, items: Positions, *, cost: Ranges, best: Ranges, won: Positions
) -> None:
    """Each range to the cheapest of its ``items`` (pairs in order) priced ``cost``, with
    the tie rule taken setting after setting: a setting within ``TIE`` of the best so far
    takes it only with a shorter optimizer step. ``best`` and ``won`` (by range) in place."""
    best_optimizer = np.full(best.shape, np.inf)
    for chunk in _in_turn(items, pairs.range):
        ranges, chunk_cost = pairs.range[chunk], cost[chunk]
        optimizer, so_far = pairs.optimizer[chunk], best[ranges]
        tie = np.isfinite(so_far) & (np.abs(chunk_cost - so_far) <= TIE * so_far)
        better = ((chunk_cost < so_far) & ~tie) | (tie & (optimizer < best_optimizer[ranges]))
        ranges = ranges[better]
        best[ranges] = chunk_cost[better]
        best_optimizer[ranges] = optimizer[better]
        won[ranges] = chunk[better]


def _cheapest_shrunk(
    pairs: SettingPairs, shrunk: Shrunk, *, best: Ranges, won: Positions, rounds: Ranges
) -> None:
    """``_cheapest`` with shrunk budgets, in the order of the settings: a setting takes a
    range where its stretched cost is lower than the best so far, and neither its cost
    unstretched nor its lower bound (``Shrunk.bound``) is not. In place, with the round
    trips of each range taken."""
    for turn in _in_turn(np.arange(len(shrunk.at)), pairs.range[shrunk.at]):
        chunk = shrunk.at[turn]
        ranges, so_far = pairs.range[chunk], best[pairs.range[chunk]]
        cost = shrunk.cost[turn]
        better = (pairs.cost[chunk] < so_far) & ~(shrunk.bound[turn] >= so_far) & (cost < so_far)
        ranges = ranges[better]
        best[ranges] = cost[better]
        won[ranges] = chunk[better]
        rounds[ranges] = shrunk.rounds[turn][better]


def _in_turn(items: Positions, keys: Positions) -> Iterator[Positions]:
    """``items`` (ascending, and so their ``keys``) in turns: the first of each key, then
    the second, ..."""
    if not len(items):
        return
    of = keys[items]
    first = np.flatnonzero(np.r_[True, of[1:] != of[:-1]])
    turn = np.arange(len(items)) - np.repeat(first, np.diff(np.r_[first, len(items)]))
    for index in range(int(turn.max()) + 1):
        yield items[turn == index]
