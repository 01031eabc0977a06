"""Closed-form estimate of a plan's step time, throughput and peak memory per rank.

Pipeline time follows the bottleneck form of the 1F1B/GPipe makespan: the busiest stage
(or stage boundary) runs for its whole busy time, and every other stage and every boundary
adds one micro-batch's forward plus backward for the fill and drain. For p equal stages of t per
micro-batch and m micro-batches this is (m + p - 1) * t, bubble (p-1)/(m+p-1)
(Huang et al. 2019; Narayanan et al. 2021). Under 1F1B a rank holding at most w
micro-batches in flight (``cost.memory.stage_in_flight``) finishes at most w per round
trip through the later stages, which bounds the pipeline too (Little's law). A stage
boundary is as busy as its busiest NIC or port, and a hop is priced at the share of each
resource it gets among the transfers running at once (``_boundaries``). Data-parallel
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
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from piebald.cost.comm import ring_profile
from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, optimizer_step_time_s
from piebald.cost.layer_table import pass_times
from piebald.cost.memory import MemoryBreakdown, rank_memory, stage_in_flight
from piebald.cost.transfers import transfer_resources
from piebald.cost.zero_comm import stage_comm
from piebald.specs.cluster import Link
from piebald.specs.devices import DeviceType
from piebald.specs.plan import Plan, Prediction, ZeroMode

__all__ = ["PlanEstimate", "StageEstimate", "estimate_plan", "model_flops_utilization"]


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


_Ways = tuple[tuple[Link, tuple[tuple[Hashable, float], ...]], ...]


def _boundaries(plan: Plan, *, pass_s: Mapping[int, float]) -> list[tuple[float, float]]:
    """Per stage boundary: (busy time of its busiest resource over the step, one
    micro-batch's activation there and gradient back).

    A resource (a GPU port, a node's NIC in one direction, a site link; ``transfers``) is
    busy for the bytes / capacity of every transfer that uses it, over all boundaries: a
    node's NIC out carries its stage's activations forward and its gradients backward.

    A hop shares each resource it crosses with the streams running at once, and moves at
    min(path rate, capacity / streams) (the simulator's network splits a resource
    equally). The ranks of a stage run their micro-batches in step, so every rank that
    sends one way over a resource (its activations to the next stage, say) sends at once,
    and every rank that receives that way receives one transfer at a time (it posts one
    receive ahead): n = min(senders, receivers) streams, each taking T = n S / capacity.
    The other way over the same resource (the gradients to the previous stage) overlaps
    those only when a transfer outlasts the pass between a rank's two sends (1F1B
    alternates forward and backward, about half a pass each): its m streams count
    (T - pass / 2) / T each, clipped to [0, 1].
    """
    size_of = {
        rank: size
        for stage in plan.stages
        for rank, size in zip(stage.ranks, stage.micro_batch_size, strict=True)
    }
    token_bytes = plan.job.seq_len * plan.model.arch.hidden_size * plan.job.precision.num_bytes
    busy: dict[Hashable, float] = {}
    # Per resource and way (boundary, forward?): the ranks sending and receiving that way
    # over it, and the ranks where the ways meet (senders on a way out, else receivers).
    ends: dict[Hashable, dict[tuple[int, bool], tuple[set[int], set[int]]]] = {}
    meeting: dict[Hashable, set[int]] = {}
    bytes_of: dict[Hashable, tuple[float, float]] = {}  # (largest transfer, capacity)
    # Per boundary, per (sender, receiver) pair: its bytes and both ways' links and resources.
    pairs_of: list[list[tuple[float, _Ways]]] = []
    for index in range(plan.num_stages - 1):
        pairs: dict[tuple[int, int], int] = {}
        for route in plan.routes:
            pair = (route[index], route[index + 1])
            pairs[pair] = pairs.get(pair, 0) + 1
        priced: list[tuple[float, _Ways]] = []
        for (sender, receiver), count in pairs.items():
            num_bytes = size_of[sender] * token_bytes
            ways: list[tuple[Link, tuple[tuple[Hashable, float], ...]]] = []
            for a, b, forward in ((sender, receiver, True), (receiver, sender, False)):
                resources = transfer_resources(plan.cluster, a, b)
                ways.append((plan.cluster.link_between(a, b), resources))
                for key, capacity in resources:
                    busy[key] = busy.get(key, 0.0) + count * num_bytes / capacity
                    way = ends.setdefault(key, {}).setdefault((index, forward), (set(), set()))
                    way[0].add(a)
                    way[1].add(b)
                    outgoing = isinstance(key, tuple) and str(key[0]).endswith("-out")
                    meeting.setdefault(key, set()).add(a if outgoing else b)
                    largest = max(bytes_of.get(key, (0.0, capacity))[0], num_bytes)
                    bytes_of[key] = (largest, capacity)
            priced.append((num_bytes, tuple(ways)))
        pairs_of.append(priced)
    streams: dict[Hashable, float] = {}
    for key, per_way in ends.items():
        counts = sorted((min(len(a), len(b)) for a, b in per_way.values()), reverse=True)
        largest, capacity = bytes_of[key]
        alone_s = counts[0] * largest / capacity  # T: the busiest way's streams together
        half_pass_s = 0.5 * sum(pass_s[r] for r in meeting[key]) / len(meeting[key])
        overlap = min(1.0, max(0.0, (alone_s - half_pass_s) / alone_s))
        streams[key] = counts[0] + overlap * sum(counts[1:])
    out = []
    for priced in pairs_of:
        hop_s = boundary_s = 0.0
        for pair_bytes, pair_ways in priced:
            there_and_back = 0.0
            for link, resources in pair_ways:
                seconds_per_byte = max(
                    1.0 / link.bandwidth_bytes_per_s,
                    max(streams[key] / capacity for key, capacity in resources),
                )
                there_and_back += link.latency_s + pair_bytes * seconds_per_byte
                boundary_s = max(boundary_s, max(busy[key] for key, _ in resources))
            hop_s = max(hop_s, there_and_back)
        out.append((boundary_s, hop_s))
    return out


def _stage_estimate(
    plan: Plan, stage_index: int, *, boundary: tuple[float, float], curve: EfficiencyCurve
) -> StageEstimate:
    stage = plan.stages[stage_index]
    precision = plan.job.precision
    params = float(plan.model.stage_params(stage.layer_start, stage.layer_end))
    wire = precision.num_bytes  # weights and gradients travel in the job's width
    comm = stage_comm(
        ring_profile(plan.cluster, stage.ranks),
        shard_fractions=stage.shard_fraction,
        zero=stage.zero,
        state_bytes=params * wire,
    )
    before_forward_s, during_backward_s = comm.before_forward_s, comm.during_backward_s
    neighbors = (stage_index > 0) + (stage_index < plan.num_stages - 1)
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
            times = pass_times(
                plan.model,
                device=device,
                dtype=device.training_dtype(precision),
                micro_batch_size=size,
                seq_len=plan.job.seq_len,
                recompute=stage.recompute,
                curve=curve,
            )
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
            memory_of[key] = rank_memory(
                plan.model,
                layer_start=stage.layer_start,
                layer_end=stage.layer_end,
                device=device,
                dtype=device.training_dtype(precision),
                optimizer=plan.job.optimizer,
                zero=stage.zero,
                shard_fraction=fraction,
                micro_batch_size=size,
                seq_len=plan.job.seq_len,
                num_in_flight=in_flight,
                recompute=stage.recompute,
                num_neighbor_stages=neighbors,
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


def estimate_plan(plan: Plan, *, curve: EfficiencyCurve = DEFAULT_CURVE) -> PlanEstimate:
    """Predicted step time, tokens/s and per-rank memory of ``plan``."""
    alone = [
        _stage_estimate(plan, index, boundary=(0.0, 0.0), curve=curve)
        for index in range(plan.num_stages)
    ]
    rank_pass_s = {  # one micro-batch's forward and backward on each working rank
        rank: busy_s / count
        for stage, estimate in zip(plan.stages, alone, strict=True)
        for rank, count in zip(stage.ranks, stage.num_micro_batches, strict=True)
        if count
        for busy_s in (estimate.compute_s[rank],)
    }
    boundaries = [*_boundaries(plan, pass_s=rank_pass_s), (0.0, 0.0)]  # the last sends nothing
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
    for index, stage in enumerate(stages):
        later_s = stage.hop_s + sum(s.micro_batch_s for s in stages[index + 1 :])
        before_s = sum(s.micro_batch_s for s in stages[:index])
        for rounds, pass_s in stage.round_trips:
            pipeline_s = max(pipeline_s, rounds * (pass_s + later_s) + before_s)
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
