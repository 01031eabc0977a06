"""A 1F1B in-flight budget the plan records (the planner lowers Little's budget where it
does not fit memory): the plan validates and round-trips it, and the memory estimate, the
step-time estimate and the schedule all hold each rank to it.

- p one-rank stages holding one micro-batch each: the step is m round trips of one
  micro-batch through the whole pipeline, m (sum of passes + hops), in the simulator and
  in the estimate (its round-trip bound) alike.
- every routing of small plans under budgets below Little's: the schedule never holds more,
  and the simulated memory peak stays within the estimate.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from piebald.cost.in_flight import in_flight_micro_batches, ranks_to_end, stage_in_flight
from piebald.cost.plan_estimate import estimate_plan
from piebald.errors import SpecError
from piebald.schedule.build import build_schedule
from piebald.schedule.ops import most_in_flight
from piebald.schedule.prices import Prices
from piebald.simulator.engine import simulate
from piebald.specs.plan import Plan, Schedule
from piebald.specs.plan_io import plan_from_dict, plan_to_dict
from sim_plans import cluster, pipeline


def _with_budgets(plan: Plan, budgets: list[tuple[int, ...] | None]) -> Plan:
    stages = tuple(
        dataclasses.replace(stage, max_in_flight=budget)
        for stage, budget in zip(plan.stages, budgets, strict=True)
    )
    return dataclasses.replace(plan, stages=stages)


def _chain(num_stages: int, num_micro_batches: int, *, schedule: Schedule) -> Plan:
    return pipeline(
        cluster(("round", num_stages)),
        stage_ranks=[[s] for s in range(num_stages)],
        counts=[[num_micro_batches]] * num_stages,
        routes=[list(range(num_stages))] * num_micro_batches,
        schedule=schedule,
    )


# -- the plan ---------------------------------------------------------------------------


def test_without_a_recorded_budget_every_rank_holds_littles() -> None:
    plan = _chain(3, 6, schedule=Schedule.ONE_F_ONE_B)
    counts = [s.num_micro_batches for s in plan.stages]
    for index in range(3):
        expected = in_flight_micro_batches(
            schedule=plan.schedule,
            ranks_to_end=ranks_to_end(counts, index),
            rank_micro_batches=6,
            stage_micro_batches=6,
            slack=0,
            last_stage=index == 2,
        )
        assert stage_in_flight(plan, index) == (expected,) == (3 - index,)


def test_a_recorded_budget_is_the_budget_and_round_trips_through_json() -> None:
    plan = _with_budgets(_chain(3, 6, schedule=Schedule.ONE_F_ONE_B), [(2,), None, (1,)])
    assert [stage_in_flight(plan, i) for i in range(3)] == [(2,), (2,), (1,)]
    data = plan_to_dict(plan)
    assert [s.get("max_in_flight") for s in data["stages"]] == [[2], None, [1]]
    assert plan_from_dict(data, source="test") == plan
    # A plan written before budgets were recorded loads with Little's budget.
    for stage in data["stages"]:
        stage.pop("max_in_flight", None)
    assert all(s.max_in_flight is None for s in plan_from_dict(data, source="old").stages)


@pytest.mark.parametrize(
    ("schedule", "budget"),
    [
        (Schedule.ONE_F_ONE_B, (0,)),  # a rank with micro-batches holds at least one
        (Schedule.ONE_F_ONE_B, (7,)),  # and at most its micro-batches
        (Schedule.ONE_F_ONE_B, (1, 1)),  # one value per rank
        (Schedule.GPIPE, (2,)),  # GPipe holds every micro-batch: no budget to record
    ],
)
def test_a_budget_that_cannot_be_is_rejected_naming_the_field(
    schedule: Schedule, budget: tuple[int, ...]
) -> None:
    plan = _chain(2, 6, schedule=schedule)
    with pytest.raises(SpecError, match=r"stages\[0\]\.max_in_flight"):
        _with_budgets(plan, [budget, None])


# -- estimate and simulator -------------------------------------------------------------


@pytest.mark.parametrize(("num_stages", "num_micro_batches"), [(2, 3), (3, 4), (4, 2)])
def test_one_in_flight_everywhere_runs_one_round_trip_per_micro_batch(
    num_stages: int, num_micro_batches: int
) -> None:
    p, m = num_stages, num_micro_batches
    plan = _with_budgets(_chain(p, m, schedule=Schedule.ONE_F_ONE_B), [(1,)] * p)
    prices = Prices(plan)
    # One micro-batch in the pipeline at a time: its forwards, hops there and back, and
    # backwards, m times over; then stage 0's optimizer step.
    passes_s = sum(prices.forward_s(r) + prices.backward_s(r) for r in range(p))
    hops_s = sum(
        prices.transfer(r, r + 1).alone_s + prices.transfer(r + 1, r).alone_s for r in range(p - 1)
    )
    round_trip_s = passes_s + hops_s
    result = simulate(plan)
    assert result.deadlock is None
    assert result.step_time_s == pytest.approx(m * round_trip_s + prices.optimizer_s(0))
    estimate = estimate_plan(plan)
    assert estimate.pipeline_s == pytest.approx(m * round_trip_s)
    assert estimate.step_time_s == pytest.approx(
        m * round_trip_s + max(prices.optimizer_s(r) for r in range(p))
    )


def _small_plans() -> list[Plan]:
    """Two and three stages of one or two ranks, every routing of six micro-batches that
    gives each rank of a two-rank stage three."""
    plans = []
    c = cluster(("round", 3), ("half", 2))
    for stage_ranks in ([[0, 1], [2]], [[0], [3, 4], [1]], [[3], [0, 2]]):
        routes_per_stage = []
        for ranks in stage_ranks:
            if len(ranks) == 1:
                routes_per_stage.append([tuple(ranks * 6)])
            else:
                routes_per_stage.append(
                    [
                        tuple(ranks[1] if j in chosen else ranks[0] for j in range(6))
                        for chosen in itertools.combinations(range(6), 3)
                    ][::4]
                )
        for per_stage in itertools.product(*routes_per_stage):
            routes = [[per_stage[s][j] for s in range(len(stage_ranks))] for j in range(6)]
            plans.append(
                pipeline(
                    c,
                    stage_ranks=stage_ranks,
                    counts=[[6 // len(r)] * len(r) for r in stage_ranks],
                    routes=routes,
                )
            )
    return plans


def test_the_schedule_and_the_simulated_memory_keep_to_a_lowered_budget() -> None:
    checked = 0
    for plan in _small_plans():
        for cut in (1, 2):
            # Little's budget less ``cut``, at least one: below what the prices allow.
            budgets: list[tuple[int, ...] | None] = [
                tuple(max(1, w - cut) for w in stage_in_flight(plan, index))
                for index in range(plan.num_stages)
            ]
            lowered = _with_budgets(plan, budgets)
            schedule = build_schedule(lowered)
            for rank, ops in schedule.rank_ops.items():
                stage = lowered.stages[lowered.stage_of_rank[rank]]
                assert stage.max_in_flight is not None
                budget = stage.max_in_flight[stage.ranks.index(rank)]
                assert most_in_flight(ops) <= budget
            result = simulate(lowered, schedule=schedule)
            assert result.deadlock is None
            estimate = estimate_plan(lowered)
            peaks = estimate.prediction().peak_memory_bytes
            for stats in result.ranks:
                assert stats.peak_memory_bytes <= peaks[stats.rank] * (1 + 1e-12)
            # Less memory than with Little's budget, at no shorter a step.
            little = estimate_plan(plan)
            assert estimate.step_time_s >= little.step_time_s * (1 - 1e-12)
            assert sum(peaks.values()) <= sum(little.prediction().peak_memory_bytes.values())
            checked += 1
    assert checked > 20
