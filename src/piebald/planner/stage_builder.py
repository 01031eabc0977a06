"""Build one stage exactly: micro-batch counts, shard fractions, ZeRO mode and recompute.

Given the ranks of a stage and its layers, every (recompute, ZeRO mode) the strategy allows
is tried: micro-batches go to ranks by exact min-makespan allocation, the sharded part of
the training state is water-filled against each rank's free memory (the most even split
that fits, since uneven collectives are padded to the largest shard), and the fastest
setting whose every rank fits its memory wins.

Each rank holds the 1F1B in-flight budget of Little's law and its slack
(``cost.in_flight.in_flight_micro_batches``), or without the slack where that does not fit
(the stage records it). Where no setting fits even so, the budget
shrinks to the fewest round trips rho that fit, w_r = ceil(n_r / rho)
(``in_flight_for_rounds``; memory falls as rho grows, so a binary search finds the
smallest), and the stage records it; the settings then compete with their busy time
stretched by rho over the round trips Little's budget needs, the price the plan
estimate's round-trip bound puts on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from piebald.cost.comm import ring_profile
from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, optimizer_step_time_s
from piebald.cost.in_flight import (
    in_flight_for_rounds,
    in_flight_micro_batches,
    slack_of,
    stage_round_trips,
)
from piebald.cost.memory import rank_memory
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.precision import wire_dtype_of_devices
from piebald.cost.rank_pass import input_broadcast_s, rank_pass
from piebald.cost.replica_broadcast import (
    broadcasts_per_pass,
    broadcasts_per_step,
    weights_broadcast_s,
)
from piebald.cost.zero_comm import overlapped_passes_s, stage_comm
from piebald.planner.allocation import min_makespan_counts, min_makespan_sized
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import JobSpec, Optimizer
from piebald.specs.model import ModelSpec
from piebald.specs.plan import (
    Schedule,
    Stage,
    ZeroMode,
    tensor_degree_fits,
)
from piebald.specs.recompute import RECOMPUTE_BY_FRUGALITY, Recompute
from piebald.specs.tensor_layout import TensorLayout

__all__ = ["StageChoice", "StageRules", "build_stage", "tensor_group_of_each_type", "water_fill"]

_T = TypeVar("_T")

# In the order of what they shard: nothing, optimizer state, gradients, weights.
ALL_ZERO_MODES = (ZeroMode.NONE, ZeroMode.OPTIMIZER, ZeroMode.GRADIENTS, ZeroMode.FULL)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageRules:
    """What a strategy may choose inside a stage."""

    zero_modes: tuple[ZeroMode, ...] = ALL_ZERO_MODES
    recompute: tuple[Recompute, ...] = (Recompute.NONE, Recompute.FULL)
    even_shards: bool = False
    equal_micro_batches: bool = False
    # Tensor-parallel degrees a stage may take (Megatron-LM tensor groups inside a node).
    tensor_parallel_degrees: tuple[int, ...] = (1,)
    # What a stage's tensor groups split at degree > 1 (``specs.tensor_layout``): sequence
    # parallel, as the runtime runs the plans piebald makes.
    tensor_layout: TensorLayout = TensorLayout.SEQUENCE

    def layout_at(self, degree: int) -> TensorLayout:
        """The tensor layout of a stage of tensor-parallel ``degree`` (``blocks``, which
        splits nothing more, at degree 1)."""
        return self.tensor_layout if degree > 1 else TensorLayout.BLOCKS

    @property
    def most_frugal_zero(self) -> ZeroMode:
        """The allowed ZeRO mode that shards the most (``ALL_ZERO_MODES`` order)."""
        return max(self.zero_modes, key=ALL_ZERO_MODES.index)

    @property
    def most_frugal_recompute(self) -> Recompute:
        """The allowed recompute that keeps the fewest activations."""
        return max(self.recompute, key=RECOMPUTE_BY_FRUGALITY.index)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageChoice:
    stage: Stage
    busy_s: float  # the busiest rank's compute over the step, per-pass traffic included
    sync_s: float
    pass_s: float  # one micro-batch through the stage on its slowest working rank
    optimizer_s: float  # the slowest owner's optimizer step
    # Round trips its in-flight budget forces over those the Little's-law budget needs
    # (1 unless the budget was lowered to fit memory).
    round_trip_factor: float = 1.0

    @property
    def total_s(self) -> float:
        """What this stage alone adds to a step: busy (stretched by the extra round trips
        of a lowered in-flight budget), sync and optimizer step."""
        return self.busy_s * self.round_trip_factor + self.sync_s + self.optimizer_s


def water_fill(capacities: Sequence[float]) -> tuple[float, ...] | None:
    """Fractions f_i <= capacities[i] summing to 1 with the smallest max f_i, or None.

    The solution is f_i = min(capacities[i], level) for the level at which they sum to 1.
    """
    if any(c < 0 for c in capacities) or sum(capacities) < 1.0 - 1e-12:
        return None
    remaining, count = 1.0, len(capacities)
    level = 0.0
    for index, capacity in enumerate(sorted(capacities)):
        share = remaining / (count - index)
        if capacity >= share:
            level = share
            break
        remaining -= capacity
    else:  # every capacity is binding; only possible when they sum to exactly 1
        level = max(capacities)
    fractions = [min(c, level) for c in capacities]
    total = sum(fractions)
    return tuple(f / total for f in fractions)


def _counts(
    times_s: list[float], sizes: Sequence[int], *, num_sequences: int, equal: bool
) -> list[int] | None:
    """Micro-batches per rank: the fastest allocation, or with ``equal`` the same count m
    on every rank, m * sum(sizes) = num_sequences (None where nothing reaches the batch)."""
    if equal:
        per_rank, extra = divmod(num_sequences, sum(sizes))
        return None if extra else [per_rank] * len(times_s)
    if len(set(sizes)) == 1:
        num_micro_batches, rest = divmod(num_sequences, sizes[0])
        if rest:
            return None
        return min_makespan_counts(times_s, num_micro_batches)
    return min_makespan_sized(times_s, sizes, num_sequences)


def build_stage(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    ranks: tuple[int, ...],
    layer_start: int,
    layer_end: int,
    micro_batch_sizes: tuple[int, ...],
    stage_index: int,
    num_stages: int,
    widths: tuple[int, ...],
    rules: StageRules = StageRules(),
    curve: EfficiencyCurve = DEFAULT_CURVE,
) -> StageChoice | None:
    """The fastest memory-feasible setting of this stage, or None if nothing fits.
    ``widths`` counts the ranks of this stage and of each later one: the 1F1B in-flight
    budget and its slack (``cost.in_flight.in_flight_micro_batches``, ``slack_of``).

    At tensor-parallel degree t the stage's tensor groups (consecutive runs of t ranks
    inside a node, one micro-batch size each) take the place of its ranks: micro-batches
    and shards are allocated over them, and every member carries its group's."""
    degrees = [
        degree
        for degree in rules.tensor_parallel_degrees
        if tensor_degree_fits(
            cluster,
            model.arch,
            ranks,
            degree,
            layout=rules.layout_at(degree),
            seq_len=job.seq_len,
        )
        and all(
            len(set(micro_batch_sizes[i : i + degree])) == 1 for i in range(0, len(ranks), degree)
        )
    ]
    best: StageChoice | None = None
    # Little's in-flight budget wherever some setting fits with it; only where none does,
    # the fewest extra round trips that fit.
    for shrink in (False, True):
        for degree in degrees:
            choice = _build_at_degree(
                cluster,
                model=model,
                job=job,
                ranks=ranks,
                degree=degree,
                layers=(layer_start, layer_end),
                micro_batch_sizes=micro_batch_sizes,
                stage_index=stage_index,
                num_stages=num_stages,
                # Little's law counts this stage's tensor groups (one pipeline lane each).
                widths=(len(ranks) // degree, *widths[1:]),
                rules=rules,
                curve=curve,
                shrink=shrink,
                beat=math.inf if best is None else best.total_s,
            )
            if choice is not None and (best is None or choice.total_s < best.total_s):
                best = choice
        if best is not None:
            break
    return best


def _build_at_degree(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    ranks: tuple[int, ...],
    degree: int,
    layers: tuple[int, int],
    micro_batch_sizes: tuple[int, ...],
    stage_index: int,
    num_stages: int,
    widths: tuple[int, ...],
    rules: StageRules,
    curve: EfficiencyCurve,
    shrink: bool,
    beat: float,
) -> StageChoice | None:
    """:func:`build_stage` at one tensor-parallel degree and in-flight rule; None also where
    nothing at it is faster than ``beat``."""
    layer_start, layer_end = layers
    layout = rules.layout_at(degree)
    leaders = ranks[::degree]
    sizes = micro_batch_sizes[::degree]
    devices = [cluster.device_of(rank) for rank in leaders]
    params = float(
        model.stage_params(layer_start, layer_end, tensor_parallel_degree=degree, layout=layout)
    )
    wire_dtype = wire_dtype_of_devices(devices, precision=job.precision)
    wire_bytes = params * wire_dtype.num_bytes
    neighbors = (stage_index > 0) + (stage_index < num_stages - 1)
    even = tuple(1.0 / len(leaders) for _ in leaders)
    # One data-parallel group; the stage's t of them run at once, sharing the NICs.
    profile = ring_profile(cluster, leaders, rings_per_nic=degree)
    tensor_group = tensor_group_of_each_type(cluster, ranks, degree)
    # The leader's broadcast of the weights the group holds whole, under ZeRO-2/3
    # (``cost.replica_broadcast``): before each pass, or once a step.
    broadcast_of = {
        device: weights_broadcast_s(
            cluster,
            group,
            model=model,
            layers=layers,
            layout=layout,
            dtype=device.training_dtype(job.precision),
        )
        for device, group in tensor_group.items()
    }
    broadcasts_s = [broadcast_of[device] for device in devices]
    best: StageChoice | None = None
    for recompute in rules.recompute:
        # Groups of one device type and micro-batch size pass alike: one shape and one
        # lookup each (a stage may have thousands of ranks).
        of_kind: dict[tuple[DeviceType, int], tuple[PassShape, tuple[float, float]]] = {}
        shapes, compute_s = [], []
        for key in zip(devices, sizes, strict=True):
            if key not in of_kind:
                device, size = key
                shape = PassShape.for_job(
                    job,
                    device=device,
                    micro_batch_size=size,
                    recompute=recompute,
                    tensor_parallel_degree=degree,
                    tensor_layout=layout,
                )
                group = tensor_group[device]
                passes = rank_pass(
                    model,
                    start=layer_start,
                    end=layer_end,
                    shape=shape,
                    times=pass_times(model, shape=shape, curve=curve),
                    ring=ring_profile(cluster, group),
                    broadcast_s=input_broadcast_s(
                        cluster, group, model=model, job=job, micro_batch_size=size
                    ),
                    receives_activation=stage_index > 0,
                    receives_gradient=stage_index < num_stages - 1,
                )
                of_kind[key] = (shape, (passes.forward_s, passes.backward_s))
            shape, compute = of_kind[key]
            shapes.append(shape)
            compute_s.append(compute)
        # Each group's pass takes at least its compute, so no allocation of the sequences
        # keeps every group busy for less than the continuous one's: where even that is
        # not faster than the best so far, no ZeRO mode is (with room for rounding).
        rate = sum(size / max(f + b, 1e-12) for size, (f, b) in zip(sizes, compute_s, strict=True))
        if job.global_batch_size / rate * (1.0 - 1e-9) >= min(beat, _total_s(best)):
            continue
        for zero in rules.zero_modes:
            # Per-pass ZeRO puts a stage's ranks in lockstep: equal counts, and not in a
            # 1F1B pipeline, whose passes follow their inputs (``specs.plan``).
            lockstep = zero.per_pass and len(leaders) > 1
            if lockstep and num_stages > 1:
                continue
            # Per-pass traffic with even shards; the exact plan estimate re-prices it.
            comm_of_zero = stage_comm(
                profile, shard_fractions=even, zero=zero, state_bytes=wire_bytes
            )
            before_s, during_s = comm_of_zero.before_forward_s, comm_of_zero.during_backward_s
            # A pass never takes zero time (a stage of only the embedding of a tiny model
            # comes close); the allocation needs positive times.
            per_pass = broadcasts_per_pass(zero, degree)
            pass_s = [
                max(
                    sum(
                        overlapped_passes_s(
                            forward_s=f + w * per_pass,
                            backward_s=b + w * per_pass,
                            before_forward_s=before_s,
                            during_backward_s=during_s,
                        )
                    ),
                    1e-12,
                )
                for (f, b), w in zip(compute_s, broadcasts_s, strict=True)
            ]
            counts = _counts(
                pass_s,
                sizes,
                num_sequences=job.global_batch_size,
                equal=rules.equal_micro_batches or lockstep,
            )
            if counts is None:
                continue
            fitted = _fit_in_flight(
                model,
                shapes=shapes,
                optimizer=job.optimizer,
                wire_dtype=wire_dtype,
                layers=(layer_start, layer_end),
                counts=counts,
                zero=zero,
                neighbors=neighbors,
                widths=widths,
                even_shards=rules.even_shards or zero.replicated,
                shrink=shrink,
                curve=curve,
            )
            if fitted is None:
                continue
            fractions, max_in_flight, round_trip_factor = fitted

            stage = Stage(
                layer_start=layer_start,
                layer_end=layer_end,
                ranks=ranks,
                micro_batch_size=micro_batch_sizes,
                num_micro_batches=_per_member(counts, degree),
                # A member holds 1/t of its group's share (``specs.plan``).
                shard_fraction=_per_member([fraction / degree for fraction in fractions], degree),
                zero=zero,
                recompute=recompute,
                max_in_flight=None if max_in_flight is None else _per_member(max_in_flight, degree),
                tensor_parallel_degree=degree,
                tensor_layout=layout,
            )
            sync = stage_comm(
                profile, shard_fractions=fractions, zero=zero, state_bytes=wire_bytes
            ).sync_s + (max(broadcasts_s) if broadcasts_per_step(zero, degree) else 0.0)
            busy = max(c * t for c, t in zip(counts, pass_s, strict=True))
            working = [t for c, t in zip(counts, pass_s, strict=True) if c]
            optimizer = max(
                optimizer_step_time_s(
                    num_params=params * (fraction if zero.shards_optimizer else 1.0),
                    device=device,
                    optimizer=job.optimizer,
                    curve=curve,
                )
                for device, fraction in zip(devices, fractions, strict=True)
            )
            choice = StageChoice(
                stage=stage,
                busy_s=busy,
                sync_s=sync,
                pass_s=max(working),
                optimizer_s=optimizer,
                round_trip_factor=round_trip_factor,
            )
            if best is None or choice.total_s < best.total_s:
                best = choice
    return best


def _total_s(choice: StageChoice | None) -> float:
    return math.inf if choice is None else choice.total_s


def tensor_group_of_each_type(
    cluster: ClusterSpec, ranks: Sequence[int], degree: int
) -> dict[DeviceType, tuple[int, ...]]:
    """One tensor group of ``degree`` of each GPU type among ``ranks`` (the groups of a
    type sit in alike nodes, so one prices them all)."""
    groups: dict[DeviceType, tuple[int, ...]] = {}
    for start in range(0, len(ranks), degree):
        groups.setdefault(cluster.device_of(ranks[start]), tuple(ranks[start : start + degree]))
    return groups


def _per_member(values: Sequence[_T], degree: int) -> tuple[_T, ...]:
    """A value per tensor group, repeated for each of its ``degree`` members."""
    return tuple(value for value in values for _ in range(degree))


def _fit_in_flight(
    model: ModelSpec,
    *,
    shapes: Sequence[PassShape],
    optimizer: Optimizer,
    wire_dtype: Dtype,
    layers: tuple[int, int],
    counts: Sequence[int],
    zero: ZeroMode,
    neighbors: int,
    widths: Sequence[int],
    even_shards: bool,
    shrink: bool,
    curve: EfficiencyCurve,
) -> tuple[tuple[float, ...], tuple[int, ...] | None, float] | None:
    """(shard fractions, the lowered in-flight budget or None, round trips over those of
    Little's law) under which every rank fits its memory holding Little's budget, or with
    ``shrink`` the fewest round trips' budget; None if that does not fit. ``shapes``: each
    rank's passes; ``wire_dtype``: the stage group's. Activations are measured where
    ``curve`` has them (``rank_memory``)."""

    # A rank's memory is affine in its micro-batches in flight and its shard fraction.
    per_kind: dict[PassShape, tuple[float, float, float]] = {}
    for shape in shapes:
        if shape not in per_kind:

            def memory(fraction: float, in_flight: int, shape: PassShape = shape) -> float:
                return rank_memory(
                    model,
                    shape=shape,
                    layer_start=layers[0],
                    layer_end=layers[1],
                    optimizer=optimizer,
                    zero=zero,
                    shard_fraction=fraction,
                    num_in_flight=in_flight,
                    num_neighbor_stages=neighbors,
                    wire_dtype=wire_dtype,
                    curve=curve,
                ).total_bytes

            empty = memory(0.0, 0)
            per_kind[shape] = (empty, memory(0.0, 1) - empty, memory(1.0, 0) - empty)
    kinds = [per_kind[shape] for shape in shapes]

    def fit(budgets: Sequence[int]) -> tuple[float, ...] | None:
        return _fit_memory(
            fixed_bytes=[f + w * a for (f, a, _), w in zip(kinds, budgets, strict=True)],
            sharded_bytes=[z for _, _, z in kinds],
            capacity_bytes=[shape.device.memory_bytes for shape in shapes],
            even_shards=even_shards,
        )

    ranks_to_end, stage_micro_batches = sum(widths), sum(counts)  # once: thousands of ranks

    def little_budgets(slack: int) -> tuple[int, ...]:
        return tuple(
            in_flight_micro_batches(
                schedule=Schedule.ONE_F_ONE_B,
                ranks_to_end=ranks_to_end,
                rank_micro_batches=count,
                stage_micro_batches=stage_micro_batches,
                slack=slack,
                last_stage=len(widths) == 1,
            )
            for count in counts
        )

    # Little's budget with its slack where it fits (the plan's default), else without.
    little = little_budgets(0)
    roomy = little_budgets(slack_of(schedule=Schedule.ONE_F_ONE_B, widths=widths))
    for held in dict.fromkeys((roomy, little)):
        fractions = fit(held)
        if fractions is not None:
            return fractions, None if held == roomy else held, 1.0
    if not shrink:
        return None

    def budgets_for(rounds: int) -> tuple[int, ...]:
        return tuple(
            in_flight_for_rounds(budget=w, rank_micro_batches=n, num_rounds=rounds)
            for w, n in zip(little, counts, strict=True)
        )

    # Memory only falls as the round trips grow: the fewest that fit, by bisection.
    low, high = stage_round_trips(counts, little), max(counts)  # at max(counts) every budget is 1
    if fit(budgets_for(high)) is None:
        return None
    while low < high:
        middle = (low + high) // 2
        if fit(budgets_for(middle)) is None:
            low = middle + 1
        else:
            high = middle
    budgets = budgets_for(high)
    fractions = fit(budgets)
    assert fractions is not None
    return (
        fractions,
        budgets,
        stage_round_trips(counts, budgets) / stage_round_trips(counts, little),
    )


def _fit_memory(
    *,
    fixed_bytes: Sequence[float],
    sharded_bytes: Sequence[float],
    capacity_bytes: Sequence[float],
    even_shards: bool,
) -> tuple[float, ...] | None:
    """Shard fractions f under which every rank fits, fixed + f x sharded <= capacity, or
    None."""
    num_ranks = len(fixed_bytes)
    if even_shards:
        share = 1.0 / num_ranks
        fits = all(
            f + share * z <= c
            for f, z, c in zip(fixed_bytes, sharded_bytes, capacity_bytes, strict=True)
        )
        return (share,) * num_ranks if fits else None
    if all(z <= 0 for z in sharded_bytes):
        fits = all(f <= c for f, c in zip(fixed_bytes, capacity_bytes, strict=True))
        return (1.0 / num_ranks,) * num_ranks if fits else None
    # A rank's sharded bytes per unit of fraction depend on the dtype it trains in.
    fractions = water_fill(
        [(c - f) / z for f, z, c in zip(fixed_bytes, sharded_bytes, capacity_bytes, strict=True)]
    )
    if fractions is not None and not all(math.isfinite(x) for x in fractions):
        return None
    return fractions
