"""Price one stage for every layer range at once: the matrices the layer-split DP reads.

For a stage (its ranks, its position in a pipeline of p stages, a micro-batch size),
``cost[a, b]`` is the time the stage needs per step for layers [a, b): its busy time plus
its data-parallel sync, under the best (ZeRO mode, recompute) setting that fits every
rank's memory, ``inf`` where none fits. Busy time uses the continuous relaxation of the
micro-batch allocation, M / sum_r 1 / t_r(a, b), which the exact allocation then rounds;
memory uses the same formulas as the exact check (``stage_memory_bytes``), with each
rank's micro-batches in flight estimated from its speed share.

Where no setting fits with Little's in-flight budget, the range is priced as the exact
build (``stage_builder``) would make it: the fewest round trips rho whose budgets
w = ceil(n / rho) fit (``range_memory``: closed-form bounds, then bisection, all ranges
at once), its busy
time stretched by rho over Little's round trips in ``cost_s`` so the split steers away
from it, and rho in ``rounds`` for the pipeline proxy's round-trip bound.

Only Little's budget depends on how many ranks the stage has to the pipeline's end, so the
pricing runs in two steps: ``stage_settings`` prices every setting of the stage, once for
stages alike but for that count (the search caches it), and ``stage_cost`` chooses among
them for one count, range by range where the DP first asks (it needs only the ranges that
can cost less than its split's slowest stage: docs/design.md, section 6).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from piebald.cost.comm import RingProfile, ring_profile
from piebald.cost.compute import EfficiencyCurve, optimizer_step_time_s
from piebald.cost.in_flight import little_budget, mean_in_flight, num_round_trips
from piebald.cost.memory import prefix_sums, stage_memory_bytes, stage_params_matrix
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.precision import wire_dtype_of_devices
from piebald.cost.rank_pass import input_broadcast_s
from piebald.cost.replica_broadcast import (
    broadcasts_per_pass,
    broadcasts_per_step,
    layer_broadcasts_s,
)
from piebald.cost.tensor_comm import tensor_comm_s
from piebald.cost.zero_comm import stage_comm
from piebald.planner.range_memory import FewestRounds, RankRoom, fits_ranges
from piebald.planner.stage_builder import StageRules, tensor_group_of_each_type
from piebald.specs.cluster import ClusterSpec, Link
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import JobSpec, Optimizer
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.plan import ZeroMode, tensor_degree_fits
from piebald.specs.tensor_layout import TensorLayout

__all__ = [
    "RangePrices",
    "Setting",
    "StageCost",
    "StageSettings",
    "memory_matrices",
    "price_ranges",
    "stage_cost",
    "stage_settings",
]

Matrix = npt.NDArray[np.float64]  # [a, b]: layers [a, b)
# One entry per layer range [a, b) with a < b, in row-major order of Matrix: the ranges
# that exist, about half of the matrix, which is all the pricing below works on.
Ranges = npt.NDArray[np.float64]
Positions = npt.NDArray[np.intp]
Flags = npt.NDArray[np.bool_]
_MAKESPAN_STEPS = 8
_PROBE_BYTES = (1e6, 1e9)  # collective time is affine in bytes: two probes give the line
_TIE = 1e-9  # relative: costs this close are equal (rounding of equal collectives)
# Relative: settings further than twice this above a range's cheapest cannot take it, the
# ties' drift included (up to one _TIE per setting).
_NEAR = 1e-6


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
        self.priced = ~_valid_ranges(len(lower_s))  # [a, b) with b <= a: nothing to price
        self.priced_below = -math.inf  # every range whose lower bound is below it is priced

    def ensure(self, where: Flags) -> None:
        """Price the ranges ``where`` (a matrix) not priced yet."""
        todo = where & ~self.priced
        if np.any(todo):
            prices = self._price(_range_positions(len(todo))[todo])
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


@functools.lru_cache(maxsize=4096)
def _affine_comm(
    profile: RingProfile, num_ranks: int, zero: ZeroMode
) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
    """(intercept, slope per byte) of the traffic a forward pass waits for, of the traffic
    a backward pass takes at least, and of the end-of-step sync."""
    even = tuple(1.0 / num_ranks for _ in range(num_ranks))
    low, high = (
        stage_comm(profile, shard_fractions=even, zero=zero, state_bytes=size)
        for size in _PROBE_BYTES
    )
    span = _PROBE_BYTES[1] - _PROBE_BYTES[0]

    def line(lo: float, hi: float) -> tuple[float, float]:
        slope = (hi - lo) / span
        return lo - slope * _PROBE_BYTES[0], slope

    return (
        line(low.before_forward_s, high.before_forward_s),
        line(low.during_backward_s, high.during_backward_s),
        line(low.sync_s, high.sync_s),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One (tensor-parallel degree, recompute, ZeRO mode) of a stage, priced for every
    layer range: all but Little's budget, which depends on the ranks to the pipeline's
    end."""

    busy: Ranges
    sync: Ranges
    slowest: Ranges
    optimizer: Ranges
    num_groups: int  # tensor groups: the stage's data-parallel ranks
    devices: tuple[DeviceType, ...]  # the GPU types of its groups, in rank order
    kinds: tuple[RankRoom, ...]  # its groups of each of those types
    shares: tuple[Ranges | float, ...]  # of the stage's micro-batches, one group's of each
    even_shards: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSettings:
    """Every setting of one stage, as the pairs (setting, layer range) where it holds one
    micro-batch in flight per rank (elsewhere it fits with no in-flight budget), stacked
    range by range and, in each range, in the order of the settings: what ``stage_cost``
    chooses among for any number of ranks to the pipeline's end."""

    num_ranks: int
    num_layers: int
    pairs: _Pairs | None  # None: the strategy allows the stage no setting at all
    # Below any range's cost: the least of its settings' busy + sync (a shrunk budget only
    # stretches the busy time); inf where none holds one micro-batch in flight.
    lower_s: Matrix

    @classmethod
    def of(cls, settings: Sequence[Setting], *, num_ranks: int, num_layers: int) -> StageSettings:
        """``settings`` (each over every range of ``num_layers`` layers, all of the same
        GPU types) of a stage of ``num_ranks`` ranks."""
        pairs = _Pairs.of(settings) if settings else None
        valid = _valid_ranges(num_layers + 1)
        lower = np.full(int(valid.sum()), np.inf)
        if pairs is not None and len(pairs.range):
            lower[pairs.range[pairs.segments.starts]] = pairs.segments.least(pairs.cost)[
                pairs.segments.starts
            ]
        lower_s = np.full(valid.shape, np.inf)
        lower_s[valid] = lower
        lower_s.setflags(write=False)
        return cls(num_ranks=num_ranks, num_layers=num_layers, pairs=pairs, lower_s=lower_s)


