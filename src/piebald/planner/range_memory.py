"""Whether a stage's ranks fit their memory, over every layer range at once, and the fewest
1F1B round trips that fit where Little's in-flight budget does not.

The layer-split DP's version of the exact stage build's in-flight fit
(``stage_builder._fit_in_flight``): each GPU type's ranks of a stage (:class:`RankRoom`)
have, per layer range, the memory left beside everything but activations, the bytes of
one micro-batch in flight and of one unit of shard fraction; they fit holding a budget
where every rank does and, with uneven shards, the free memory of all of them holds the
sharded state (water-filling succeeds). Where Little's budget does not fit, the budget
shrinks to the fewest round trips rho whose budgets w = ceil(n / rho) fit
(``cost.in_flight.in_flight_for_rounds``): closed-form bounds on rho, then bisection, all
ranges at once (:class:`FewestRounds`, :meth:`FewestRounds.rounds_at`). From the round
trips Little's budget needs on, those budgets do not depend on it, so the bisection is
done once per stage and shared by every in-flight budget (docs/design.md, section 6).

The entries need not be one stage's ranges: the planner also stacks the ranges of several
settings of a stage, each entry with its own rank count, shard rule and group size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from piebald.cost.in_flight import in_flight_for_rounds

__all__ = ["FewestRounds", "Ranges", "RankRoom", "Room", "fits_ranges"]

# One entry per layer range [a, b) with a < b (or a subset of them).
Ranges = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
Where = Flags | npt.NDArray[np.intp]


def _at(value: int | Ranges, where: Where) -> int | Ranges:
    """``value`` at ``where`` where it varies by entry."""
    return value[where] if isinstance(value, np.ndarray) else value


@dataclass(frozen=True, slots=True, kw_only=True)
class Room:
    """The memory of the ranks of one GPU type in a stage, over every layer range (or a
    subset of them)."""

    count: int | Ranges  # per entry where the entries are of several settings
    free_bytes: Ranges  # memory less everything but activations
    per_in_flight_bytes: Ranges
    sharded_bytes: Ranges  # per unit of shard fraction

    def most_in_flight(self, reserved_bytes: Ranges | float) -> Ranges:
        """The most micro-batches in flight that leave ``reserved_bytes`` free."""
        room = (self.free_bytes - reserved_bytes) / self.per_in_flight_bytes
        return np.where(self.per_in_flight_bytes > 0, np.floor(room), np.inf)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankRoom(Room):
    """The ranks of one GPU type in a stage, with their micro-batches (from their speed
    share)."""

    micro_batches: Ranges  # each rank's, from its speed share

    def at(self, where: Where) -> RankRoom:
        return RankRoom(
            count=_at(self.count, where),
            free_bytes=self.free_bytes[where],
            per_in_flight_bytes=self.per_in_flight_bytes[where],
            sharded_bytes=self.sharded_bytes[where],
            micro_batches=self.micro_batches[where],
        )


def fits_ranges(
    rooms: Sequence[Room],
    budgets: Sequence[Ranges | float],
    *,
    even_shards: bool | Flags,
    num_ranks: int | Ranges,
) -> Flags:
    """Where every rank fits holding its budget in flight: with even shards each on its
    own, otherwise each on its own and the free memory of all ranks together holds the
    sharded state (water-filling succeeds). ``even_shards`` and ``num_ranks`` may differ
    by entry."""
    if isinstance(even_shards, np.ndarray):
        even = _fits(rooms, budgets, even_shards=True, num_ranks=num_ranks)
        uneven = _fits(rooms, budgets, even_shards=False, num_ranks=num_ranks)
        fits: Flags = np.where(even_shards, even, uneven)
        return fits
    return _fits(rooms, budgets, even_shards=even_shards, num_ranks=num_ranks)


def _fits(
    rooms: Sequence[Room],
    budgets: Sequence[Ranges | float],
    *,
    even_shards: bool,
    num_ranks: int | Ranges,
) -> Flags:
    all_fit: Flags | None = None
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


class FewestRounds:
    """Per entry, the fewest round trips rho, from a closed-form lower bound (:attr:`low`)
    up, whose budgets max(1, ceil(n / rho)) fit the ranks (inf where none do): what a
    shrunk in-flight budget needs of the ranks' memory and micro-batches, which does not
    depend on Little's budget (:meth:`rounds_at`). Searched where first asked (:meth:`at`), then
    remembered, so that every in-flight budget of the same ranks shares the search. The
    bound too is computed where first asked: most stages fit Little's budget everywhere
    and never ask."""

    __slots__ = ("_found", "_low", "even_shards", "kinds", "num_ranks")

    def __init__(
        self,
        kinds: Sequence[RankRoom],
        *,
        even_shards: bool | Flags,
        num_ranks: int | Ranges,
    ) -> None:
        self.kinds, self.even_shards, self.num_ranks = tuple(kinds), even_shards, num_ranks
        self._low: Ranges | None = None
        self._found: Ranges | None = None  # nan: not searched yet

    @property
    def low(self) -> Ranges:
        """The closed-form lower bound on the round trips (``_lower_bound``)."""
        if self._low is None:
            self._low = self._lower_bound()
        return self._low

    def _lower_bound(self) -> Ranges:
        """No fewer round trips fit: each rank on its own needs w <= W (the most in flight
        its memory holds), exactly rho >= ceil(n / W); with uneven shards the ranks together
        also need sum_k t_k w_k <= S (t_k: a micro-batch's share of the sharded capacity, S:
        the capacity left over one whole state), and w >= n / rho. At least 1."""
        even = self.even_shards
        low = np.ones(self.kinds[0].micro_batches.shape)
        with np.errstate(divide="ignore", invalid="ignore"):  # masked where it happens
            for kind in self.kinds:
                reserved: Ranges | float = 0.0
                if isinstance(even, np.ndarray):
                    reserved = np.where(even, kind.sharded_bytes / self.num_ranks, 0.0)
                elif even:
                    reserved = kind.sharded_bytes / self.num_ranks
                most = kind.most_in_flight(reserved)
                alone = np.where(most >= 1, np.ceil(kind.micro_batches / most), np.inf)
                low = np.maximum(low, alone)
            if even is not True:
                spare, per_rounds, _ = _shard_terms(self.kinds)
                shards = np.where(spare > 0, np.ceil(per_rounds / spare), np.inf)
                low = np.maximum(low, shards if even is False else np.where(even, 1.0, shards))
        return low

    def at(self, positions: npt.NDArray[np.intp]) -> Ranges:
        """The fewest round trips at ``positions`` (inf where none fit)."""
        if self._found is None:
            self._found = np.full(self.low.shape, np.nan)
        found = self._found[positions]
        missing = np.isnan(found)
        if np.any(missing):
            where = positions[missing]
            found[missing] = self._found[where] = self._search(where)
        return found

    def low_at(self, positions: npt.NDArray[np.intp], little: Ranges) -> Ranges:
        """A bound below :meth:`rounds_at`, in closed form."""
        bound: Ranges = np.maximum(little, self.low[positions])
        return bound

    def rounds_at(self, positions: npt.NDArray[np.intp], little: Ranges) -> Ranges:
        """The fewest round trips at ``positions`` whose budgets fit, where Little's budget
        takes ``little`` round trips (``cost.in_flight.stage_round_trips``) and does not
        fit: no fewer than Little's, as from there on its budget never caps the ranks'
        (docs/design.md, section 6); inf where none fit."""
        rounds: Ranges = np.maximum(little, self.at(positions))
        return rounds

    def _search(self, where: npt.NDArray[np.intp]) -> Ranges:
        result = np.full(len(where), np.inf)
        kinds = [kind.at(where) for kind in self.kinds]
        even, num_ranks = _at_flags(self.even_shards, where), _at(self.num_ranks, where)
        # One micro-batch in flight per rank (the most round trips) must fit, and a bound
        # beyond every rank's micro-batches leaves one in flight each.
        low = self.low[where]
        search = fits_ranges(kinds, [1.0] * len(kinds), even_shards=even, num_ranks=num_ranks)
        search &= np.isfinite(low)
        if not np.any(search):
            return result
        at = np.flatnonzero(search)
        kinds = [kind.at(at) for kind in kinds]
        even, num_ranks, low = _at_flags(even, at), _at(num_ranks, at), low[at]
        most = np.maximum.reduce([k.micro_batches for k in kinds])

        def fits(rounds: Ranges) -> Flags:
            budgets = [
                in_flight_for_rounds(
                    budget=k.micro_batches, rank_micro_batches=k.micro_batches, num_rounds=rounds
                )
                for k in kinds
            ]
            return fits_ranges(kinds, budgets, even_shards=even, num_ranks=num_ranks)

        fits_low = fits(low)
        high = np.where(fits_low, low, most)
        uneven = ~fits_low if even is False else ~fits_low & ~np.asarray(even)
        if np.any(uneven):
            # n / rho <= w <= n / rho + 1: where the shards' capacity surely holds them.
            spare, per_rounds, per_extra = _shard_terms(kinds)
            with np.errstate(divide="ignore", invalid="ignore"):
                bound = np.where(
                    spare > per_extra, np.ceil(per_rounds / (spare - per_extra)), np.inf
                )
            bound = np.minimum(most, np.maximum(low, bound))
            high = np.where(uneven & fits(bound), bound, high)
        low = np.where(fits_low, low, low + 1)
        # Bisection: memory only falls as the round trips grow; high always fits.
        while np.any(low < high):
            middle = np.floor((low + high) / 2)
            fitted = fits(middle)
            open_ = low < high
            high = np.where(open_ & fitted, middle, high)
            low = np.where(open_ & ~fitted, middle + 1, low)
        result[at] = high
        return result


def _at_flags(flags: bool | Flags, where: Where) -> bool | Flags:
    return flags[where] if isinstance(flags, np.ndarray) else flags


def _shard_terms(kinds: Sequence[RankRoom]) -> tuple[Ranges, Ranges, Ranges]:
    """(S, sum_k t_k n_k, sum_k t_k) of uneven shards (``FewestRounds._lower_bound``)."""
    spare = -np.ones(kinds[0].micro_batches.shape)  # S
    per_rounds = np.zeros(spare.shape)  # sum_k t_k n_k
    per_extra = np.zeros(spare.shape)  # sum_k t_k
    for kind in kinds:
        sharded = np.where(kind.sharded_bytes > 0, kind.sharded_bytes, np.inf)
        weight = kind.count * kind.per_in_flight_bytes / sharded
        spare += kind.count * kind.free_bytes / sharded
        per_rounds += weight * kind.micro_batches
        per_extra += weight
    return spare, per_rounds, per_extra
