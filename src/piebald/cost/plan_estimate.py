"""Closed-form estimate of a plan's step time, throughput and peak memory per rank.

Builds the step model's terms from a plan (``cost.step_model``, where the pipeline form,
Little's bound, the horizon's fixed point and the exposed sync are written and cited): per
stage, every rank's busy time, its pass (``cost.rank_pass``: its tensor slice's compute,
its tensor group's collectives and input broadcast; the per-pass ZeRO traffic it waits for
included), the round trips its in-flight budget forces (``cost.in_flight.stage_in_flight``),
the stage's data-parallel sync priced by its ZeRO mode over one of its data-parallel
groups (``cost.data_parallel``) and its slowest optimizer step; per boundary, the exact
traffic of the plan's routes (``cost.traffic.plan_traffic``: leader to leader). A tensor
group counts as one rank of the pipeline wherever the step model counts ranks.

The simulator executes plans operation by operation and checks these numbers
(benchmarks/simulate_scenarios.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, optimizer_step_time_s
from piebald.cost.data_parallel import owned_params, plan_stage_comm
from piebald.cost.in_flight import num_round_trips, stage_in_flight
from piebald.cost.memory import MemoryBreakdown, plan_rank_memory
from piebald.cost.rank_pass import plan_rank_pass
from piebald.cost.step_model import Bottleneck, RoundTrip, StageTerms, settle
from piebald.cost.traffic import plan_traffic
from piebald.cost.zero_comm import overlapped_passes_s
from piebald.specs.devices import DeviceType
from piebald.specs.plan import Plan, Prediction, Schedule

__all__ = ["PlanEstimate", "StageEstimate", "estimate_plan", "model_flops_utilization"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageEstimate:
    compute_s: dict[int, float]  # busy time of each rank over the step
    micro_batch_s: float  # forward + backward of one micro-batch on the slowest rank + hop_s
    hop_s: float  # one micro-batch's activation and gradient over the next boundary (0 last)
    boundary_s: float  # busy time of the link to the next stage (0 for the last stage)
    # The distinct round trips through the later stages that its ranks' in-flight budgets
    # force (1F1B).
    round_trips: tuple[RoundTrip, ...]
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
    bottleneck: Bottleneck  # shown as "stage 1" or "link 0->1"

    def prediction(self) -> Prediction:
        peaks = {
            rank: memory.total_bytes
            for stage in self.stages
            for rank, memory in stage.memory.items()
        }
        return Prediction(
            step_time_s=self.step_time_s, tokens_per_s=self.tokens_per_s, peak_memory_bytes=peaks
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _StageParts:
    """A stage's step terms, with the per-rank figures the estimate reports."""

    terms: StageTerms
    compute_s: dict[int, float]
    memory: dict[int, MemoryBreakdown]


