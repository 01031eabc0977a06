"""Prices are the estimate's prices: the per-pass and per-step collectives add up to
``stage_comm``, memory is ``rank_memory`` at the estimate's in-flight count."""

from __future__ import annotations

import pytest
from sim_plans import cluster, pipeline

from piebald.cost.comm import ring_profile
from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.zero_comm import stage_comm
from piebald.schedule.prices import Prices
from piebald.specs.plan import ZeroMode


@pytest.mark.parametrize("zero", list(ZeroMode))
def test_collectives_add_up_to_stage_comm(zero: ZeroMode) -> None:
    c = cluster(("round", 3))
    fractions = (0.5, 0.25, 0.25) if zero is not ZeroMode.NONE else (1 / 3,) * 3
    plan = pipeline(
        c,
        stage_ranks=[[0, 1, 2]],
        counts=[[2, 2, 2]],  # equal: ZeRO-2/3 ranks run in lockstep
        routes=[[0], [1], [2], [0], [1], [2]],
        zero=zero,
        shard_fractions=[fractions],
    )
    priced = Prices(plan).stages[0]
    comm = stage_comm(
        ring_profile(c, (0, 1, 2)),
        shard_fractions=fractions,
        zero=zero,
        state_bytes=plan.model.num_params * plan.job.precision.num_bytes,
    )
    assert priced.gather_pass_s == pytest.approx(comm.before_forward_s, rel=1e-12)
    assert priced.gather_pass_s + priced.scatter_pass_s == pytest.approx(
        comm.during_backward_s, rel=1e-12
    )
    step_end = priced.all_reduce_s + priced.reduce_scatter_s + priced.all_gather_s
    assert step_end == pytest.approx(comm.sync_s, rel=1e-12)


def test_memory_at_the_in_flight_budget_is_the_estimate() -> None:
    plan = pipeline(
        cluster(("round", 1), ("half", 2)),
        stage_ranks=[[0], [1, 2]],
        counts=[[6], [4, 2]],
        routes=[[0, 1], [0, 2], [0, 1], [0, 1], [0, 2], [0, 1]],
    )
    prices = Prices(plan)
    estimated = estimate_plan(plan).prediction().peak_memory_bytes
    for rank in plan.used_ranks:
        held = prices.static_memory_bytes(rank) + prices.in_flight_limit(
            rank
        ) * prices.activation_bytes(rank)
        assert held == pytest.approx(estimated[rank], rel=1e-12)
        assert prices.activation_bytes(rank) > 0
