"""The engine against closed forms and hand-computed timelines.

- p equal stages, m micro-batches: makespan (m + p - 1)(f + b), bubble (p-1)/(m+p-1)
  (Huang et al. 2019), for GPipe and 1F1B.
- one stage: m passes, then the step's collective (not overlapped), then the optimizer,
  each priced by the cost functions directly.
- a fast GPU feeding two slow ones alternately: the greedy 1F1B timeline worked out by hand.
- a deadlocked schedule is reported with the ranks that wait on each other.
"""

from __future__ import annotations

import dataclasses

import pytest

from piebald.cost.comm import Collective, collective_time_s
from piebald.cost.compute import optimizer_step_time_s
from piebald.cost.in_flight import IN_FLIGHT_SLACK, stage_in_flight
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.plan_estimate import estimate_plan
from piebald.schedule.build import StepSchedule
from piebald.schedule.ops import (
    Backward,
    Forward,
    OptimizerStep,
    RecvActivation,
    RecvGradient,
    SendActivation,
    SendGradient,
)
from piebald.simulator.engine import simulate
from piebald.simulator.result import Lane
from piebald.specs.plan import Schedule, ZeroMode
from piebald.specs.recompute import Recompute
from sim_plans import FixedPrices, cluster, pipeline


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize("num_stages", [2, 3, 5])
@pytest.mark.parametrize("num_micro_batches", [1, 4, 8])
def test_uniform_pipeline_bubble_is_p_minus_one_over_m_plus_p_minus_one(
    schedule: Schedule, num_stages: int, num_micro_batches: int
) -> None:
    p, m = num_stages, num_micro_batches
    plan = pipeline(
        cluster(("round", p)),
        stage_ranks=[[s] for s in range(p)],
        counts=[[m]] * p,
        routes=[list(range(p))] * m,
        schedule=schedule,
    )
    f, b = 0.25, 0.5  # exact in binary: sums carry no rounding
    prices = FixedPrices(
        plan, forward_s=dict.fromkeys(range(p), f), backward_s=dict.fromkeys(range(p), b)
    )
    result = simulate(plan, prices=prices)
    assert result.deadlock is None
    assert result.pipeline_s == (m + p - 1) * (f + b)
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-12, abs=1e-15)
    for stats in result.ranks:
        assert stats.busy_s == m * (f + b)


def _one_stage(zero: ZeroMode, fractions: tuple[float, float]) -> None:
    c = cluster(("round", 2))
    plan = pipeline(
        c,
        stage_ranks=[[0, 1]],
        counts=[[3, 2]],
        routes=[[0], [1], [0], [1], [0]],
        micro_batch_size=2,
        zero=zero,
        shard_fractions=[fractions],
    )
    result = simulate(plan)
    device = c.device_of(0)
    times = pass_times(
        plan.model,
        shape=PassShape(
            device=device,
            dtype=device.training_dtype(plan.job.precision),
            micro_batch_size=2,
            seq_len=plan.job.seq_len,
            recompute=Recompute.NONE,
        ),
    )
    passes_s = 3 * times.pass_s(0, plan.model.num_layers)  # rank 0 runs three
    state_bytes = plan.model.num_params * plan.job.precision.num_bytes

    def collective(kind: Collective, uneven: bool) -> float:
        return collective_time_s(
            kind,
            num_bytes=state_bytes,
            ranks=[0, 1],
            cluster=c,
            shard_fractions=fractions if uneven else None,
        )

    owned = 1.0 if zero is ZeroMode.NONE else max(fractions)
    optimizer_s = optimizer_step_time_s(
        num_params=owned * plan.model.num_params, device=device, optimizer=plan.job.optimizer
    )
    if zero is ZeroMode.NONE:
        sync_s = collective(Collective.ALL_REDUCE, uneven=False)
    else:
        sync_s = collective(Collective.REDUCE_SCATTER, True) + collective(
            Collective.ALL_GATHER, True
        )
    expected = passes_s + sync_s + optimizer_s
    assert result.step_time_s == pytest.approx(expected, rel=1e-12)
    # The closed-form estimate says the same of a one-stage plan.
    assert estimate_plan(plan).step_time_s == pytest.approx(expected, rel=1e-12)
    # The rank with two micro-batches waits a pass for the collective: idle, not blocked.
    busy = {stats.rank: stats.busy_s for stats in result.ranks}
    assert busy[0] == pytest.approx(passes_s + optimizer_s, rel=1e-12)


def test_one_stage_replicated_is_passes_then_all_reduce_then_optimizer() -> None:
    _one_stage(ZeroMode.NONE, (0.5, 0.5))


def test_one_stage_zero1_is_passes_then_reduce_scatter_optimizer_all_gather() -> None:
    _one_stage(ZeroMode.OPTIMIZER, (0.75, 0.25))