def _stage_parts(plan: Plan, stage_index: int, *, curve: EfficiencyCurve) -> _StageParts:
    stage = plan.stages[stage_index]
    comm = plan_stage_comm(plan, stage_index)
    before_forward_s, during_backward_s = comm.before_forward_s, comm.during_backward_s
    budgets = stage_in_flight(plan, stage_index)
    compute: dict[int, float] = {}
    # Per working rank: the round trips its in-flight budget forces, and its pass (ranks of
    # a kind repeat: each distinct trip once).
    trips: dict[RoundTrip, None] = {}
    memory: dict[int, MemoryBreakdown] = {}
    pass_s = optimizer_s = forward_pass_s = forward_busy_s = backward_busy_s = 0.0
    # Ranks of one type and node group with the same shares cost the same: price each kind
    # once (the node group sets a tensor group's link).
    pass_of: dict[tuple[DeviceType, int, int], float] = {}
    forward_of: dict[tuple[DeviceType, int, int], float] = {}
    memory_of: dict[tuple[DeviceType, int, int, float, bool], MemoryBreakdown] = {}
    for index, rank in enumerate(stage.ranks):
        device = plan.cluster.device_of(rank)
        size, count = stage.micro_batch_size[index], stage.num_micro_batches[index]
        fraction = stage.shard_fraction[index]
        kind = (device, size, plan.cluster.gpus[rank].group_index)
        if kind not in pass_of:
            one = plan_rank_pass(plan, stage_index=stage_index, position=index, curve=curve)
            forward_s, backward_s = overlapped_passes_s(
                forward_s=one.forward_s,
                backward_s=one.backward_s,
                before_forward_s=before_forward_s,
                during_backward_s=during_backward_s,
            )
            pass_of[kind] = forward_s + backward_s
            forward_of[kind] = forward_s
        compute[rank] = count * pass_of[kind]
        forward_busy_s = max(forward_busy_s, count * forward_of[kind])
        backward_busy_s = max(backward_busy_s, count * (pass_of[kind] - forward_of[kind]))
        optimizer_s = max(
            optimizer_s,
            optimizer_step_time_s(
                num_params=owned_params(plan, stage_index, index),
                device=device,
                optimizer=plan.job.optimizer,
                curve=curve,
            ),
        )
        in_flight = budgets[index]
        if count:
            if pass_of[kind] > pass_s:
                pass_s, forward_pass_s = pass_of[kind], forward_of[kind]
            trip = RoundTrip(rounds=num_round_trips(count, in_flight), pass_s=pass_of[kind])
            trips[trip] = None
        # A tensor group's members hold less than its leader (``plan_rank_memory``).
        key = (device, size, in_flight, fraction, rank in stage.leaders)
        if key not in memory_of:
            memory_of[key] = plan_rank_memory(
                plan, stage_index=stage_index, position=index, num_in_flight=in_flight, curve=curve
            )
        memory[rank] = memory_of[key]
    gpipe = plan.schedule is Schedule.GPIPE
    terms = StageTerms(
        busy_s=max(compute.values()),
        pass_s=pass_s,
        # A tensor group is one rank of the pipeline: count groups, by their leaders.
        num_working_ranks=sum(1 for count in stage.group_micro_batches if count),
        round_trips=tuple(trips),
        sync_s=comm.sync_s,
        optimizer_s=optimizer_s,
        # GPipe's phases, each a pipeline of its own (``step_model``).
        forward_busy_s=forward_busy_s if gpipe else None,
        forward_pass_s=forward_pass_s if gpipe else None,
        backward_busy_s=backward_busy_s if gpipe else None,
    )
    return _StageParts(terms=terms, compute_s=compute, memory=memory)


def estimate_plan(plan: Plan, *, curve: EfficiencyCurve = DEFAULT_CURVE) -> PlanEstimate:
    """Predicted step time, tokens/s and per-rank memory of ``plan``."""
    parts = [_stage_parts(plan, index, curve=curve) for index in range(plan.num_stages)]
    traffic = plan_traffic(plan)
    step = settle([part.terms for part in parts], traffic)
    boundary_s = (*(boundary.busy_s for boundary in traffic), 0.0)  # the last sends nothing
    stages = tuple(
        StageEstimate(
            compute_s=part.compute_s,
            micro_batch_s=step.micro_batch_s[index],
            hop_s=step.hop_s[index],
            boundary_s=boundary_s[index],
            round_trips=part.terms.round_trips,
            sync_s=part.terms.sync_s,
            optimizer_s=part.terms.optimizer_s,
            memory=part.memory,
        )
        for index, part in enumerate(parts)
    )
    return PlanEstimate(
        stages=stages,
        pipeline_s=step.pipeline_s,
        exposed_sync_s=step.exposed_sync_s,
        step_time_s=step.step_s,
        tokens_per_s=plan.job.tokens_per_step / step.step_s,
        bottleneck=step.bottleneck,
    )


def model_flops_utilization(plan: Plan, *, tokens_per_s: float) -> float:
    """Model FLOP/s (3 x forward, no recompute) over the sum of the used GPUs' dense peaks
    in the dtype each trains in."""
    peak = sum(
        plan.cluster.device_of(rank).training_peak_flops(plan.job.precision)
        for rank in plan.used_ranks
    )
    return plan.model.training_flops_per_token(seq_len=plan.job.seq_len) * tokens_per_s / peak
