"""Where a plan's step time goes, what limits each GPU, and what else was considered."""

from __future__ import annotations

from dataclasses import dataclass

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.plan_estimate import PlanEstimate, estimate_plan
from piebald.cost.step_model import Bottleneck
from piebald.specs.plan import Plan

__all__ = ["Explanation", "GpuVerdict", "StageTime", "explain_plan"]

MEMORY_BOUND_FRACTION = 0.9  # of capacity: no room left for a bigger share of work
COMPUTE_BOUND_FRACTION = 0.9  # of the step: the GPU is the one everybody waits for


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTime:
    index: int
    layers: tuple[int, int]
    tensor_parallel_degree: int  # ranks per tensor group (1: none)
    num_tensor_groups: int  # the stage's pipeline width: its tensor groups
    compute_s: float  # the stage's busiest GPU, per step
    bubble_s: float  # pipeline time that busiest GPU spends waiting
    p2p_s: float  # busy time of the link to the next stage
    sync_s: float  # data-parallel collectives at the end of the step
    exposed_sync_s: float  # the part the drain of earlier stages does not hide


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuVerdict:
    rank: int
    device: str
    stage: int
    busy_fraction: float
    memory_bytes: float
    capacity_bytes: float
    verdict: str  # "memory-bound", "compute-bound" or "waits ..."


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    estimate: PlanEstimate
    stages: tuple[StageTime, ...]
    gpus: tuple[GpuVerdict, ...]
    optimizer_s: float


def explain_plan(plan: Plan, *, curve: EfficiencyCurve = DEFAULT_CURVE) -> Explanation:
    estimate = estimate_plan(plan, curve=curve)
    stages = []
    gpus = []
    for index, (stage, stage_estimate) in enumerate(zip(plan.stages, estimate.stages, strict=True)):
        busiest = max(stage_estimate.compute_s.values())
        drained = sum(s.micro_batch_s for s in estimate.stages[:index])
        stages.append(
            StageTime(
                index=index,
                layers=(stage.layer_start, stage.layer_end),
                tensor_parallel_degree=stage.tensor_parallel_degree,
                num_tensor_groups=len(stage.tensor_groups),
                compute_s=busiest,
                bubble_s=max(0.0, estimate.pipeline_s - busiest),
                p2p_s=stage_estimate.boundary_s,
                sync_s=stage_estimate.sync_s,
                exposed_sync_s=max(0.0, stage_estimate.sync_s - drained),
            )
        )
        for rank in stage.ranks:
            memory = stage_estimate.memory[rank].total_bytes
            capacity = plan.cluster.device_of(rank).memory_bytes
            busy = stage_estimate.compute_s[rank] / estimate.step_time_s
            if memory >= MEMORY_BOUND_FRACTION * capacity:
                verdict = "memory-bound"
            elif estimate.bottleneck == Bottleneck(stage_index=index, link=False) and (
                stage_estimate.compute_s[rank] >= COMPUTE_BOUND_FRACTION * busiest
            ):
                verdict = "compute-bound: the bottleneck"
            elif stage_estimate.compute_s[rank] >= COMPUTE_BOUND_FRACTION * estimate.pipeline_s:
                verdict = "compute-bound"
            else:
                verdict = f"waits for {estimate.bottleneck}"
            gpus.append(
                GpuVerdict(
                    rank=rank,
                    device=plan.cluster.device_of(rank).name,
                    stage=index,
                    busy_fraction=busy,
                    memory_bytes=memory,
                    capacity_bytes=capacity,
                    verdict=verdict,
                )
            )
    return Explanation(
        estimate=estimate,
        stages=tuple(stages),
        gpus=tuple(gpus),
        optimizer_s=max(s.optimizer_s for s in estimate.stages),
    )
