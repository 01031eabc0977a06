"""Schedules: the textbook orders, and on every routing of small asymmetric plans no
deadlock (checked twice: an acyclic dependency graph, and the engine finishing under random
times) and never more micro-batches in flight than the memory estimate assumed."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence

import pytest

from piebald.cost.plan_estimate import estimate_plan
from piebald.errors import SpecError
from piebald.schedule.build import StepSchedule, build_schedule, check_schedule
from piebald.schedule.ops import (
    Backward,
    Forward,
    Op,
    RecvActivation,
    SendActivation,
    most_in_flight,
)
from piebald.schedule.prices import Prices
from piebald.simulator.engine import simulate
from piebald.specs.plan import Plan, Schedule, ZeroMode, weighted_round_robin
from sim_plans import FixedPrices, cluster, pipeline


def _passes(ops: Sequence[Op]) -> list[str]:
    return [
        f"{'F' if isinstance(op, Forward) else 'B'}{op.micro_batch}"
        for op in ops
        if isinstance(op, Forward | Backward)
    ]


@pytest.mark.parametrize("num_stages", [2, 4])
@pytest.mark.parametrize("num_micro_batches", [2, 6])
def test_uniform_1f1b_is_warmup_steady_cooldown(num_stages: int, num_micro_batches: int) -> None:
    p, m = num_stages, num_micro_batches
    plan = pipeline(
        cluster(("round", p)),
        stage_ranks=[[s] for s in range(p)],
        counts=[[m]] * p,
        routes=[list(range(p))] * m,
    )
    prices = FixedPrices(
        plan, forward_s=dict.fromkeys(range(p), 1.0), backward_s=dict.fromkeys(range(p), 2.0)
    )
    schedule = build_schedule(plan, prices=prices)
    for s in range(p):
        warmup = min(p - s, m)  # the estimate's in-flight budget for stage s
        expected = [f"F{j}" for j in range(warmup)]
        for j in range(m - warmup):  # steady: one backward, one forward
            expected += [f"B{j}", f"F{j + warmup}"]
        expected += [f"B{j}" for j in range(m - warmup, m)]  # cool-down
        assert _passes(schedule.rank_ops[s]) == expected
        assert most_in_flight(schedule.rank_ops[s]) == warmup


def test_gpipe_runs_all_forwards_then_all_backwards() -> None:
    plan = pipeline(
        cluster(("round", 3)),
        stage_ranks=[[0], [1, 2]],
        counts=[[4], [3, 1]],
        routes=[[0, 1], [0, 2], [0, 1], [0, 1]],
        schedule=Schedule.GPIPE,
    )
    schedule = build_schedule(plan)
    assert _passes(schedule.rank_ops[0]) == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    assert _passes(schedule.rank_ops[1]) == ["F0", "F2", "F3", "B0", "B2", "B3"]
    assert _passes(schedule.rank_ops[2]) == ["F1", "B1"]


def _routings(counts: Sequence[Sequence[int]]) -> Iterator[list[list[int]]]:
    """Every assignment of micro-batches to ranks that matches ``counts`` stage by stage
    (ranks numbered consecutively across stages)."""
    total = sum(counts[0])
    per_stage = []
    first = 0
    for stage_counts in counts:
        ranks = [first + i for i, c in enumerate(stage_counts) for _ in range(c)]
        per_stage.append(sorted(set(itertools.permutations(ranks))))
        first += len(stage_counts)
    for choice in itertools.product(*per_stage):
        yield [[choice[s][j] for s in range(len(counts))] for j in range(total)]


SHAPES = [
    [[4], [2, 2]],
    [[2, 2], [4]],
    [[2, 2], [1], [1, 3]],  # stage 1 of one rank: 4 micro-batches (set below)
    [[3, 1], [2, 1, 1]],
    [[2, 2], [2, 2], [2, 2]],
]


def _small_plans() -> Iterator[Plan]:
    for shape in SHAPES:
        counts = [list(c) for c in shape]
        total = max(sum(c) for c in counts)
        counts = [[total] if len(c) == 1 else c for c in counts]
        first, stage_ranks = 0, []
        for stage_counts in counts:
            stage_ranks.append(list(range(first, first + len(stage_counts))))
            first += len(stage_counts)
        num_gpus = first
        for routes in _routings(counts):
            for schedule in (Schedule.ONE_F_ONE_B, Schedule.GPIPE):
                yield pipeline(
                    cluster(("round", num_gpus // 2), ("half", num_gpus - num_gpus // 2)),
                    stage_ranks=stage_ranks,
                    counts=counts,
                    routes=routes,
                    schedule=schedule,
                )


def _acyclic(plan: Plan, schedule: StepSchedule) -> bool:
    """Kahn's algorithm on the passes: program order on each rank plus F(j,s) -> F(j,s+1),
    F(j,last) -> B(j,last), B(j,s+1) -> B(j,s)."""
    nodes = {(rank, op) for rank, ops in schedule.rank_ops.items() for op in ops}
    passes = {node for node in nodes if isinstance(node[1], Forward | Backward)}
    edges: dict[tuple[int, Op], list[tuple[int, Op]]] = {node: [] for node in passes}
    for rank, ops in schedule.rank_ops.items():
        order = [(rank, op) for op in ops if isinstance(op, Forward | Backward)]
        for a, b in itertools.pairwise(order):
            edges[a].append(b)
    last = plan.num_stages - 1
    for j, route in enumerate(plan.routes):
        for s in range(plan.num_stages):
            forward = (route[s], Forward(micro_batch=j, stage=s))
            backward = (route[s], Backward(micro_batch=j, stage=s))
            if s < last:
                edges[forward].append((route[s + 1], Forward(micro_batch=j, stage=s + 1)))
                edges[(route[s + 1], Backward(micro_batch=j, stage=s + 1))].append(backward)
            else:
                edges[forward].append(backward)
    indegree = dict.fromkeys(edges, 0)
    for targets in edges.values():
        for target in targets:
            indegree[target] += 1
    ready = [node for node, degree in indegree.items() if degree == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for target in edges[node]:
            indegree[target] -= 1
            if indegree[target] == 0:
                ready.append(target)
    return seen == len(edges)


@pytest.mark.slow
def test_every_routing_of_small_plans_is_deadlock_free_and_within_memory() -> None:
    rng = random.Random(4)
    checked = 0
    for plan in _small_plans():
        prices = Prices(plan)
        schedule = build_schedule(plan, prices=prices)
        assert _acyclic(plan, schedule)
        for rank, ops in schedule.rank_ops.items():
            passes = _passes(ops)
            forwards = [int(x[1:]) for x in passes if x[0] == "F"]
            backwards = [int(x[1:]) for x in passes if x[0] == "B"]
            assert forwards == sorted(forwards) and backwards == sorted(backwards)
            # Never more forwards ahead of backwards than the memory estimate assumed.
            ahead = max(
                (
                    sum(1 if x[0] == "F" else -1 for x in passes[: i + 1])
                    for i in range(len(passes))
                ),
                default=0,
            )
            assert most_in_flight(ops) == ahead <= prices.in_flight_limit(rank)
        result = simulate(plan, schedule=schedule, prices=prices)
        assert result.deadlock is None
        estimated = estimate_plan(plan).prediction().peak_memory_bytes
        for stats in result.ranks:
            assert stats.peak_memory_bytes <= estimated[stats.rank] * (1 + 1e-12)
        # The same lists under other times (here: random ones) still finish.
        ranks = plan.used_ranks
        shuffled = FixedPrices(
            plan,
            forward_s={r: rng.uniform(0.1, 3.0) for r in ranks},
            backward_s={r: rng.uniform(0.1, 3.0) for r in ranks},
        )
        assert simulate(plan, schedule=schedule, prices=shuffled).deadlock is None
        checked += 1
    assert checked == 2 * (6 + 6 + 6 * 4 + 4 * 12 + 6**3)


def test_zero3_schedule_gathers_before_every_pass_and_scatters_every_backward() -> None:
    plan = pipeline(
        cluster(("round", 2)),
        stage_ranks=[[0, 1]],
        counts=[[2, 2]],
        routes=[[0], [1], [0], [1]],
        zero=ZeroMode.FULL,
    )
    ops = build_schedule(plan).rank_ops[0]
    names = [type(op).__name__ for op in ops]
    assert names.count("GatherPassParams") == 4 and names.count("ScatterPassGrads") == 2
    assert names[-1] == "OptimizerStep" and "AllReduceGrads" not in names


def test_zero3_stages_run_their_passes_in_one_pattern_whatever_the_times() -> None:
    """Lockstep ZeRO-2/3 (``specs.plan``): one stage of ranks of any speeds under 1F1B, and
    a GPipe pipeline, give every rank of the stage the same pass pattern; a schedule that
    breaks it is rejected."""
    rng = random.Random(11)
    one_stage = pipeline(
        cluster(("round", 3)),
        stage_ranks=[[0, 1, 2]],
        counts=[[3, 3, 3]],
        routes=[[r] for r in weighted_round_robin([3, 3, 3])],
        zero=ZeroMode.FULL,
    )
    gpipe = pipeline(
        cluster(("round", 3)),
        stage_ranks=[[0], [1, 2]],
        counts=[[4], [2, 2]],
        routes=[[0, 1], [0, 2], [0, 1], [0, 2]],
        zero=ZeroMode.GRADIENTS,
        schedule=Schedule.GPIPE,
    )
    for plan in (one_stage, gpipe):
        for _ in range(20):
            ranks = plan.used_ranks
            prices = FixedPrices(
                plan,
                forward_s={r: rng.uniform(0.1, 3.0) for r in ranks},
                backward_s={r: rng.uniform(0.1, 3.0) for r in ranks},
            )
            schedule = build_schedule(plan, prices=prices)  # checks the patterns
            stage = plan.stages[-1]
            patterns = {tuple(p[0] for p in _passes(schedule.rank_ops[r])) for r in stage.ranks}
            assert len(patterns) == 1
    good = build_schedule(one_stage)
    swapped = dict(good.rank_ops)
    ops = list(swapped[2])
    first, second = [i for i, op in enumerate(ops) if isinstance(op, Forward | Backward)][:2]
    ops[first], ops[second] = ops[second], ops[first]
    swapped[2] = tuple(ops)
    with pytest.raises(SpecError, match="one pass pattern"):
        check_schedule(one_stage, StepSchedule(kind=good.kind, rank_ops=swapped))


def test_a_send_without_its_receive_is_rejected() -> None:
    plan = pipeline(
        cluster(("round", 2)), stage_ranks=[[0], [1]], counts=[[1], [1]], routes=[[0, 1]]
    )
    good = build_schedule(plan)
    missing = {
        rank: tuple(op for op in ops if not isinstance(op, RecvActivation))
        for rank, ops in good.rank_ops.items()
    }
    with pytest.raises(SpecError, match="received once"):
        check_schedule(plan, StepSchedule(kind=good.kind, rank_ops=missing))
    assert any(isinstance(op, SendActivation) for op in good.rank_ops[0])
