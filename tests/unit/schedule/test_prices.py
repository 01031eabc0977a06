"""Prices are the estimate's prices: each ZeRO mode's collectives (``stage_comm``, which
the estimate sums), memory is ``rank_memory`` at the estimate's in-flight count."""

from __future__ import annotations

from collections import Counter

import pytest

from piebald.cost.comm import Collective, ring_profile
from piebald.cost.plan_estimate import estimate_plan
from piebald.schedule.build import build_schedule
from piebald.schedule.ops import (
    COMPUTE_OPS,
    P2P_OPS,
    AllGatherParams,
    AllReduceGrads,
    GatherPassParams,
    ReduceScatterGrads,
    ScatterPassGrads,
)
from piebald.schedule.prices import Prices
from piebald.specs.plan import ZeroMode
from sim_plans import cluster, pipeline

# mode: (data-parallel operations inside each pass, at the step's end), from the ZeRO paper
# (stage 1 shards optimizer state, 2 also gradients, 3 also parameters) with gradients
# accumulated over the step where they are kept whole.
OPS_OF = {
    ZeroMode.NONE: (set(), {AllReduceGrads}),
    ZeroMode.OPTIMIZER: (set(), {ReduceScatterGrads, AllGatherParams}),
    ZeroMode.GRADIENTS: ({ScatterPassGrads}, {AllGatherParams}),
    ZeroMode.FULL: ({GatherPassParams, ScatterPassGrads}, set()),
}


@pytest.mark.parametrize("zero", list(ZeroMode))
def test_schedule_and_prices_run_each_modes_collectives(zero: ZeroMode) -> None:
    """A stage of three ranks: every rank's schedule holds exactly the mode's collectives
    (each per-pass one once per pass that needs it), each priced as ``stage_comm`` prices
    it, and the collectives of other modes are priced 0."""
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
    prices = Prices(plan)
    per_pass, step_end = OPS_OF[zero]
    for ops in build_schedule(plan, prices=prices).rank_ops.values():
        kinds = Counter(type(op) for op in ops)
        dp_ops = {kind for kind in kinds if kind not in (*COMPUTE_OPS, *P2P_OPS)}
        assert dp_ops == per_pass | step_end
        assert kinds[GatherPassParams] == (4 if GatherPassParams in per_pass else 0)
        assert kinds[ScatterPassGrads] == (2 if ScatterPassGrads in per_pass else 0)
        assert all(kinds[kind] == 1 for kind in step_end)
    priced = prices.stages[0]
    profile = ring_profile(c, (0, 1, 2))
    state_bytes = plan.model.num_params * plan.job.precision.num_bytes

    def time_s(kind: Collective, uneven: bool = True) -> float:
        return profile.time_s(
            kind, num_bytes=state_bytes, shard_fractions=fractions if uneven else None
        )

    expected = {
        "gather_pass_s": time_s(Collective.ALL_GATHER) if GatherPassParams in per_pass else 0,
        "scatter_pass_s": (
            time_s(Collective.REDUCE_SCATTER) if ScatterPassGrads in per_pass else 0
        ),
        "all_reduce_s": (
            time_s(Collective.ALL_REDUCE, uneven=False) if AllReduceGrads in step_end else 0
        ),
        "reduce_scatter_s": (
            time_s(Collective.REDUCE_SCATTER) if ReduceScatterGrads in step_end else 0
        ),
        "all_gather_s": time_s(Collective.ALL_GATHER) if AllGatherParams in step_end else 0,
    }
    assert {name: getattr(priced, name) for name in expected} == expected
    assert sum(expected.values()) > 0
    assert priced.before_forward_s == expected["gather_pass_s"]
    assert priced.during_backward_s == expected["gather_pass_s"] + expected["scatter_pass_s"]
    step_end_s = expected["all_reduce_s"] + expected["reduce_scatter_s"]
    assert priced.sync_s == step_end_s + expected["all_gather_s"]


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
