"""1F1B in-flight budgets raised to fewer round trips where memory allows
(``planner.raised_in_flight``).

A fast GPU running one block feeds eight slow GPUs running the rest: Little's budget for
the fast rank leaves it three round trips through the slow stage. Raised, it takes one;
the simulator (which executes the 1F1B schedule the budgets allow, operation by operation)
finishes the step sooner, and the estimate does too. Where the raise would not fit the
fast GPU's memory, or the stages form a chain of one rank each (Little's budget is exact
there), the plan is left as it was.
"""

from __future__ import annotations

from typing import Any

import sim_plans
from cluster_builders import HALF_GPU, ROUND_GPU
from piebald.api import simulate
from piebald.cost.compute import DEFAULT_CURVE
from piebald.cost.in_flight import num_round_trips, stage_in_flight
from piebald.cost.memory import plan_rank_memory
from piebald.cost.plan_estimate import estimate_plan
from piebald.planner.raised_in_flight import raise_in_flight
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan, Schedule, Stage, ZeroMode, round_robin_routes

NUM_BLOCKS = 10
FIRST_STAGE_LAYERS = 2  # the embedding and one block on the fast GPU; the rest on the slow ones
SLOW_RANKS = 8
MICRO_BATCHES = 24


def _cluster(round_memory: str = "100GB") -> ClusterSpec:
    fast: dict[str, Any] = {**ROUND_GPU, "memory": round_memory}
    nodes = [
        {"name": "fast", "gpu": "round", "gpus_per_node": 1, "intra_link": "100GB/s"},
        {"name": "slow", "gpu": "half", "gpus_per_node": SLOW_RANKS, "intra_link": "100GB/s"},
    ]
    spec = {"name": "relief", "gpu_types": [fast, HALF_GPU], "nodes": nodes}
    return parse_cluster(spec, source="test")


def _plan(cluster: ClusterSpec) -> Plan:
    """Stage 0: rank 0 (fast) with every micro-batch; stage 1: ranks 1-8 (slow), 3 each."""
    model = sim_plans.model(NUM_BLOCKS)
    slow = tuple(range(1, SLOW_RANKS + 1))
    stages = (
        Stage(
            layer_start=0,
            layer_end=FIRST_STAGE_LAYERS,
            ranks=(0,),
            micro_batch_size=(1,),
            num_micro_batches=(MICRO_BATCHES,),
            shard_fraction=(1.0,),
            zero=ZeroMode.NONE,
        ),
        Stage(
            layer_start=FIRST_STAGE_LAYERS,
            layer_end=model.num_layers,
            ranks=slow,
            micro_batch_size=(1,) * SLOW_RANKS,
            num_micro_batches=(MICRO_BATCHES // SLOW_RANKS,) * SLOW_RANKS,
            shard_fraction=(1.0 / SLOW_RANKS,) * SLOW_RANKS,
            zero=ZeroMode.NONE,
        ),
    )
    return Plan(
        cluster=cluster,
        model=model,
        job=JobSpec(global_batch_size=MICRO_BATCHES, seq_len=sim_plans.SEQ_LEN),
        stages=stages,
        routes=round_robin_routes(stages),
        schedule=Schedule.ONE_F_ONE_B,
    )


def _rounds(plan: Plan, stage_index: int) -> int:
    stage = plan.stages[stage_index]
    budgets = stage_in_flight(plan, stage_index)
    return int(
        max(num_round_trips(n, w) for n, w in zip(stage.num_micro_batches, budgets, strict=True))
    )


def test_the_fast_rank_needs_three_round_trips_with_littles_budget() -> None:
    plan = _plan(_cluster())
    assert _rounds(plan, 0) == 3
    assert estimate_plan(plan).stages[0].round_trips


def test_raised_budget_shortens_the_simulated_step() -> None:
    plan = _plan(_cluster())
    raised = raise_in_flight(plan, curve=DEFAULT_CURVE)
    assert raised.stages[0].max_in_flight == (MICRO_BATCHES,)  # memory is plentiful
    assert _rounds(raised, 0) == 1
    assert raised.stages[1] == plan.stages[1]  # the last stage's round trip is its passes
    before, after = simulate(plan), simulate(raised)
    assert before.deadlock is None and after.deadlock is None
    assert after.step_time_s < before.step_time_s * 0.97
    assert estimate_plan(raised).step_time_s < estimate_plan(plan).step_time_s
    # Every rank still fits, by the estimate's memory and the simulator's.
    for stage in estimate_plan(raised).stages:
        for rank, memory in stage.memory.items():
            assert memory.total_bytes <= raised.cluster.device_of(rank).memory_bytes
            assert after.peak_memory_bytes[rank] <= memory.total_bytes * (1 + 1e-9)


def test_budget_stays_where_the_raise_does_not_fit() -> None:
    def need(plan: Plan, in_flight: int) -> float:
        return plan_rank_memory(
            plan, stage_index=0, position=0, num_in_flight=in_flight
        ).total_bytes

    # The fast GPU's memory: Little's budget and half a micro-batch more (the framework's
    # reserve grows with the capacity, so settle the capacity by a few fixed-point steps).
    tight = _plan(_cluster())
    budget = stage_in_flight(tight, 0)[0]
    for _ in range(5):
        capacity = need(tight, budget) + (need(tight, budget + 1) - need(tight, budget)) / 2
        tight = _plan(_cluster(round_memory=f"{capacity:.0f}B"))
    memory_bytes = tight.cluster.device_of(0).memory_bytes
    assert need(tight, budget) <= memory_bytes < need(tight, budget + 1)
    assert raise_in_flight(tight, curve=DEFAULT_CURVE) is tight


def test_budget_stays_in_a_chain() -> None:
    """One rank per stage: Little's budget (p - s) is exact, more holds memory for nothing."""
    chain = sim_plans.pipeline(
        sim_plans.cluster(("round", 3)),
        stage_ranks=[[0], [1], [2]],
        counts=[[8], [8], [8]],
        routes=[[0, 1, 2]] * 8,
    )
    assert _rounds(chain, 0) > 1
    assert raise_in_flight(chain, curve=DEFAULT_CURVE) is chain
