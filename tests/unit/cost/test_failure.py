"""The price of a failure and the checkpoint interval (``cost.failure``) against closed forms:
Young's and Daly's intervals worked out by hand, Daly's tending to Young's as the save
shrinks against the MTBF, the first-order overhead minimised at Young's interval (brute
force over intervals), and a checkpoint's bytes summing to the model's fp32 master and
moments however a plan shards them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cluster_builders import cluster, group
from piebald.cost.failure import (
    DEFAULT_DETECT_S,
    DEFAULT_READ_BYTES_PER_S,
    DEFAULT_REPLAN_S,
    DEFAULT_RESTART_S,
    DEFAULT_WRITE_BYTES_PER_S,
    FailureCost,
    FailureModel,
    checkpoint_restore_s,
    checkpoint_save_s,
    daly_interval_s,
    failure_cost,
    interval_steps,
    node_checkpoint_bytes,
    overhead_fraction,
    price_failures,
    rank_checkpoint_bytes,
    young_interval_s,
)
from piebald.errors import ArgumentError
from piebald.specs.devices import Dtype
from piebald.specs.job import Optimizer
from piebald.specs.plan import Plan, Schedule, ZeroMode
from tensor_plans import tp4_dp2_plan, tp_plan, tp_stage, two_node_plan

# -- the intervals, by hand ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("save_s", "mtbf_s", "expected_s"),
    [
        (50.0, 3600.0, 600.0),  # sqrt(2 * 50 * 3600) = sqrt(360000)
        (10.0, 86400.0, math.sqrt(1_728_000.0)),  # 1314.53 s
        (2.0, 100.0, 20.0),  # sqrt(400)
        (0.0, 3600.0, 0.0),
    ],
)
def test_young_interval_is_sqrt_of_twice_save_times_mtbf(
    save_s: float, mtbf_s: float, expected_s: float
) -> None:
    assert young_interval_s(save_s=save_s, mtbf_s=mtbf_s) == pytest.approx(expected_s, rel=1e-12)


def test_daly_interval_by_hand() -> None:
    # delta = 50, M = 3600: delta / 2M = 1/144, its root 1/12; sqrt(2 delta M) = 600, so
    # 600 (1 + 1/36 + 1/1296) - 50 = 600 + 16.6667 + 0.46296 - 50.
    assert daly_interval_s(save_s=50.0, mtbf_s=3600.0) == pytest.approx(
        600.0 + 600.0 / 36.0 + 600.0 / 1296.0 - 50.0, rel=1e-12
    )
    assert daly_interval_s(save_s=50.0, mtbf_s=3600.0) == pytest.approx(567.1296, abs=1e-4)


@pytest.mark.parametrize("save_s", [7200.0, 7200.1, 1e6])
def test_daly_interval_is_the_mtbf_once_the_save_reaches_twice_it(save_s: float) -> None:
    assert daly_interval_s(save_s=save_s, mtbf_s=3600.0) == 3600.0


def test_daly_tends_to_young_as_the_save_shrinks_against_the_mtbf() -> None:
    mtbf_s = 86400.0
    gaps = []
    for ratio in (1e-2, 1e-4, 1e-6, 1e-8):
        save_s = ratio * mtbf_s
        young = young_interval_s(save_s=save_s, mtbf_s=mtbf_s)
        daly = daly_interval_s(save_s=save_s, mtbf_s=mtbf_s)
        x = math.sqrt(ratio / 2.0)
        # daly / young = 1 + x/3 + x^2/9 - x = 1 - (2/3) x + x^2 / 9, exactly.
        assert daly / young == pytest.approx(1.0 - 2.0 * x / 3.0 + x * x / 9.0, rel=1e-9)
        gaps.append(abs(daly / young - 1.0))
    assert gaps == sorted(gaps, reverse=True)
    assert gaps[-1] < 1e-4


def test_interval_steps_rounds_to_whole_steps_of_at_least_one() -> None:
    assert interval_steps(600.0, step_time_s=7.0) == 86  # 85.7
    assert interval_steps(600.0, step_time_s=8.0) == 75
    assert interval_steps(0.0, step_time_s=1.0) == 1
    assert interval_steps(0.4, step_time_s=1.0) == 1


# -- the overhead is least near Young's and Daly's intervals ---------------------------------


@pytest.mark.parametrize(
    ("save_s", "mtbf_s", "recovery_s"),
    [(10.0, 86400.0, 60.0), (50.0, 3600.0, 120.0), (1.0, 3 * 3600.0, 0.0)],
)
def test_overhead_is_least_at_young_interval_brute_force(
    save_s: float, mtbf_s: float, recovery_s: float
) -> None:
    young = young_interval_s(save_s=save_s, mtbf_s=mtbf_s)
    grid = [young * (0.2 + 0.0005 * i) for i in range(5000)]  # 0.2 .. 2.7 x Young's
    costs = [
        overhead_fraction(interval_s=t, save_s=save_s, mtbf_s=mtbf_s, recovery_s=recovery_s)
        for t in grid
    ]
    best = grid[costs.index(min(costs))]
    assert best == pytest.approx(young, rel=1e-3)
    daly = daly_interval_s(save_s=save_s, mtbf_s=mtbf_s)
    at_daly = overhead_fraction(
        interval_s=daly, save_s=save_s, mtbf_s=mtbf_s, recovery_s=recovery_s
    )
    # Daly's interval is shorter by (2/3) sqrt(delta / 2M) of Young's; the first-order
    # overhead is flat there: within 1% of its minimum.
    assert at_daly <= min(costs) * 1.01


def test_overhead_by_hand() -> None:
    # 10 / 1000 + (500 + 100) / 86400
    assert overhead_fraction(
        interval_s=1000.0, save_s=10.0, mtbf_s=86400.0, recovery_s=100.0
    ) == pytest.approx(0.01 + 600.0 / 86400.0, rel=1e-12)


def test_price_failures_picks_daly_steps_whose_overhead_is_the_least_in_whole_steps() -> None:
    plan = _pipeline_plan()
    model = FailureModel(mtbf_s=6 * 3600.0, write_bytes_per_s=1e8)  # a slow disk: long saves
    step_s = 5.0
    price = price_failures(plan, model=model, step_time_s=step_s)
    assert not price.given and price.checkpoint_every == price.daly_steps
    overheads = {
        steps: overhead_fraction(
            interval_s=steps * step_s,
            save_s=price.save_s,
            mtbf_s=model.mtbf_s,
            recovery_s=price.cost.recovery_s,
        )
        for steps in range(1, 4 * price.young_steps)
    }
    best = min(overheads, key=overheads.__getitem__)
    assert abs(price.young_steps - best) <= 1
    assert price.overhead == pytest.approx(overheads[price.daly_steps], rel=1e-12)
    assert price.overhead <= overheads[best] * 1.01
    assert price.daly_overhead == price.overhead


# -- one failure's cost ----------------------------------------------------------------------


def test_failure_cost_adds_its_parts_and_loses_half_an_interval() -> None:
    model = FailureModel(mtbf_s=3600.0, detect_s=15.0, restart_s=30.0, replan_s=12.0)
    cost = failure_cost(model=model, restore_s=4.0, step_time_s=2.0, checkpoint_every=100)
    assert cost == FailureCost(
        detect_s=15.0, restart_s=30.0, replan_s=12.0, restore_s=4.0, lost_work_s=100.0
    )
    assert cost.recovery_s == 61.0
    assert cost.total_s == 161.0


def test_price_failures_at_a_given_interval() -> None:
    plan = _pipeline_plan()
    model = FailureModel(mtbf_s=24 * 3600.0)
    price = price_failures(plan, model=model, step_time_s=3.0, checkpoint_every=40)
    assert price.given and price.checkpoint_every == 40
    assert price.cost.lost_work_s == 60.0
    assert price.save_s == pytest.approx(checkpoint_save_s(plan))
    assert price.cost.restore_s == pytest.approx(checkpoint_restore_s(plan))
    assert price.overhead == pytest.approx(
        price.save_s / 120.0 + (60.0 + price.cost.recovery_s) / model.mtbf_s, rel=1e-12
    )
    assert price.daly_overhead <= price.overhead


def test_defaults_are_the_documented_constants() -> None:
    model = FailureModel(mtbf_s=1.0)
    assert model.write_bytes_per_s == DEFAULT_WRITE_BYTES_PER_S == 20e9 / 8
    assert model.read_bytes_per_s == DEFAULT_READ_BYTES_PER_S
    assert (model.detect_s, model.restart_s, model.replan_s) == (
        DEFAULT_DETECT_S,
        DEFAULT_RESTART_S,
        DEFAULT_REPLAN_S,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mtbf_s", 0.0),
        ("mtbf_s", math.inf),
        ("write_bytes_per_s", 0.0),
        ("read_bytes_per_s", -1.0),
        ("detect_s", -1.0),
        ("restart_s", math.nan),
        ("replan_s", "15s"),
    ],
)
def test_failure_model_refuses_bad_values_naming_them(field: str, value: object) -> None:
    values: dict[str, object] = {"mtbf_s": 3600.0, field: value}
    with pytest.raises(ArgumentError, match=field):
        FailureModel(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [0, -1, 2.5, True])
def test_a_bad_interval_is_refused(steps: object) -> None:
    with pytest.raises(ArgumentError, match="checkpoint_every"):
        price_failures(
            _pipeline_plan(),
            model=FailureModel(mtbf_s=3600.0),
            step_time_s=1.0,
            checkpoint_every=steps,  # type: ignore[arg-type]
        )


# -- what a checkpoint holds, and how long it takes ------------------------------------------

TWO_NODES = cluster(
    "two-nodes",
    group("a", "H100-SXM", 4, count=2, intra="450GB/s", nic=("infiniband", "50GB/s")),
)
MODEL = "llama-3.2-1b"  # ties its embedding and head


def _pipeline_plan(zero: ZeroMode = ZeroMode.OPTIMIZER) -> Plan:
    """Two stages of four ranks, one per node, uneven shards on the first where ``zero``
    shards anything (a replicated stage's are even)."""
    plan = tp_plan(
        MODEL,
        [
            tp_stage(layers=(0, 7), ranks=range(4), degree=1, num_micro_batches=2, zero=zero),
            tp_stage(layers=(7, 18), ranks=range(4, 8), degree=1, num_micro_batches=2, zero=zero),
        ],
        cluster_spec=TWO_NODES,
        # Per-pass ZeRO (2, 3) keeps a stage's ranks in lockstep: GPipe.
        schedule=Schedule.GPIPE if zero.per_pass else Schedule.ONE_F_ONE_B,
    )
    if zero.replicated:
        return plan
    first = dataclasses.replace(plan.stages[0], shard_fraction=(0.4, 0.3, 0.2, 0.1))
    return dataclasses.replace(plan, stages=(first, plan.stages[1]))


def _with_job(plan: Plan, **changes: object) -> Plan:
    return dataclasses.replace(plan, job=dataclasses.replace(plan.job, **changes))


def _params(plan: Plan) -> float:
    return float(plan.model.num_params)


@pytest.mark.parametrize("zero", list(ZeroMode))
def test_a_checkpoint_holds_master_and_moments_once_whatever_the_zero_mode(
    zero: ZeroMode,
) -> None:
    plan = _pipeline_plan(zero)
    per_rank = rank_checkpoint_bytes(plan)
    assert set(per_rank) == set(plan.used_ranks)
    # AdamW: fp32 master, m and v, 12 bytes a parameter, each owned by one rank.
    assert sum(per_rank.values()) == pytest.approx(12.0 * _params(plan), rel=1e-12)
    # Each rank owns its fraction of its stage's state, whatever the mode (a replicated
    # optimizer steps the whole, but checkpoints only its shard).
    first = [per_rank[rank] for rank in plan.stages[0].ranks]
    fractions = plan.stages[0].shard_fraction
    assert [b / first[0] for b in first] == pytest.approx([f / fractions[0] for f in fractions])


def test_sgd_checkpoints_the_master_alone_and_fp32_the_same_bytes() -> None:
    plan = _pipeline_plan()
    sgd = _with_job(plan, optimizer=Optimizer.SGD)
    assert sum(rank_checkpoint_bytes(sgd).values()) == pytest.approx(4.0 * _params(plan))
    fp32 = _with_job(plan, precision=Dtype.FP32)  # the weights are the master
    assert rank_checkpoint_bytes(fp32) == pytest.approx(rank_checkpoint_bytes(plan))


def test_a_tensor_groups_members_own_nothing_of_what_it_holds_whole() -> None:
    plan = tp4_dp2_plan(MODEL, zero=ZeroMode.OPTIMIZER)
    per_rank = rank_checkpoint_bytes(plan)
    assert sum(per_rank.values()) == pytest.approx(12.0 * _params(plan), rel=1e-12)
    leader, member = plan.stages[0].leaders[0], plan.stages[0].leaders[0] + 1
    assert per_rank[leader] > per_rank[member] > 0


def test_tensor_parallel_first_stage_of_a_tied_model_checkpoints_all_its_state() -> None:
    plan = two_node_plan(MODEL, cut=8)
    per_rank = rank_checkpoint_bytes(plan)
    assert min(per_rank.values()) > 0
    assert sum(per_rank.values()) == pytest.approx(12.0 * _params(plan), rel=1e-12)


def test_a_node_writes_its_ranks_bytes_and_the_slowest_node_sets_the_save() -> None:
    plan = _pipeline_plan()
    per_rank = rank_checkpoint_bytes(plan)
    per_node = node_checkpoint_bytes(plan)
    assert per_node == pytest.approx(
        {0: sum(per_rank[r] for r in range(4)), 1: sum(per_rank[r] for r in range(4, 8))}
    )
    slowest = max(per_node.values())
    assert checkpoint_save_s(plan) == pytest.approx(slowest / DEFAULT_WRITE_BYTES_PER_S)
    assert checkpoint_save_s(plan, write_bytes_per_s=1e9) == pytest.approx(slowest / 1e9)
    assert checkpoint_restore_s(plan, read_bytes_per_s=4e9) == pytest.approx(slowest / 4e9)
    price = price_failures(plan, model=FailureModel(mtbf_s=3600.0), step_time_s=1.0)
    assert price.checkpoint_bytes == slowest


def test_idle_nodes_write_nothing() -> None:
    plan = tp_plan(
        MODEL,
        [tp_stage(layers=(0, 18), ranks=range(4), degree=1, num_micro_batches=1)],
        cluster_spec=TWO_NODES,
    )
    assert set(node_checkpoint_bytes(plan)) == {0}