def stage_settings(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    ranks: tuple[int, ...],
    micro_batch_size: int,
    stage_index: int,
    num_stages: int,
    rules: StageRules,
    curve: EfficiencyCurve,
) -> StageSettings:
    """The settings of a stage of ``ranks``, its position in a pipeline of ``num_stages``
    and its micro-batch size; it prices the same for any ``stage_index`` with as many
    neighbouring stages on each side."""
    settings: list[Setting] = []
    for degree in rules.tensor_parallel_degrees:
        layout = rules.layout_at(degree)
        if tensor_degree_fits(
            cluster, model.arch, ranks, degree, layout=layout, seq_len=job.seq_len
        ):
            settings += _settings(
                cluster,
                model=model,
                job=job,
                ranks=ranks,
                degree=degree,
                micro_batch_size=micro_batch_size,
                stage_index=stage_index,
                num_stages=num_stages,
                rules=rules,
                curve=curve,
            )
    return StageSettings.of(settings, num_ranks=len(ranks), num_layers=model.num_layers)


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
    pairs: _Pairs, items: Positions, *, cost: Ranges, best: Ranges, won: Positions
) -> None:
    """Each range to the cheapest of its ``items`` (pairs in order) priced ``cost``, with
    the tie rule taken setting after setting: a setting within ``_TIE`` of the best so far
    takes it only with a shorter optimizer step. ``best`` and ``won`` (by range) in place."""
    best_optimizer = np.full(best.shape, np.inf)
    for chunk in _in_turn(items, pairs.range):
        ranges, chunk_cost = pairs.range[chunk], cost[chunk]
        optimizer, so_far = pairs.optimizer[chunk], best[ranges]
        tie = np.isfinite(so_far) & (np.abs(chunk_cost - so_far) <= _TIE * so_far)
        better = ((chunk_cost < so_far) & ~tie) | (tie & (optimizer < best_optimizer[ranges]))
        ranges = ranges[better]
        best[ranges] = chunk_cost[better]
        best_optimizer[ranges] = optimizer[better]
        won[ranges] = chunk[better]