def test_fast_gpu_feeding_two_slow_ones_matches_the_hand_timeline() -> None:
    """Rank 0 (F 1, B 2) feeds ranks 1 and 2 (F 2, B 4) micro-batches 0..3 alternately.
    In-flight budgets (Little's law, cost.memory, recorded without the slack a fan-out
    stage gets by default): rank 0 ceil(3 ranks to the end x 4/4) = 3, ranks 1 and 2
    ceil(2 x 2/4) = 1.

    t=0 r0 F0; t=1 r0 F1, r1 F0 (act 0 arrived); t=2 r0 F2, r2 F1; t=3 r0 full (3 in
    flight), r1 B0; t=4 r2 B1; t=7 r0 B0 (grad 0), r1 F2; t=9 r0 F3 (after a backward, a
    forward when it can: 2 in flight), r1 B2; t=10 r0 B1 (grad 1 came at 8), r2 F3; t=12
    r2 B3; t=13 r0 B2 (grad 2); t=16 r0 B3, done at 18.
    """
    default = pipeline(
        cluster(("round", 1), ("half", 2)),
        stage_ranks=[[0], [1, 2]],
        counts=[[4], [2, 2]],
        routes=[[0, 1], [0, 2], [0, 1], [0, 2]],
    )
    assert [stage_in_flight(default, i) for i in (0, 1)] == [(3 + IN_FLIGHT_SLACK,), (1, 1)]
    plan = dataclasses.replace(
        default,
        stages=(
            dataclasses.replace(default.stages[0], max_in_flight=(3,)),
            dataclasses.replace(default.stages[1], max_in_flight=(1, 1)),
        ),
    )
    prices = FixedPrices(
        plan, forward_s={0: 1.0, 1: 2.0, 2: 2.0}, backward_s={0: 2.0, 1: 4.0, 2: 4.0}
    )
    assert [prices.in_flight_limit(r) for r in (0, 1, 2)] == [3, 1, 1]
    result = simulate(plan, prices=prices)
    timeline = sorted(
        (i.start_s, i.rank, i.label, i.end_s)
        for i in result.intervals
        if i.lane is Lane.COMPUTE and i.kind != "optimizer"
    )
    assert timeline == [
        (0.0, 0, "F0", 1.0),
        (1.0, 0, "F1", 2.0),
        (1.0, 1, "F0", 3.0),
        (2.0, 0, "F2", 3.0),
        (2.0, 2, "F1", 4.0),
        (3.0, 1, "B0", 7.0),
        (4.0, 2, "B1", 8.0),
        (7.0, 0, "B0", 9.0),
        (7.0, 1, "F2", 9.0),
        (9.0, 0, "F3", 10.0),
        (9.0, 1, "B2", 13.0),
        (10.0, 0, "B1", 12.0),
        (10.0, 2, "F3", 12.0),
        (12.0, 2, "B3", 16.0),
        (13.0, 0, "B2", 15.0),
        (16.0, 0, "B3", 18.0),
    ]
    assert result.step_time_s == 18.0
    assert result.tokens_per_s == plan.job.tokens_per_step / 18.0
    # Busy 12 of 18 on each rank. Rank 1 ends its passes at 13 and waits at the stage's
    # (free) all-reduce for rank 2 until 16: blocked on data-parallel sync, not idle.
    stats = {s.rank: (s.busy_s, s.blocked_s, s.idle_s) for s in result.ranks}
    assert stats == {0: (12.0, 0.0, 6.0), 1: (12.0, 3.0, 3.0), 2: (12.0, 0.0, 6.0)}


def test_two_ranks_each_waiting_to_receive_first_is_a_deadlock() -> None:
    plan = pipeline(
        cluster(("round", 2)), stage_ranks=[[0], [1]], counts=[[1], [1]], routes=[[0, 1]]
    )
    broken = StepSchedule(
        kind=Schedule.ONE_F_ONE_B,
        rank_ops={
            # Rank 0 waits for the gradient before it has sent the activation ...
            0: (
                RecvGradient(micro_batch=0, peer=1),
                Backward(micro_batch=0, stage=0),
                Forward(micro_batch=0, stage=0),
                SendActivation(micro_batch=0, peer=1),
                OptimizerStep(stage=0),
            ),
            # ... and rank 1 waits for that activation.
            1: (
                RecvActivation(micro_batch=0, peer=0),
                Forward(micro_batch=0, stage=1),
                Backward(micro_batch=0, stage=1),
                SendGradient(micro_batch=0, peer=0),
                OptimizerStep(stage=1),
            ),
        },
    )
    result = simulate(plan, schedule=broken)
    assert result.deadlock is not None
    assert result.tokens_per_s == 0.0
    assert (
        set(result.deadlock.cycle) == {0, 1}
        and result.deadlock.cycle[0] == (result.deadlock.cycle[-1])
    )
    waits = {w.rank: w for w in result.deadlock.waits}
    assert waits[0].operation == "B0" and waits[0].waits_for == (1,)
    assert waits[1].operation == "F0" and waits[1].waits_for == (0,)
    assert "wait on each other" in result.deadlock.describe()


def test_a_collective_a_rank_never_reaches_is_reported_as_waiting_for_it() -> None:
    plan = pipeline(cluster(("round", 2)), stage_ranks=[[0, 1]], counts=[[1, 1]], routes=[[0], [1]])
    prices = FixedPrices(plan, forward_s={0: 1.0, 1: 1.0}, backward_s={0: 1.0, 1: 1.0})
    from piebald.schedule.ops import AllReduceGrads

    schedule = StepSchedule(
        kind=Schedule.ONE_F_ONE_B,
        rank_ops={
            0: (
                Forward(micro_batch=0, stage=0),
                Backward(micro_batch=0, stage=0),
                AllReduceGrads(stage=0),
                OptimizerStep(stage=0),
            ),
            1: (
                Forward(micro_batch=1, stage=0),
                Backward(micro_batch=1, stage=0),
                OptimizerStep(stage=0),  # forgot the all-reduce
            ),
        },
    )
    result = simulate(plan, schedule=schedule, prices=prices)
    assert result.deadlock is not None
    (wait,) = result.deadlock.waits
    assert wait.rank == 0 and wait.waits_for == (1,) and "all-reduce" in wait.operation
