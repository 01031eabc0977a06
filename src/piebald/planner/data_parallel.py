"""A one-stage data-parallel plan over every GPU: the simplest heterogeneous plan.

Micro-batches go to GPUs by exact min-makespan allocation (fast GPUs take more), training
state is sharded in proportion to GPU memory (Cephalo's decoupling of compute share from
state share), and the cheapest ZeRO mode and recompute setting that fit every GPU win.
It is the starting point of the searching planner and a baseline of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from piebald.cost.compute import (
    DEFAULT_CURVE,
    EfficiencyCurve,
    layer_backward_time_s,
    layer_forward_time_s,
)
from piebald.cost.plan_estimate import PlanEstimate, estimate_plan
from piebald.planner.allocation import min_makespan_counts
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, Schedule, Stage, ZeroMode, weighted_round_robin

__all__ = ["Infeasible", "ScoredPlan", "build_data_parallel_plan"]

# Cheapest first: less communication and no recomputation beat memory savings.
_ZERO_ORDER = (ZeroMode.NONE, ZeroMode.OPTIMIZER, ZeroMode.GRADIENTS, ZeroMode.FULL)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoredPlan:
    plan: Plan
    estimate: PlanEstimate


class Infeasible(Exception):  # noqa: N818 - a planning outcome, not a programming error
    """No plan fits memory; the message says what does not fit."""


def _micro_batch_time_s(
    model: ModelSpec,
    *,
    cluster: ClusterSpec,
    rank: int,
    job: JobSpec,
    micro_batch_size: int,
    recompute: bool,
    curve: EfficiencyCurve,
) -> float:
    device = cluster.device_of(rank)
    dtype = device.training_dtype(job.precision)
    return sum(
        layer_forward_time_s(
            layer,
            device=device,
            dtype=dtype,
            micro_batch_size=micro_batch_size,
            seq_len=job.seq_len,
            curve=curve,
        )
        + layer_backward_time_s(
            layer,
            device=device,
            dtype=dtype,
            micro_batch_size=micro_batch_size,
            seq_len=job.seq_len,
            recompute=recompute,
            curve=curve,
        )
        for layer in model.layers
    )


def _fits(estimate: PlanEstimate, cluster: ClusterSpec) -> bool:
    return all(
        memory.total_bytes <= cluster.device_of(rank).memory_bytes
        for stage in estimate.stages
        for rank, memory in stage.memory.items()
    )


def build_data_parallel_plan(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    micro_batch_size: int = 1,
    curve: EfficiencyCurve = DEFAULT_CURVE,
) -> ScoredPlan:
    """The fastest memory-feasible one-stage plan over all GPUs at ``micro_batch_size``."""
    if job.global_batch_size % micro_batch_size:
        raise ValueError(
            f"global batch {job.global_batch_size} is not a multiple of the "
            f"micro-batch size {micro_batch_size}"
        )
    ranks = tuple(gpu.rank for gpu in cluster.gpus)
    memory = [cluster.device_of(rank).memory_bytes for rank in ranks]
    best: ScoredPlan | None = None
    smallest_peak_excess = float("inf")
    for recompute in (False, True):
        times = [
            _micro_batch_time_s(
                model,
                cluster=cluster,
                rank=rank,
                job=job,
                micro_batch_size=micro_batch_size,
                recompute=recompute,
                curve=curve,
            )
            for rank in ranks
        ]
        counts = min_makespan_counts(times, job.global_batch_size // micro_batch_size)
        order = weighted_round_robin(counts)
        for zero in _ZERO_ORDER:
            fractions = (
                tuple(1.0 / len(ranks) for _ in ranks)
                if zero is ZeroMode.NONE
                else tuple(m / sum(memory) for m in memory)
            )
            stage = Stage(
                layer_start=0,
                layer_end=model.num_layers,
                ranks=ranks,
                micro_batch_size=(micro_batch_size,) * len(ranks),
                num_micro_batches=tuple(counts),
                shard_fraction=fractions,
                zero=zero,
                recompute=recompute,
            )
            plan = Plan(
                cluster=cluster,
                model=model,
                job=job,
                stages=(stage,),
                routes=tuple((ranks[i],) for i in order),
                schedule=Schedule.ONE_F_ONE_B,
            )
            estimate = estimate_plan(plan, curve=curve)
            if not _fits(estimate, cluster):
                smallest_peak_excess = min(
                    smallest_peak_excess,
                    max(
                        memory_.total_bytes - cluster.device_of(rank).memory_bytes
                        for rank, memory_ in estimate.stages[0].memory.items()
                    ),
                )
                continue
            if best is None or estimate.step_time_s < best.estimate.step_time_s:
                best = ScoredPlan(plan=_with_prediction(plan, estimate), estimate=estimate)
    if best is None:
        raise Infeasible(
            f"{model.name} does not fit one-stage data parallelism on "
            f"{cluster.name}: even fully sharded with recompute, the fullest GPU "
            f"is {smallest_peak_excess / 2**30:.1f} GiB over its memory"
        )
    return best


def _with_prediction(plan: Plan, estimate: PlanEstimate) -> Plan:
    return Plan(
        cluster=plan.cluster,
        model=plan.model,
        job=plan.job,
        stages=plan.stages,
        routes=plan.routes,
        schedule=plan.schedule,
        predicted=estimate.prediction(),
        notes=(
            "one-stage data-parallel plan: micro-batches by min-makespan "
            "allocation, state shards by memory",
        ),
    )