def _cheapest_shrunk(
    pairs: _Pairs, shrunk: _Shrunk, *, best: Ranges, won: Positions, rounds: Ranges
) -> None:
    """``_cheapest`` with shrunk budgets, in the order of the settings: a setting takes a
    range where its stretched cost is lower than the best so far, and neither its cost
    unstretched nor its lower bound (``_Shrunk.bound``) is not. In place, with the round
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


def _settings(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    ranks: tuple[int, ...],
    degree: int,
    micro_batch_size: int,
    stage_index: int,
    num_stages: int,
    rules: StageRules,
    curve: EfficiencyCurve,
) -> list[Setting]:
    """Every (recompute, ZeRO mode) of the stage at tensor-parallel ``degree``, priced
    for every layer range: its tensor groups are the stage's data-parallel ranks, each
    computing its slice of the layers in the rules' layout (``ModelSpec.layers_at``),
    meeting its group in every block and at the stage's edges (``cost.tensor_comm``) and
    taking the input its leader receives: a member's pass as ``cost.rank_pass`` prices
    it, with the same functions."""
    layout = rules.layout_at(degree)
    leaders = ranks[::degree]  # one per tensor group; the stage's data parallelism is theirs
    classes = Counter(cluster.device_of(rank) for rank in leaders)
    num_micro_batches = job.global_batch_size / micro_batch_size
    neighbors = (stage_index > 0) + (stage_index < num_stages - 1)
    # Weights and gradients travel in the group's common compute dtype (cost.precision).
    wire_dtype = wire_dtype_of_devices(classes, precision=job.precision)
    wire = float(wire_dtype.num_bytes)
    params = _params(model, degree, layout)
    on_wire = params * wire
    has_params = params > 0
    # One data-parallel group; the stage's t of them run at once, sharing the NICs.
    profile = ring_profile(cluster, leaders, rings_per_nic=degree)
    # A tensor group per GPU type (its node's link), and the blocks in each range.
    tensor_group = tensor_group_of_each_type(cluster, ranks, degree) if degree > 1 else {}
    blocks, holds_embedding, holds_head = _blocks(model), *_ends(model)
    # The optimizer step is memory-bound and linear in the parameters a rank owns.
    optimizer_per_param_s = max(
        optimizer_step_time_s(num_params=1.0, device=d, optimizer=job.optimizer, curve=curve)
        for d in classes
    )
    # Under ZeRO-2/3 each group's leader hands the weights the group holds whole on to its
    # members (``cost.replica_broadcast``): ZeRO-3 before every pass, ZeRO-2 once per step,
    # after the gather.
    weights_broadcast = {
        device: _broadcast_ranges(
            model,
            degree=degree,
            layout=layout,
            dtype=device.training_dtype(job.precision),
            link=cluster.link_between(*group[:2]),
        )
        for device, group in tensor_group.items()
    }
    # Each type's tensor group: its ring and the input its leader broadcasts, the same
    # under every recompute.
    group_ring = {device: ring_profile(cluster, group) for device, group in tensor_group.items()}
    group_input_s = {
        device: input_broadcast_s(
            cluster, group, model=model, job=job, micro_batch_size=micro_batch_size
        )
        for device, group in tensor_group.items()
    }
    settings: list[Setting] = []
    for recompute in rules.recompute:
        shapes = {
            device: PassShape.for_job(
                job,
                device=device,
                micro_batch_size=micro_batch_size,
                recompute=recompute,
                tensor_parallel_degree=degree,
                tensor_layout=layout,
            )
            for device in classes
        }
        forward: dict[DeviceType, Ranges] = {}
        backward: dict[DeviceType, Ranges] = {}
        for device, shape in shapes.items():
            forward[device], backward[device] = _pass_ranges(model, shape=shape, curve=curve)
            if degree > 1:  # as ``cost.rank_pass`` prices a member's pass
                comm_forward_s, comm_backward_s = tensor_comm_s(
                    model,
                    holds_embedding=holds_embedding,
                    holds_head=holds_head,
                    num_blocks=blocks,
                    shape=shape,
                    ring=group_ring[device],
                )
                broadcast_s = group_input_s[device]
                forward[device] = forward[device] + comm_forward_s + broadcast_s * (stage_index > 0)
                backward[device] = (
                    backward[device]
                    + comm_backward_s
                    + broadcast_s * (stage_index < num_stages - 1)
                )
        # ZeRO modes with the same per-pass traffic (none, and ZeRO-1, which sync once per
        # step) time their passes alike: the passes and what follows from them once each.
        passes: dict[tuple[float, float, float, float, bool, bool], _Passes] = {}
        for zero in _priced_zero_modes(rules.zero_modes, num_groups=len(leaders)):
            # Per-pass ZeRO puts the ranks in lockstep: equal counts, one stage only
            # (``specs.plan``), each pass as long as the slowest rank's.
            lockstep = zero.per_pass and len(leaders) > 1
            per_rank = num_micro_batches / len(leaders)
            if lockstep and (num_stages > 1 or not float(per_rank).is_integer()):
                continue
            (pre_a, pre_b), (during_a, during_b), (sync_a, sync_b) = _affine_comm(
                profile, len(leaders), zero
            )
            per_pass = broadcasts_per_pass(zero, degree)
            key = (pre_a, pre_b, during_a, during_b, lockstep, per_pass)
            if key not in passes:
                passes[key] = _passes(
                    {d: forward[d] + weights_broadcast[d] for d in classes}
                    if per_pass
                    else forward,
                    {d: backward[d] + weights_broadcast[d] for d in classes}
                    if per_pass
                    else backward,
                    classes,
                    # Per-pass traffic overlaps the pass, as in the exact stage and plan
                    # estimate.
                    before_forward_s=np.where(has_params, pre_a + pre_b * on_wire, 0.0),
                    during_backward_s=np.where(has_params, during_a + during_b * on_wire, 0.0),
                    num_micro_batches=num_micro_batches,
                )
                if lockstep:
                    passes[key] = _in_lockstep(passes[key], classes, per_rank=per_rank)
            timed = passes[key]
            kinds = []
            for device, count in classes.items():
                free, per_in_flight, sharded = _memory_ranges(
                    model,
                    shape=shapes[device],
                    optimizer=job.optimizer,
                    zero=zero,
                    neighbors=neighbors,
                    wire=wire_dtype,
                    curve=curve,
                )
                kinds.append(
                    RankRoom(
                        count=count,
                        free_bytes=free,
                        per_in_flight_bytes=per_in_flight,
                        sharded_bytes=sharded,
                        micro_batches=timed.micro_batches[device],
                    )
                )
            owned = 1.0 / len(leaders) if zero.shards_optimizer else 1.0
            settings.append(
                Setting(
                    busy=timed.busy,
                    sync=np.where(has_params, sync_a + sync_b * on_wire, 0.0)
                    + (
                        np.maximum.reduce(list(weights_broadcast.values()))
                        if broadcasts_per_step(zero, degree)
                        else 0.0
                    ),
                    slowest=timed.slowest,
                    # The optimizer step stays out of the DP's cost: the step pays the
                    # slowest stage's once, a max of its own, which the pipeline proxy adds.
                    optimizer=params * owned * optimizer_per_param_s,
                    num_groups=len(leaders),
                    devices=tuple(classes),
                    kinds=tuple(kinds),
                    shares=tuple(timed.share[device] for device in classes),
                    even_shards=rules.even_shards or zero.replicated,
                )
            )
    return settings


def _priced_zero_modes(
    zero_modes: tuple[ZeroMode, ...], *, num_groups: int
) -> tuple[ZeroMode, ...]:
    """The ZeRO modes worth pricing for a stage of ``num_groups`` data-parallel ranks: all
    of ``zero_modes`` but NONE where ZeRO-1 is among them and the group has two ranks or
    more. ZeRO-1 then takes every range NONE could: its passes are the same (neither
    moves anything during them), its sync is the same (a reduce-scatter and an all-gather
    over even shards price exactly as the all-reduce, ``cost.comm``), its memory is no
    more at any shard fraction (only the optimizer state differs, sharded), so it fits
    with at least NONE's in-flight budget and in no more round trips, and its optimizer
    step is shorter, which wins every tie (``_cheapest``). Pricing NONE as well only made
    pairs that never win. The exact build still tries NONE (``stage_builder``): there the
    shards are uneven, and ZeRO-1's collectives can be slower than an all-reduce."""
    if num_groups < 2 or ZeroMode.OPTIMIZER not in zero_modes:
        return zero_modes
    return tuple(zero for zero in zero_modes if zero is not ZeroMode.NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Passes:
    """A stage's passes under one recompute setting and one per-pass traffic, for every
    range, and what follows from them: the busiest rank's time, each GPU type's share."""

    busy: Ranges
    slowest: Ranges  # one micro-batch through the stage on its slowest rank
    micro_batches: dict[DeviceType, Ranges]  # each rank's, from its speed share
    share: dict[DeviceType, Ranges | float]  # of the stage's micro-batches, each rank's


def _passes(
    forward: dict[DeviceType, Ranges],
    backward: dict[DeviceType, Ranges],
    classes: Counter[DeviceType],
    *,
    before_forward_s: Ranges,
    during_backward_s: Ranges,
    num_micro_batches: float,
) -> _Passes:
    pass_of = {
        d: np.maximum(forward[d], before_forward_s) + np.maximum(backward[d], during_backward_s)
        for d in classes
    }
    rate = np.zeros(before_forward_s.shape)
    for device, count in classes.items():
        rate += count / pass_of[device]
    busy = _makespan(pass_of, classes, num_micro_batches, continuous=num_micro_batches / rate)
    micro_batches: dict[DeviceType, Ranges] = {}
    shares: dict[DeviceType, Ranges | float] = {}
    for device in classes:
        share = 1.0 / pass_of[device] / rate  # a rank's share (nan: invalid)
        micro_batches[device] = np.maximum(1.0, np.ceil(num_micro_batches * share))
        shares[device] = share
    return _Passes(
        busy=busy,
        slowest=np.maximum.reduce([pass_of[d] for d in classes]),
        micro_batches=micro_batches,
        share=shares,
    )


def _in_lockstep(timed: _Passes, classes: Counter[DeviceType], *, per_rank: float) -> _Passes:
    """``timed`` with every rank running ``per_rank`` micro-batches in lockstep: each pass
    lasts as long as the slowest rank's."""
    share = 1.0 / sum(classes.values())
    return _Passes(
        busy=per_rank * timed.slowest,
        slowest=timed.slowest,
        micro_batches={d: np.full(timed.slowest.shape, per_rank) for d in classes},
        share=dict.fromkeys(classes, share),
    )


@functools.cache
def _range_positions(size: int) -> Positions:
    """[a, b] -> the position of range [a, b) in ``Ranges`` order (garbage where b <= a)."""
    positions = np.zeros((size, size), dtype=np.intp)
    positions[_valid_ranges(size)] = np.arange(size * (size - 1) // 2)
    positions.setflags(write=False)
    return positions


@functools.cache
def _valid_ranges(size: int) -> npt.NDArray[np.bool_]:
    """[a, b] -> a < b: where the ranges lie in a matrix (read-only)."""
    valid = np.arange(size)[:, None] < np.arange(size)[None, :]
    valid.setflags(write=False)
    return valid


def _read_only_ranges(matrix: Matrix) -> Ranges:
    """The entries of ``matrix`` over the ranges that exist."""
    ranges: Ranges = matrix[_valid_ranges(len(matrix))]
    ranges.setflags(write=False)
    return ranges


@functools.lru_cache(maxsize=64)
def _params(model: ModelSpec, degree: int, layout: TensorLayout) -> Ranges:
    """Parameters a rank of a stage of each layer range stores (``stage_params_matrix``),
    at tensor-parallel ``degree`` in ``layout``."""
    return _read_only_ranges(
        stage_params_matrix(model, tensor_parallel_degree=degree, layout=layout)
    )


@functools.lru_cache(maxsize=64)
def _ends(model: ModelSpec) -> tuple[Ranges, Ranges]:
    """Whether each layer range holds the embedding, and the head: 1.0 or 0.0
    (read-only)."""
    size = model.num_layers + 1
    embedding, head = np.zeros((size, size)), np.zeros((size, size))
    embedding[0, :] = 1.0  # [0, b)
    head[:, model.num_layers] = 1.0  # [a, L)
    return _read_only_ranges(embedding), _read_only_ranges(head)


@functools.lru_cache(maxsize=64)
def _blocks(model: ModelSpec) -> Ranges:
    """Transformer blocks in each layer range (read-only)."""
    prefix = prefix_sums([float(layer.kind is LayerKind.BLOCK) for layer in model.layers])
    return _read_only_ranges(prefix[None, :] - prefix[:, None])


@functools.lru_cache(maxsize=256)
def _broadcast_ranges(
    model: ModelSpec, *, degree: int, layout: TensorLayout, dtype: Dtype, link: Link
) -> Ranges:
    """The leader's broadcasts of the whole weights of every layer range
    (``cost.replica_broadcast.layer_broadcasts_s``, summed; read-only)."""
    prefix = prefix_sums(
        list(layer_broadcasts_s(model, degree=degree, layout=layout, dtype=dtype, link=link))
    )
    return _read_only_ranges(prefix[None, :] - prefix[:, None])


@functools.lru_cache(maxsize=1024)
def _pass_ranges(
    model: ModelSpec, *, shape: PassShape, curve: EfficiencyCurve
) -> tuple[Ranges, Ranges]:
    """Forward and backward time of every layer range in passes of ``shape``,
    prefix[b] - prefix[a] (the same for every stage of these GPUs, so computed once)."""
    times = pass_times(model, shape=shape, curve=curve)
    forward, backward = (
        _read_only_ranges(prefix[None, :] - prefix[:, None])
        for prefix in (times.forward_prefix_s, times.backward_prefix_s)
    )
    return forward, backward


def _makespan(
    times: dict[DeviceType, Ranges],
    classes: Counter[DeviceType],
    num_micro_batches: float,
    *,
    continuous: Ranges,
) -> Ranges:
    """The integer min-makespan of the micro-batches over the stage's ranks, for every range.

    It is the smallest T with sum_k n_k floor(T / t_k) >= M, and such a T is a multiple of
    some t_k; starting from the continuous bound M / sum_k (n_k / t_k), step to the next
    such breakpoint until enough micro-batches fit (a few steps; capped, which can only
    leave the estimate at the continuous bound's side, never above the exact value)."""
    if len(classes) == 1:  # one GPU type: ceil(M / n) micro-batches each, exactly
        ((device, count),) = classes.items()
        exact: Ranges = np.ceil(num_micro_batches / count - 1e-9) * times[device]
        return exact
    # Each range steps on its own: after the first step, only those still short.
    result: Ranges = continuous.copy()
    makespan, at = continuous, None
    for _ in range(_MAKESPAN_STEPS):
        part = {d: t if at is None else t[at] for d, t in times.items()}
        done = {d: np.floor(makespan / part[d] + 1e-9) for d in classes}  # by each rank
        fitted = sum(n * done[d] for d, n in classes.items())
        short = fitted < num_micro_batches - 1e-9
        if not np.any(short):
            break
        following = np.minimum.reduce([(done[d] + 1.0) * part[d] for d in classes])
        at = np.flatnonzero(short) if at is None else at[short]
        makespan = following[short]
        result[at] = makespan
    return result


def memory_matrices(
    model: ModelSpec,
    *,
    shape: PassShape,
    optimizer: Optimizer,
    zero: ZeroMode,
    neighbors: int,
    wire: Dtype,
    curve: EfficiencyCurve,
) -> tuple[Matrix, Matrix, Matrix]:
    """(bytes with no micro-batch in flight, bytes per micro-batch in flight, bytes per unit
    of shard fraction) of a rank for every layer range: ``stage_memory_bytes`` (activations
    measured where ``curve`` has them, as in the exact check), which is affine in the
    micro-batches in flight (read-only)."""
    empty, one = (
        stage_memory_bytes(
            model,
            shape=shape,
            layers=None,
            optimizer=optimizer,
            zero=zero,
            num_in_flight=in_flight,
            num_neighbor_stages=neighbors,
            wire_dtype=wire,
            curve=curve,
        )
        for in_flight in (0, 1)
    )
    fixed, sharded = (np.asarray(x, dtype=np.float64) for x in empty)
    per_in_flight = np.asarray(one[0], dtype=np.float64) - fixed
    for matrix in (fixed, per_in_flight, sharded):
        matrix.setflags(write=False)
    return fixed, per_in_flight, sharded


# One entry per (GPU type, micro-batch size, recompute, degree, ZeRO mode, neighbours)
# a search prices, over 1,000 in a large cluster of six types: all of them kept.
@functools.lru_cache(maxsize=8192)
def _memory_ranges(
    model: ModelSpec,
    *,
    shape: PassShape,
    optimizer: Optimizer,
    zero: ZeroMode,
    neighbors: int,
    wire: Dtype,
    curve: EfficiencyCurve,
) -> tuple[Ranges, Ranges, Ranges]:
    """``memory_matrices`` over the ranges, with the memory left (the device's less the
    bytes with no micro-batch in flight) in place of the latter. The same for every stage
    of these GPUs, so computed once (read-only)."""
    fixed, per_in_flight, sharded = memory_matrices(
        model,
        shape=shape,
        optimizer=optimizer,
        zero=zero,
        neighbors=neighbors,
        wire=wire,
        curve=curve,
    )
    free = shape.device.memory_bytes - fixed
    return _read_only_ranges(free), _read_only_ranges(per_in_flight), _read_only_ranges(sharded)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Shrunk:
    """The pairs (``at``, ascending) that may take a range that no setting fits with
    Little's budget, each at its fewest round trips: ``cost`` (busy stretched by them over
    Little's, plus sync), ``rounds``, and the ``bound`` on the cost the choice checks
    first (from ``FewestRounds.low``)."""

    at: Positions
    cost: Ranges
    rounds: Ranges
    bound: Ranges


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pairs:
    """``StageSettings``' pairs: each setting's values at each range where it holds one
    micro-batch in flight, ordered by range, then setting (a range's pairs are a
    segment of ``segments``); or those of some ranges (``of_ranges``)."""

    range: Positions
    segments: _Segments
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
    def of(cls, settings: Sequence[Setting]) -> _Pairs:
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
            segments=_Segments.of(ranges),
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

    def of_ranges(self, ranges: Positions) -> _Pairs:
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
        return _Pairs(
            range=self.range[at],
            segments=_Segments.of(self.range[at]),
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

    def shrunk(self, littles: Sequence[Ranges], *, where: Flags) -> _Shrunk:
        """The pairs ``where`` that may take their range at their fewest round trips
        (``near``), with Little's budgets ``littles``."""
        low_bound = self.fewest.low[self.origin]
        at = np.flatnonzero(where & np.isfinite(self.cost) & np.isfinite(low_bound))
        segments = _Segments.of(self.range[at])
        little: Ranges = np.maximum.reduce(
            [
                num_round_trips(kind.micro_batches[at], budget[at])
                for kind, budget in zip(self.kinds, littles, strict=True)
            ]
        )
        # No fewer round trips than Little's: from there on its budget never caps the
        # ranks' (docs/design.md, section 6).
        low = np.maximum(little, low_bound[at])
        bound = self.busy[at] * low / little + self.sync[at]

        def priced(chosen: Flags) -> tuple[Ranges, Ranges]:
            """(cost, rounds) of the pairs ``at[chosen]``."""
            rounds = np.maximum(little[chosen], self.fewest.at(self.origin[at[chosen]]))
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
        near, whole = segments.near(where_chosen(bound < beat * (1.0 + 4.0 * _NEAR)))
        taken = near | whole
        cost, rounds = priced(taken)
        return _Shrunk(at=at[taken], cost=cost, rounds=rounds, bound=bound[taken])


@dataclass(frozen=True, slots=True, kw_only=True)
class _Segments:
    """The runs of equal values in an ascending array (a range's pairs)."""

    starts: Positions
    index: Positions  # each element's run

    @classmethod
    def of(cls, values: Positions) -> _Segments:
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
        near = finite & (cost <= least * (1.0 + _NEAR))
        further = finite & ~near & (cost < least * (1.0 + 2.0 * _NEAR))
        if not np.any(further):
            return near, further
        return near, np.logical_or.reduceat(further, self.starts)[self.index]
