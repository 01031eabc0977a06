"""Schedules and prices of tensor-parallel plans.

- Leaders stand for their groups: under GPipe (whose order does not depend on prices) the
  leaders' lists are exactly the lists of the same plan with each tensor group collapsed
  onto its leader at degree 1.
- A follower's list is its leader's without transfers; no transfer names a follower.
- Step-end collectives run where a data-parallel group has several members: none in a
  stage of one tensor group, in every list of a TP 4 x DP 2 stage.
- Prices come from the estimate's functions: a rank's passes from ``plan_rank_pass``, a
  stage's collectives from ``plan_stage_comm``, and the estimate's busy time of every rank
  is its micro-batches times the prices' forward plus backward.
"""

from __future__ import annotations

import pytest

from piebald.cost.data_parallel import plan_stage_comm
from piebald.cost.memory import plan_rank_memory
from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.rank_pass import plan_rank_pass
from piebald.schedule.build import build_schedule
from piebald.schedule.ops import P2P_OPS, AllReduceGrads, Backward, Forward, ReduceScatterGrads
from piebald.schedule.prices import Prices
from piebald.specs.plan import Schedule, ZeroMode
from tensor_plans import collapsed, tp4_dp2_plan, tp_plan, tp_stage, two_node_plan


def test_under_gpipe_leaders_run_the_collapsed_plans_lists() -> None:
    plan = two_node_plan("gpt2", cut=7, schedule=Schedule.GPIPE, num_micro_batches=16)
    ops = build_schedule(plan).rank_ops
    one_per_group = build_schedule(collapsed(plan)).rank_ops
    leaders = plan.stages[0].leaders
    assert {rank: ops[rank] for rank in leaders} == {rank: one_per_group[rank] for rank in leaders}


@pytest.mark.parametrize("schedule", list(Schedule))
def test_followers_run_their_leaders_passes_and_no_transfers(schedule: Schedule) -> None:
    plan = two_node_plan("gpt2", cut=7, schedule=schedule, num_micro_batches=16)
    ops = build_schedule(plan).rank_ops
    assert set(ops) == set(plan.used_ranks)
    stage = plan.stages[0]
    followers = [rank for rank in stage.ranks if rank not in stage.leaders]
    for rank in followers:
        leader = stage.leader_of(rank)
        assert ops[rank] == tuple(op for op in ops[leader] if not isinstance(op, P2P_OPS))
        routed = [j for j, route in enumerate(plan.routes) if route[0] == leader]
        assert sorted(op.micro_batch for op in ops[rank] if isinstance(op, Forward)) == routed
        assert sorted(op.micro_batch for op in ops[rank] if isinstance(op, Backward)) == routed
    peers = {op.peer for rank_ops in ops.values() for op in rank_ops if isinstance(op, P2P_OPS)}
    assert peers.isdisjoint(followers)


def test_step_end_collectives_run_per_data_parallel_group() -> None:
    one_group = tp_plan(
        "gpt2", [tp_stage(layers=(0, 14), ranks=range(4), degree=4, num_micro_batches=4)]
    )
    for rank_ops in build_schedule(one_group).rank_ops.values():
        assert not any(isinstance(op, AllReduceGrads) for op in rank_ops)
    plan = tp4_dp2_plan("gpt2")
    ops = build_schedule(plan).rank_ops
    assert all(sum(isinstance(op, AllReduceGrads) for op in ops[rank]) == 1 for rank in range(8))
    sharded = tp4_dp2_plan("gpt2", zero=ZeroMode.OPTIMIZER)
    ops = build_schedule(sharded).rank_ops
    assert all(
        sum(isinstance(op, ReduceScatterGrads) for op in ops[rank]) == 1 for rank in range(8)
    )


def test_prices_are_the_estimates_functions_with_its_arguments() -> None:
    plan = two_node_plan("llama-3-8b", cut=14)
    prices = Prices(plan)
    estimate = estimate_plan(plan)
    for index, stage in enumerate(plan.stages):
        assert prices.stages[index] == plan_stage_comm(plan, index)
        for position, rank in enumerate(stage.ranks):
            one = plan_rank_pass(plan, stage_index=index, position=position)
            assert prices.forward_s(rank) == one.forward_s
            assert prices.backward_s(rank) == one.backward_s
            assert prices.tensor_forward_s(rank) == one.tensor_forward_s
            assert (prices.tensor_forward_s(rank) > 0) == (stage.tensor_parallel_degree > 1)
            count = stage.num_micro_batches[position]
            assert estimate.stages[index].compute_s[rank] == pytest.approx(
                count * (prices.forward_s(rank) + prices.backward_s(rank)), rel=1e-12
            )
            static = plan_rank_memory(
                plan, stage_index=index, position=position, num_in_flight=0
            ).total_bytes
            assert prices.static_memory_bytes(rank) == static
