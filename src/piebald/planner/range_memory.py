"""Whether a stage's ranks fit their memory, over every layer range at once, and the fewest
1F1B round trips that fit where Little's in-flight budget does not.

The layer-split DP's version of the exact stage build's in-flight fit
(``stage_builder._fit_in_flight``): each GPU type's ranks of a stage (:class:`RankKind`)
have, per layer range, the memory left beside everything but activations, the bytes of
one micro-batch in flight and of one unit of shard fraction; they fit holding a budget
where every rank does and, with uneven shards, the free memory of all of them holds the
sharded state (water-filling succeeds). Where Little's budget does not fit, the budget
shrinks to the fewest round trips rho whose budgets w = ceil(n / rho) fit
(``cost.in_flight.in_flight_for_rounds``): closed-form bounds on rho, then bisection, all
ranges at once (:meth:`RangeMemory.shrunk_at`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from piebald.cost.in_flight import in_flight_for_rounds, num_round_trips

__all__ = ["RangeMemory", "Ranges", "RankKind", "Room", "fits_ranges"]

# One entry per layer range [a, b) with a < b (or a subset of them).
Ranges = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class Room:
    """The memory of the ranks of one GPU type in a stage, over every layer range (or a
    subset of them)."""

    count: int
    free_bytes: Ranges  # memory less everything but activations
    per_in_flight_bytes: Ranges
    sharded_bytes: Ranges  # per unit of shard fraction


@dataclass(frozen=True, slots=True, kw_only=True)
class RankKind(Room):
    """The ranks of one GPU type in a stage, with their micro-batches and in-flight budget."""

    micro_batches: Ranges  # each rank's, from its speed share
    little: Ranges  # Little's in-flight budget

    def at(self, where: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> RankKind:
        return RankKind(
            count=self.count,
            free_bytes=self.free_bytes[where],
            per_in_flight_bytes=self.per_in_flight_bytes[where],
            sharded_bytes=self.sharded_bytes[where],
            micro_batches=self.micro_batches[where],
            little=self.little[where],
        )

    def budget(self, rounds: Ranges | None) -> Ranges:
        """In flight under Little's budget (None) or the fewest for ``rounds`` round trips
        (``cost.in_flight.in_flight_for_rounds``)."""
        if rounds is None:
            return self.little
        budget: Ranges = in_flight_for_rounds(
            budget=self.little, rank_micro_batches=self.micro_batches, num_rounds=rounds
        )
        return budget

    def most_in_flight(self, reserved_bytes: Ranges | float) -> Ranges:
        """The most micro-batches in flight that leave ``reserved_bytes`` free."""
        room = (self.free_bytes - reserved_bytes) / self.per_in_flight_bytes
        return np.where(self.per_in_flight_bytes > 0, np.floor(room), np.inf)


def fits_ranges(
    rooms: Sequence[Room],
    budgets: Sequence[Ranges | float],
    *,
    even_shards: bool,
    num_ranks: int,
) -> npt.NDArray[np.bool_]:
    """Where every rank fits holding its budget in flight: with even shards each on its
    own, otherwise each on its own and the free memory of all ranks together holds the
    sharded state (water-filling succeeds)."""
    all_fit: npt.NDArray[np.bool_] | None = None
    shard_capacity: Ranges | None = None  # sum of free / sharded bytes
    for room, budget in zip(rooms, budgets, strict=True):
        free = room.free_bytes - budget * room.per_in_flight_bytes
        if even_shards:
            fit = free >= room.sharded_bytes / num_ranks
        else:
            fit = free >= 0
            capacity = room.count * np.where(
                room.sharded_bytes > 0, free / room.sharded_bytes, np.inf
            )
            shard_capacity = capacity if shard_capacity is None else shard_capacity + capacity
        all_fit = fit if all_fit is None else all_fit & fit
    assert all_fit is not None, "a stage has ranks"
    if shard_capacity is not None:
        all_fit &= shard_capacity >= 1.0
    return all_fit


@dataclass(frozen=True, slots=True, kw_only=True)
class RangeMemory:
    """Whether a stage's ranks fit (:func:`fits_ranges`), over every layer range or a subset."""

    kinds: list[RankKind]
    even_shards: bool
    num_ranks: int

    def at(self, where: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> RangeMemory:
        return RangeMemory(
            kinds=[k.at(where) for k in self.kinds],
            even_shards=self.even_shards,
            num_ranks=self.num_ranks,
        )

    def fits(self, rounds: Ranges | None) -> npt.NDArray[np.bool_]:
        """Where every rank fits holding Little's budget (None) or that of ``rounds``."""
        return fits_ranges(
            self.kinds,
            [kind.budget(rounds) for kind in self.kinds],
            even_shards=self.even_shards,
            num_ranks=self.num_ranks,
        )

    def fits_one(self) -> npt.NDArray[np.bool_]:
        """Where every rank fits holding one micro-batch in flight (the most round trips)."""
        return fits_ranges(
            self.kinds,
            [1.0] * len(self.kinds),
            even_shards=self.even_shards,
            num_ranks=self.num_ranks,
        )

    def little_rounds(self) -> Ranges:
        """Round trips Little's budget needs: 1F1B finishes w micro-batches per trip."""
        rounds: Ranges = np.maximum.reduce(
            [num_round_trips(k.micro_batches, k.little) for k in self.kinds]
        )
        return rounds

    def round_bounds(self) -> tuple[Ranges, Ranges]:
        """(rho_low, rho_high): no fewer round trips fit than rho_low, and rho_high fit
        where anything does. Each rank on its own needs w <= W (the most in flight its
        memory holds), exactly rho >= ceil(n / W); with uneven shards the ranks together
        also need sum_k t_k w_k <= S (t_k: a micro-batch's share of the sharded capacity,
        S: the capacity left over one whole state), and n / rho <= w <= n / rho + 1."""
        little = self.little_rounds()
        low = little
        for kind in self.kinds:
            reserved = kind.sharded_bytes / self.num_ranks if self.even_shards else 0.0
            most = kind.most_in_flight(reserved)
            alone = np.where(kind.little > most, np.ceil(kind.micro_batches / most), 0.0)
            low = np.maximum(low, np.where(most >= 1, alone, np.inf))
        if self.even_shards:
            return low, low
        spare = -np.ones(low.shape)  # S
        per_rounds = np.zeros(low.shape)  # sum_k t_k n_k
        per_extra = np.zeros(low.shape)  # sum_k t_k
        for kind in self.kinds:
            sharded = np.where(kind.sharded_bytes > 0, kind.sharded_bytes, np.inf)
            weight = kind.count * kind.per_in_flight_bytes / sharded
            spare += kind.count * kind.free_bytes / sharded
            per_rounds += weight * kind.micro_batches
            per_extra += weight
        high = np.maximum(
            low,
            np.where(spare > per_extra, np.ceil(per_rounds / (spare - per_extra)), np.inf),
        )
        low = np.maximum(low, np.where(spare > 0, np.ceil(per_rounds / spare), np.inf))
        return low, np.maximum(low, high)

    def shrunk(
        self,
        where: npt.NDArray[np.bool_],
        *,
        busy: Ranges,
        sync: Ranges,
        beat: Ranges,
    ) -> tuple[Ranges, Ranges]:
        """(rho over Little's round trips, rho) for the ranges ``where`` Little's budget
        does not fit, at the fewest round trips rho that fit; (inf, 0) where none fit or
        where even the lower bound's stretch cannot ``beat`` the given cost."""
        stretch = np.full(busy.shape, np.inf)
        rounds = np.zeros(busy.shape)
        positions, stretch_at, rounds_at = self.shrunk_at(where, busy=busy, sync=sync, beat=beat)
        stretch[positions] = stretch_at
        rounds[positions] = rounds_at
        return stretch, rounds

    def shrunk_at(
        self,
        where: npt.NDArray[np.bool_],
        *,
        busy: Ranges,
        sync: Ranges,
        beat: Ranges,
    ) -> tuple[npt.NDArray[np.intp], Ranges, Ranges]:
        """``shrunk`` at the ranges where it is finite only: (their positions, rho over
        Little's round trips, rho)."""
        # A stretch is at least 1, and one micro-batch in flight per rank must fit.
        positions = np.flatnonzero(where & (busy + sync < beat))
        nothing = (positions[:0], np.zeros(0), np.zeros(0))
        if not len(positions):
            return nothing
        # From here on only those ranges.
        part = self.at(positions)
        one_fits = part.fits_one()
        if not np.all(one_fits):
            if not np.any(one_fits):
                return nothing
            positions, part = positions[one_fits], part.at(one_fits)
        most = np.maximum.reduce([k.micro_batches for k in part.kinds])
        little = part.little_rounds()
        low, high = part.round_bounds()
        # Where even the fewest round trips that might fit cannot win, look no closer.
        hopeless = busy[positions] * low / little + sync[positions] >= beat[positions]
        high = np.minimum(high, most)
        fits_low = part.fits(low)
        high = np.where(hopeless | fits_low, low, np.where(part.fits(high), high, most))
        low = np.where(fits_low, low, low + 1)
        # Bisection: memory only falls as the round trips grow; high always fits.
        while np.any(low < high):
            middle = np.floor((low + high) / 2)
            fits = part.fits(middle)
            open_ = low < high
            high = np.where(open_ & fits, middle, high)
            low = np.where(open_ & ~fits, middle + 1, low)
        hope = ~hopeless
        return positions[hope], high[hope] / little[hope], high[hope]
