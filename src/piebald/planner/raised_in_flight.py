"""1F1B in-flight budgets raised to fewer round trips where memory allows.

Little's budget (``cost.in_flight``) is what a rank needs when every stage takes an equal
part of the step and a micro-batch waits at a later stage only for the pass it finds
running. Executed (the simulator runs the schedule operation by operation), the first
stage's budgets cap the micro-batches in flight through all the later stages, and a
micro-batch queues behind others at busy wide stages: round trips run longer than the
step model's mean, and ranks starve. Holding more costs only memory: the schedule starts
more forwards before its first backward (it keeps every rank to the plan's
``max_in_flight``). The docs' search-quality results give what it changes in the simulator.

:func:`raise_in_flight` lowers each stage's number of round trips ``rounds`` as far as
memory allows: with ``rounds`` fewer than its budgets as built take, each rank's budget
becomes ``w = ceil(n / rounds)`` (never below its budget as built), and the fewest
``rounds`` whose budgets fit every rank's memory, at its shard fraction as built, wins. Not
in a chain of one rank per stage (Little's budget is exact there: more would hold memory for
nothing), nor on the last stage (its round trip is its own passes), nor under GPipe (which
holds every micro-batch already).
"""

from __future__ import annotations

import math
from dataclasses import replace

from piebald.cost.compute import EfficiencyCurve
from piebald.cost.in_flight import chains_from, stage_in_flight, stage_round_trips
from piebald.cost.plan_fit import stage_memory_overflow
from piebald.specs.plan import Plan, Schedule, Stage

__all__ = ["raise_in_flight"]


def raise_in_flight(plan: Plan, *, curve: EfficiencyCurve) -> Plan:
    """``plan`` with each stage's budgets raised to the fewest round trips that fit
    (module docstring); ``plan`` itself where no stage's can be."""
    if plan.schedule is not Schedule.ONE_F_ONE_B:
        return plan
    chains = chains_from([sum(1 for n in s.group_micro_batches if n) for s in plan.stages])
    stages: list[Stage] = list(plan.stages)
    for index, stage in enumerate(plan.stages[:-1]):
        if chains[index]:
            continue
        budgets = _fewest_rounds(plan, index, curve=curve)
        if budgets is not None:
            stages[index] = replace(stage, max_in_flight=budgets)
    if stages == list(plan.stages):
        return plan
    return replace(plan, stages=tuple(stages))


def _fewest_rounds(plan: Plan, index: int, *, curve: EfficiencyCurve) -> tuple[int, ...] | None:
    """Stage ``index``'s budgets at the fewest round trips below its current ones that fit
    every rank, or None where none do."""
    stage = plan.stages[index]
    counts = stage.num_micro_batches
    current = stage_in_flight(plan, index)
    most = stage_round_trips(counts, current)

    def budgets_for(rounds: int) -> tuple[int, ...]:
        return tuple(
            max(w, math.ceil(n / rounds)) if n else w for n, w in zip(counts, current, strict=True)
        )

    def fits(budgets: tuple[int, ...]) -> bool:
        return stage_memory_overflow(plan, index, budgets=budgets, curve=curve) is None

    # Memory only falls as the round trips grow: the fewest that fit, by bisection.
    low, high = 1, most
    while low < high:
        middle = (low + high) // 2
        if fits(budgets_for(middle)):
            high = middle
        else:
            low = middle + 1
    return None if high == most else budgets_for(high)
