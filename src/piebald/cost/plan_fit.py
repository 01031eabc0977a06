"""Whether a plan still fits its cluster's memory, rank by rank, as the planner checked it.

A plan file embeds its cluster and model, and either can be edited after planning (a GPU
type's memory lowered, a wider model): the plan still parses, but a rank no longer holds
its stage. The planner accepts a plan only where every rank's ``total_bytes``
(:func:`piebald.cost.memory.plan_rank_memory` with each rank's in-flight budget,
``stage_in_flight``) is at most its GPU's memory; this repeats that check on a loaded plan,
with the same curve (a plan made from profiles: ``cost.recorded_curve``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.in_flight import stage_in_flight
from piebald.cost.memory import plan_rank_memory
from piebald.specs.plan import Plan

__all__ = ["RankOverflow", "first_memory_overflow", "stage_memory_overflow"]

# Relative slack over the capacity: a plan is re-priced from its file, whose floats are
# exact, but a curve rebuilt from recorded numbers need not round identically to the one
# the planner priced with (a few bytes on 80 GiB).
CAPACITY_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOverflow:
    """A rank whose stage needs more memory than its GPU has."""

    stage_index: int
    rank: int
    device_name: str
    need_bytes: float
    capacity_bytes: float


def first_memory_overflow(
    plan: Plan, *, curve: EfficiencyCurve = DEFAULT_CURVE
) -> RankOverflow | None:
    """The first rank (stage by stage) that does not fit, or None where all do."""
    for stage_index in range(plan.num_stages):
        overflow = stage_memory_overflow(
            plan, stage_index, budgets=stage_in_flight(plan, stage_index), curve=curve
        )
        if overflow is not None:
            return overflow
    return None


def stage_memory_overflow(
    plan: Plan,
    stage_index: int,
    *,
    budgets: Sequence[int],
    curve: EfficiencyCurve = DEFAULT_CURVE,
) -> RankOverflow | None:
    """The first rank of stage ``stage_index`` that does not fit holding ``budgets``
    micro-batches in flight (one per rank; the planner tries budgets other than the
    plan's), or None where all do."""
    stage = plan.stages[stage_index]
    # Ranks of one GPU type, micro-batch size, budget and shard fraction need the same.
    need_of: dict[tuple[str, int, int, float], float] = {}
    for position, rank in enumerate(stage.ranks):
        device = plan.cluster.device_of(rank)
        key = (
            device.name,
            stage.micro_batch_size[position],
            budgets[position],
            stage.shard_fraction[position],
        )
        if key not in need_of:
            need_of[key] = plan_rank_memory(
                plan,
                stage_index=stage_index,
                position=position,
                num_in_flight=budgets[position],
                curve=curve,
            ).total_bytes
        need = need_of[key]
        if need > device.memory_bytes * (1.0 + CAPACITY_TOLERANCE):
            return RankOverflow(
                stage_index=stage_index,
                rank=rank,
                device_name=device.name,
                need_bytes=need,
                capacity_bytes=device.memory_bytes,
            )
    return None
