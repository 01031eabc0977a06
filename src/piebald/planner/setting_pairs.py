"""A stage's settings stacked range by range for the layer-split DP's choice: the pairs
(setting, layer range) where a setting holds one micro-batch in flight per rank, each
range's pairs a segment, and the pairs that may take a range no setting fits with
Little's budget at their fewest round trips (``range_memory.FewestRounds``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from piebald.cost.in_flight import stage_round_trips
from piebald.planner.layer_ranges import Flags, Positions, Ranges
from piebald.planner.range_memory import FewestRounds, RankRoom, fits_ranges

if TYPE_CHECKING:
    from piebald.planner.stage_settings import Setting

__all__ = ["NEAR", "Segments", "SettingPairs", "Shrunk"]

# Relative: settings further than twice this above a range's cheapest cannot take it, the
# ties' drift included (up to one ``stage_costs.TIE`` per setting).
NEAR = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Shrunk:
    """The pairs (``at``, ascending) that may take a range that no setting fits with
    Little's budget, each at its fewest round trips: ``cost`` (busy stretched by them over
    Little's, plus sync), ``rounds``, and the ``bound`` on the cost the choice checks
    first (from ``FewestRounds.low``)."""

    at: Positions
    cost: Ranges
    rounds: Ranges
    bound: Ranges


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingPairs:
    """``StageSettings``' pairs: each setting's values at each range where it holds one
    micro-batch in flight, ordered by range, then setting (a range's pairs are a
    segment of ``segments``); or those of some ranges (``of_ranges``)."""

    range: Positions
    segments: Segments
    origin: Positions  # each pair's position among all of the stage's (``fewest``'s)
    busy: Ranges
    sync: Ranges
    cost: Ranges  # busy + sync
    slowest: Ranges
    optimizer: Ranges
    groups: Ranges  # the setting's tensor groups
    even: Flags
    kinds: tuple[RankRoom, ...]  # counts per pair
    shares: tuple[Ranges, ...]
    fewest: FewestRounds

    @classmethod
    @np.errstate(divide="ignore", invalid="ignore")  # masked where they happen
    def of(cls, settings: Sequence[Setting]) -> SettingPairs:
        devices = settings[0].devices
        assert all(s.devices == devices for s in settings), "a stage's GPU types, in order"
        num_ranges = len(settings[0].busy)

        # A setting takes a range only where each rank holds one micro-batch in flight
        # (Little's budget is at least 1).
        live = [
            np.flatnonzero(
                fits_ranges(
                    s.kinds,
                    [1.0] * len(s.kinds),
                    even_shards=s.even_shards,
                    num_ranks=s.num_groups,
                )
            )
            for s in settings
        ]
        # The pairs in order of range, then setting.
        ranges = np.concatenate(live)
        order = np.argsort(ranges, kind="stable")
        ranges = ranges[order]
        setting = np.concatenate([np.full(len(at), i) for i, at in enumerate(live)])[order]
        flat = setting * num_ranges + ranges

        def stacked(values: Sequence[Ranges | float]) -> Ranges:
            """One value per setting (per range, or one for all) at every pair."""
            rows = [np.full(num_ranges, v) if isinstance(v, float) else v for v in values]
            result: Ranges = np.concatenate(rows)[flat]
            return result

        def each(values: Sequence[int | Ranges]) -> Ranges:
            per_setting = np.array(values, dtype=np.float64)
            result: Ranges = per_setting[setting]
            return result

        kinds = tuple(
            RankRoom(
                count=each([s.kinds[k].count for s in settings]),
                free_bytes=stacked([s.kinds[k].free_bytes for s in settings]),
                per_in_flight_bytes=stacked([s.kinds[k].per_in_flight_bytes for s in settings]),
                sharded_bytes=stacked([s.kinds[k].sharded_bytes for s in settings]),
                micro_batches=stacked([s.kinds[k].micro_batches for s in settings]),
            )
            for k in range(len(devices))
        )
        groups = each([s.num_groups for s in settings])
        even = each([s.even_shards for s in settings]) > 0
        busy, sync = stacked([s.busy for s in settings]), stacked([s.sync for s in settings])
        return cls(
            range=ranges,
            segments=Segments.of(ranges),
            origin=np.arange(len(ranges)),
            busy=busy,
            sync=sync,
            cost=busy + sync,
            slowest=stacked([s.slowest for s in settings]),
            optimizer=stacked([s.optimizer for s in settings]),
            groups=groups,
            even=even,
            kinds=kinds,
            shares=tuple(stacked([s.shares[k] for s in settings]) for k in range(len(devices))),
            fewest=FewestRounds(kinds, even_shards=even, num_ranks=groups),
        )

    def of_ranges(self, ranges: Positions) -> SettingPairs:
        """The pairs of ``ranges`` (ascending positions) only."""
        starts = self.segments.starts
        of_run = self.range[starts]  # each run's range, ascending
        runs = np.searchsorted(of_run, ranges)
        inside = runs < len(starts)
        runs = runs[inside][of_run[runs[inside]] == ranges[inside]]
        if len(runs) == len(starts):
            return self
        lengths = np.r_[starts[1:], len(self.range)][runs] - starts[runs]
        before = np.cumsum(lengths) - lengths
        at = np.repeat(starts[runs] - before, lengths) + np.arange(int(lengths.sum()))
        return SettingPairs(
            range=self.range[at],
            segments=Segments.of(self.range[at]),
            origin=self.origin[at],
            busy=self.busy[at],
            sync=self.sync[at],
            cost=self.cost[at],
            slowest=self.slowest[at],
            optimizer=self.optimizer[at],
            groups=self.groups[at],
            even=self.even[at],
            kinds=tuple(kind.at(at) for kind in self.kinds),
            shares=tuple(share[at] for share in self.shares),
            fewest=self.fewest,
        )

    def near(self, cost: Ranges) -> Positions:
        """The pairs that may take their range at ``cost`` (inf: not at all), in order."""
        near, whole = self.segments.near(cost)
        return np.flatnonzero(near | (whole & np.isfinite(cost)))

    def shrunk(self, littles: Sequence[Ranges], *, where: Flags) -> Shrunk:
        """The pairs ``where`` that may take their range at their fewest round trips
        (``near``), with Little's budgets ``littles``."""
        low_bound = self.fewest.low[self.origin]
        at = np.flatnonzero(where & np.isfinite(self.cost) & np.isfinite(low_bound))
        segments = Segments.of(self.range[at])
        little: Ranges = stage_round_trips(
            [kind.micro_batches[at] for kind in self.kinds], [budget[at] for budget in littles]
        )
        bound = self.busy[at] * self.fewest.low_at(self.origin[at], little) / little
        bound += self.sync[at]

        def priced(chosen: Flags) -> tuple[Ranges, Ranges]:
            """(cost, rounds) of the pairs ``at[chosen]``."""
            rounds = self.fewest.rounds_at(self.origin[at[chosen]], little[chosen])
            stretch = rounds / little[chosen]
            return self.busy[at[chosen]] * stretch + self.sync[at[chosen]], rounds

        def where_chosen(chosen: Flags) -> Ranges:
            """The cost of the pairs ``at[chosen]``, inf at the others."""
            cost = np.full(len(at), np.inf)
            cost[chosen] = priced(chosen)[0]
            return cost

        # A cost to beat in each range, the pair with the least bound's: only pairs whose
        # bound is below it, with room for rounding, need their fewest round trips.
        beat = segments.least(where_chosen(bound == segments.least(bound)))
        near, whole = segments.near(where_chosen(bound < beat * (1.0 + 4.0 * NEAR)))
        taken = near | whole
        cost, rounds = priced(taken)
        return Shrunk(at=at[taken], cost=cost, rounds=rounds, bound=bound[taken])


@dataclass(frozen=True, slots=True, kw_only=True)
class Segments:
    """The runs of equal values in an ascending array (a range's pairs)."""

    starts: Positions
    index: Positions  # each element's run

    @classmethod
    def of(cls, values: Positions) -> Segments:
        change = np.r_[True, values[1:] != values[:-1]] if len(values) else values > 0
        return cls(starts=np.flatnonzero(change), index=np.cumsum(change) - 1)

    def least(self, values: Ranges) -> Ranges:
        """At each element, the least of its run's ``values`` (nan ignored)."""
        if not len(values):
            return values
        least: Ranges = np.fmin.reduceat(values, self.starts)[self.index]
        return least

    def near(self, cost: Ranges) -> tuple[Flags, Flags]:
        """(the elements near their run's cheapest at ``cost``, inf: not at all; the
        elements of runs where others are a little further, not far: those take all)."""
        finite = np.isfinite(cost)
        least = self.least(cost)
        near = finite & (cost <= least * (1.0 + NEAR))
        further = finite & ~near & (cost < least * (1.0 + 2.0 * NEAR))
        if not np.any(further):
            return near, further
        return near, np.logical_or.reduceat(further, self.starts)[self.index]
