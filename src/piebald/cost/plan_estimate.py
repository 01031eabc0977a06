"""Closed-form estimate of a plan's step time, throughput and peak memory per rank.

Pipeline time follows the bottleneck form of the 1F1B/GPipe makespan: the busiest stage
(or stage boundary) runs for its whole busy time, and every other stage and every boundary
adds one micro-batch's forward plus backward for the fill and drain. For p equal stages of t per
micro-batch and m micro-batches this is (m + p - 1) * t, bubble (p-1)/(m+p-1)
(Huang et al. 2019; Narayanan et al. 2021). Under 1F1B a rank holding at most w
micro-batches in flight (``cost.memory.stage_in_flight``) finishes at most w per round
trip through the later stages, which bounds the pipeline too (Little's law). A stage
boundary is as busy as its busiest NIC or port, and a hop is priced at the share of each
resource it gets among the transfers running at once (``_traffic``). Data-parallel
traffic is priced per stage by its ZeRO mode; the part of the gradient sync not hidden
behind the drain of later stages is exposed, then the optimizer step and the parameter
all-gather.

The simulator executes plans operation by operation and checks these numbers
(benchmarks/simulate_scenarios.py). What the closed form leaves out: round trips are
sums of service times, so waits behind other micro-batches at busy ranks and NICs are
not in them, and a Little's budget that exactly covers the mean round trip starves a
little (one more micro-batch in flight closes most of the gap in the simulator).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable
from dataclasses import dataclass

from piebald.cost.comm import ring_profile
from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, optimizer_step_time_s
from piebald.cost.link_resources import transfer_resources
from piebald.cost.memory import MemoryBreakdown, plan_rank_memory, stage_in_flight
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.precision import activation_message_bytes, stage_wire_dtype
from piebald.cost.zero_comm import stage_comm
from piebald.specs.cluster import Link
from piebald.specs.devices import DeviceType
from piebald.specs.plan import Plan, Prediction, ZeroMode

__all__ = [
    "PlanEstimate",
    "StageEstimate",
    "background_stretch",
    "estimate_plan",
    "model_flops_utilization",
    "residual_wait_s",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageEstimate:
    compute_s: dict[int, float]  # busy time of each rank over the step
    micro_batch_s: float  # forward + backward of one micro-batch on the slowest rank + hop_s
    hop_s: float  # one micro-batch's activation and gradient over the next boundary (0 last)
    boundary_s: float  # busy time of the link to the next stage (0 for the last stage)
    # Per working rank: the round trips through the later stages that its in-flight budget
    # forces (1F1B), and its own forward + backward of one micro-batch.
    round_trips: tuple[tuple[int, float], ...]
    sync_s: float  # data-parallel collectives at the end of the step
    optimizer_s: float
    memory: dict[int, MemoryBreakdown]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanEstimate:
    stages: tuple[StageEstimate, ...]
    pipeline_s: float
    exposed_sync_s: float
    step_time_s: float
    tokens_per_s: float
    bottleneck: str  # "stage 1" or "link 0->1"

    def prediction(self) -> Prediction:
        peaks = {
            rank: memory.total_bytes
            for stage in self.stages
            for rank, memory in stage.memory.items()
        }
        return Prediction(
            step_time_s=self.step_time_s, tokens_per_s=self.tokens_per_s, peak_memory_bytes=peaks
        )


_Ways = tuple[tuple[Link, tuple[tuple[Hashable, float], ...], tuple[int, bool]], ...]

# A resource busier than this with other traffic is priced as if at this load: the
# 1 / (1 - rho) of processor sharing has no steady state at rho = 1.
MAX_BACKGROUND = 0.8
HORIZON_ITERATIONS = 8
RESIDUAL_OF_PASS = 5 / 18  # a pass's mean residual when B = 2F (``residual_wait_s``)


def background_stretch(background_s: float, *, horizon_s: float | None) -> float:
    """How much slower a transfer moves over a resource that other traffic keeps busy
    ``background_s`` of ``horizon_s``: 1 / (1 - rho) under processor sharing (M/G/1-PS),
    rho capped at MAX_BACKGROUND; 1 without a horizon."""
    rho = background_s / horizon_s if horizon_s else 0.0
    return 1.0 / (1.0 - min(rho, MAX_BACKGROUND))


def residual_wait_s(*, busy_s: float, horizon_s: float, pass_s: float, last: bool) -> float:
    """How long a micro-batch passing through a stage waits there for the rank to finish
    what it is running. A rank busy ``busy_s`` of ``horizon_s`` (a share rho) is found
    mid-operation with probability rho, with on average the mean residual of an operation
    left: E[S^2] / 2E[S] over forwards and backwards, RESIDUAL_OF_PASS of a pass when the
    backward takes twice the forward. A micro-batch visits a stage twice (forward,
    backward), the last stage once (its backward follows its forward)."""
    visits = 1 if last else 2
    return visits * min(1.0, busy_s / horizon_s) * RESIDUAL_OF_PASS * pass_s


@dataclass(frozen=True, slots=True)
class _Crossing:
    """One way of a transfer over one resource it crosses."""

    streams: int  # transfers of this way that run over the resource at once
    capacity_bytes_per_s: float
    background_s: float  # how long the resource's other traffic keeps it busy in a step


# One way of a (sender, receiver) pair: the link's latency and bandwidth, and its crossings.
_Way = tuple[float, float, tuple[_Crossing, ...]]


@dataclass(frozen=True, slots=True)
class _Traffic:
    # Per boundary: the distinct (bytes, (way there, way back)) of its pairs, and the busy
    # time of its busiest resource over the step.
    pairs: tuple[tuple[tuple[float, tuple[_Way, _Way]], ...], ...]
    busiest_s: tuple[float, ...]

    def boundaries(self, *, horizon_s: float | None) -> list[tuple[float, float]]:
        """Per stage boundary: (busy time of its busiest resource over the step, one
        micro-batch's activation there and gradient back), the other traffic spread over
        ``horizon_s`` (not counted without one)."""
        out = []
        for pairs, boundary_s in zip(self.pairs, self.busiest_s, strict=True):
            hop_s = 0.0
            for pair_bytes, pair_ways in pairs:
                there_and_back = 0.0
                for latency_s, bandwidth, crossings in pair_ways:
                    seconds_per_byte = 1.0 / bandwidth
                    for crossing in crossings:
                        stretch = background_stretch(crossing.background_s, horizon_s=horizon_s)
                        seconds_per_byte = max(
                            seconds_per_byte,
                            crossing.streams * stretch / crossing.capacity_bytes_per_s,
                        )
                    there_and_back += latency_s + pair_bytes * seconds_per_byte
                hop_s = max(hop_s, there_and_back)
            out.append((boundary_s, hop_s))
        return out


def _traffic(plan: Plan) -> _Traffic:
    """The traffic over every stage boundary (what does not depend on the pipeline's
    length, so built once per estimate; :meth:`_Traffic.boundaries` prices the hops).

    A resource (a GPU port, a node's NIC in one direction, a site link; ``link_resources``) is
    busy for the bytes / capacity of every transfer that uses it, over all boundaries: a
    node's NIC in carries its stage's activations from the previous stage and its
    gradients from the next one.

    A hop moves at min(path rate, the share it gets of each resource it crosses). The
    simulator's network splits a resource equally among the transfers on it (processor
    sharing). The ranks of a stage run their micro-batches in step, so every rank that
    sends one way over a resource (its activations to the next stage, say) sends at once,
    and every rank that receives that way receives one transfer at a time (it posts one
    receive ahead): n = min(senders, receivers) streams, each taking n S / capacity. The
    resource's other traffic (the other way, other boundaries) is not in step with these:
    it arrives at its own times and, under processor sharing, stretches a transfer by
    1 / (1 - rho), rho the share of the step (``horizon_s``, the pipeline) that traffic
    keeps the resource busy (Kleinrock 1967, M/G/1-PS). Without a horizon it is not
    counted.
    """
    size_of = {
        rank: size
        for stage in plan.stages
        for rank, size in zip(stage.ranks, stage.micro_batch_size, strict=True)
    }
    # Thousands of ranks make hundreds of thousands of pairs: what repeats across pairs
    # (message sizes, a resource's crossing of one way) is computed once.
    message_bytes: dict[tuple[DeviceType, int], float] = {}
    busy: dict[Hashable, float] = {}
    # Per resource and way (boundary, forward?): the ranks sending and receiving that way
    # over it, and the seconds that way keeps it busy.
    ends: dict[Hashable, dict[tuple[int, bool], tuple[set[int], set[int]]]] = {}
    way_busy: dict[Hashable, dict[tuple[int, bool], float]] = {}
    # Per boundary, per (sender, receiver) pair: its bytes and both ways' links and resources.
    pairs_of: list[list[tuple[float, _Ways]]] = []
    keys_of: list[set[Hashable]] = []  # per boundary, every resource its pairs cross
    for index in range(plan.num_stages - 1):
        pairs: dict[tuple[int, int], int] = {}
        for route in plan.routes:
            pair = (route[index], route[index + 1])
            pairs[pair] = pairs.get(pair, 0) + 1
        priced: list[tuple[float, _Ways]] = []
        touched: set[Hashable] = set()
        for (sender, receiver), count in pairs.items():
            device = plan.cluster.device_of(sender)
            kind = (device, size_of[sender])
            num_bytes = message_bytes.get(kind)
            if num_bytes is None:
                num_bytes = message_bytes[kind] = activation_message_bytes(
                    device,
                    precision=plan.job.precision,
                    micro_batch_size=size_of[sender],
                    seq_len=plan.job.seq_len,
                    hidden_size=plan.model.arch.hidden_size,
                )
            ways: list[tuple[Link, tuple[tuple[Hashable, float], ...], tuple[int, bool]]] = []
            for a, b, forward in ((sender, receiver, True), (receiver, sender, False)):
                resources = transfer_resources(plan.cluster, a, b)
                way = (index, forward)
                ways.append((plan.cluster.link_between(a, b), resources, way))
                for key, capacity in resources:
                    seconds = count * num_bytes / capacity
                    busy[key] = busy.get(key, 0.0) + seconds
                    per_way = way_busy.get(key)
                    if per_way is None:
                        per_way = way_busy[key] = {}
                        ends[key] = {}
                    per_way[way] = per_way.get(way, 0.0) + seconds
                    both = ends[key].get(way)
                    if both is None:
                        both = ends[key][way] = (set(), set())
                    both[0].add(a)
                    both[1].add(b)
                    touched.add(key)
            priced.append((num_bytes, tuple(ways)))
        pairs_of.append(priced)
        keys_of.append(touched)
    crossings: dict[tuple[Hashable, tuple[int, bool], float], _Crossing] = {}

    def crossing(key: Hashable, way: tuple[int, bool], capacity: float) -> _Crossing:
        found = crossings.get((key, way, capacity))
        if found is None:
            senders, receivers = ends[key][way]
            found = crossings[key, way, capacity] = _Crossing(
                streams=min(len(senders), len(receivers)),
                capacity_bytes_per_s=capacity,
                background_s=busy[key] - way_busy[key][way],
            )
        return found

    shapes: list[tuple[tuple[float, tuple[_Way, _Way]], ...]] = []
    busiest: list[float] = []
    for priced, touched in zip(pairs_of, keys_of, strict=True):
        distinct: dict[tuple[float, tuple[_Way, _Way]], None] = {}
        for pair_bytes, pair_ways in priced:
            there, back = (
                (
                    link.latency_s,
                    link.bandwidth_bytes_per_s,
                    tuple(crossing(key, way, capacity) for key, capacity in resources),
                )
                for link, resources, way in pair_ways
            )
            distinct[pair_bytes, (there, back)] = None
        shapes.append(tuple(distinct))
        busiest.append(max((busy[key] for key in touched), default=0.0))
    return _Traffic(pairs=tuple(shapes), busiest_s=tuple(busiest))


def _stage_estimate(
    plan: Plan, stage_index: int, *, boundary: tuple[float, float], curve: EfficiencyCurve
) -> StageEstimate:
    stage = plan.stages[stage_index]
    precision = plan.job.precision
    params = float(plan.model.stage_params(stage.layer_start, stage.layer_end))
    wire = stage_wire_dtype(plan.cluster, stage.ranks, precision=precision).num_bytes
    comm = stage_comm(
        ring_profile(plan.cluster, stage.ranks),
        shard_fractions=stage.shard_fraction,
        zero=stage.zero,
        state_bytes=params * wire,
    )
    before_forward_s, during_backward_s = comm.before_forward_s, comm.during_backward_s
    budgets = stage_in_flight(plan, stage_index)
    compute: dict[int, float] = {}
    rounds: list[tuple[int, float]] = []  # (round trips its in-flight budget forces, pass)
    memory: dict[int, MemoryBreakdown] = {}
    micro_batch_s = optimizer_s = 0.0
    # Ranks of one type with the same shares cost the same: price each kind once.
    pass_of: dict[tuple[DeviceType, int], float] = {}
    memory_of: dict[tuple[DeviceType, int, int, float], MemoryBreakdown] = {}
    for index, rank in enumerate(stage.ranks):
        device = plan.cluster.device_of(rank)
        size, count = stage.micro_batch_size[index], stage.num_micro_batches[index]
        fraction = stage.shard_fraction[index]
        if (device, size) not in pass_of:
            shape = PassShape.for_job(
                plan.job, device=device, micro_batch_size=size, recompute=stage.recompute
            )
            times = pass_times(plan.model, shape=shape, curve=curve)
            forward_s = max(times.forward_s(stage.layer_start, stage.layer_end), before_forward_s)
            backward_s = max(
                times.backward_s(stage.layer_start, stage.layer_end), during_backward_s
            )
            pass_of[device, size] = forward_s + backward_s
        compute[rank] = count * pass_of[device, size]
        if count:
            micro_batch_s = max(micro_batch_s, pass_of[device, size])
        owned = params * (fraction if stage.zero is not ZeroMode.NONE else 1.0)
        optimizer_s = max(
            optimizer_s,
            optimizer_step_time_s(
                num_params=owned, device=device, optimizer=plan.job.optimizer, curve=curve
            ),
        )
        in_flight = budgets[index]
        if count:
            rounds.append((math.ceil(count / in_flight), pass_of[device, size]))
        key = (device, size, in_flight, fraction)
        if key not in memory_of:
            memory_of[key] = plan_rank_memory(
                plan, stage_index=stage_index, position=index, num_in_flight=in_flight, curve=curve
            )
        memory[rank] = memory_of[key]
    sync_s = comm.sync_s
    boundary_s, hop_s = boundary
    return StageEstimate(
        compute_s=compute,
        micro_batch_s=micro_batch_s + hop_s,
        hop_s=hop_s,
        boundary_s=boundary_s,
        round_trips=tuple(rounds),
        sync_s=sync_s,
        optimizer_s=optimizer_s,
        memory=memory,
    )


def _waits(stages: tuple[StageEstimate, ...], *, horizon_s: float | None) -> list[float]:
    """Per stage, :func:`residual_wait_s` over the pipeline. (``_pipeline`` leaves them
    out in a chain of one rank per stage, where each micro-batch arrives as its
    predecessor leaves.)"""
    if horizon_s is None:
        return [0.0] * len(stages)
    return [
        residual_wait_s(
            busy_s=max(stage.compute_s.values()),
            horizon_s=horizon_s,
            pass_s=stage.micro_batch_s - stage.hop_s,
            last=index == len(stages) - 1,
        )
        for index, stage in enumerate(stages)
    ]


def _pipeline(
    plan: Plan, alone: list[StageEstimate], traffic: _Traffic, *, horizon_s: float | None
) -> tuple[tuple[StageEstimate, ...], str, float]:
    """The stages with their boundaries priced, the bottleneck, and the pipeline time: the
    bottleneck's busy time plus the fill and drain, at least what Little's law allows."""
    boundaries = [*traffic.boundaries(horizon_s=horizon_s), (0.0, 0.0)]  # the last sends nothing
    stages = tuple(
        dataclasses.replace(
            estimate,
            micro_batch_s=estimate.micro_batch_s + hop_s,
            hop_s=hop_s,
            boundary_s=boundary_s,
        )
        for estimate, (boundary_s, hop_s) in zip(alone, boundaries, strict=True)
    )
    candidates = [
        (max(stage.compute_s.values()), index, f"stage {index}")
        for index, stage in enumerate(stages)
    ]
    candidates += [
        (stage.boundary_s, -1, f"link {index}->{index + 1}")
        for index, stage in enumerate(stages[:-1])
    ]
    bottleneck_s, bottleneck_stage, bottleneck = max(candidates)
    # Fill and drain: one micro-batch through every stage but the bottleneck stage, and
    # over every boundary (the bottleneck stage's own hop too: its last micro-batch still
    # has to cross it before the later stages can drain).
    fill_s = sum(
        stage.hop_s if index == bottleneck_stage else stage.micro_batch_s
        for index, stage in enumerate(stages)
    )
    pipeline_s = bottleneck_s + fill_s
    # Little's law: a rank holding at most w micro-batches in flight finishes at most w per
    # round trip of a micro-batch through its stage and the later ones (1F1B).
    waits = _waits(stages, horizon_s=horizon_s)
    widths = [sum(1 for n in stage.num_micro_batches if n) for stage in plan.stages]
    for index, stage in enumerate(stages):
        # In a chain of one rank per stage each micro-batch arrives as the last one leaves.
        met = any(width > 1 for width in widths[index:])
        later_s = stage.hop_s + sum(
            s.micro_batch_s + (wait_s if met else 0.0)
            for s, wait_s in zip(stages[index + 1 :], waits[index + 1 :], strict=True)
        )
        before_s = sum(s.micro_batch_s for s in stages[:index])
        for rounds, pass_s in stage.round_trips:
            pipeline_s = max(pipeline_s, rounds * (pass_s + later_s) + before_s)
    return stages, bottleneck, pipeline_s


def estimate_plan(plan: Plan, *, curve: EfficiencyCurve = DEFAULT_CURVE) -> PlanEstimate:
    """Predicted step time, tokens/s and per-rank memory of ``plan``."""
    alone = [
        _stage_estimate(plan, index, boundary=(0.0, 0.0), curve=curve)
        for index in range(plan.num_stages)
    ]
    # The hops' background traffic is spread over the pipeline, which the hops lengthen:
    # iterate to the fixed point (a longer pipeline lowers the load, so it settles fast).
    traffic = _traffic(plan)
    stages, bottleneck, pipeline_s = _pipeline(plan, alone, traffic, horizon_s=None)
    for _ in range(HORIZON_ITERATIONS):
        horizon_s = pipeline_s
        stages, bottleneck, pipeline_s = _pipeline(plan, alone, traffic, horizon_s=horizon_s)
        if abs(pipeline_s - horizon_s) <= 1e-4 * horizon_s:
            break
    # Stage s finishes its last backward before stages 0..s-1 drain theirs.
    exposed_sync_s = max(
        max(0.0, stage.sync_s - sum(s.micro_batch_s for s in stages[:index]))
        for index, stage in enumerate(stages)
    )
    step_s = pipeline_s + exposed_sync_s + max(stage.optimizer_s for stage in stages)
    return PlanEstimate(
        stages=stages,
        pipeline_s=pipeline_s,
        exposed_sync_s=exposed_sync_s,
        step_time_s=step_s,
        tokens_per_s=plan.job.tokens_per_step / step_s,
        bottleneck=bottleneck,
    )


def model_flops_utilization(plan: Plan, *, tokens_per_s: float) -> float:
    """Model FLOP/s (3 x forward, no recompute) over the sum of the used GPUs' dense peaks
    in the dtype each trains in."""
    peak = sum(
        plan.cluster.device_of(rank).training_peak_flops(plan.job.precision)
        for rank in plan.used_ranks
    )
    return plan.model.training_flops_per_token(seq_len=plan.job.seq_len) * tokens_per_s / peak
