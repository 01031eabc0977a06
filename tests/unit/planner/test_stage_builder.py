"""Building one stage: water-filling against a linear program, allocation and memory rules.

``water_fill`` must return fractions under the capacities that sum to 1 with the smallest
possible maximum (checked against scipy's HiGHS solving the LP directly), and the most even
such split, f_i = min(c_i, level). ``build_stage`` must give faster GPUs at least as many
micro-batches (with no traffic, exactly the min-makespan of brute force), give a
memory-poor GPU the smaller shard when the state must be sharded (and fill it to the brim),
and obey a strategy's equal-micro-batch and even-shard rules.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from piebald.cost.comm import BUS_EFFICIENCY
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.plan_estimate import estimate_plan
from piebald.planner.stage_builder import StageChoice, StageRules, build_stage, water_fill
from piebald.planner.strategies import PIEBALD
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan, ZeroMode, weighted_round_robin
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute

# -- water_fill -------------------------------------------------------------------------


def _lp_min_max(capacities: list[float]) -> float | None:
    """min t s.t. 0 <= f_i <= c_i, f_i <= t, sum f_i = 1 (variables f_1..f_n, t)."""
    n = len(capacities)
    cost = [0.0] * n + [1.0]
    upper_rows = [[1.0 if j == i else 0.0 for j in range(n)] + [-1.0] for i in range(n)]
    result = linprog(
        cost,
        A_ub=upper_rows,
        b_ub=[0.0] * n,
        A_eq=[[1.0] * n + [0.0]],
        b_eq=[1.0],
        bounds=[(0.0, c) for c in capacities] + [(0.0, None)],
        method="highs",
    )
    return float(result.fun) if result.status == 0 else None


@pytest.mark.parametrize(
    ("capacities", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], (0.25, 0.25, 0.25, 0.25)),
        ([0.1, 1.0, 1.0], (0.1, 0.45, 0.45)),  # 0.1 binds; the others split 0.9
        ([0.3, 0.3, 0.9], (0.3, 0.3, 0.4)),  # two bind; the third takes the rest
        ([0.5, 0.5], (0.5, 0.5)),  # exactly enough room
        ([5.0], (1.0,)),
        ([0.0, 2.0], (0.0, 1.0)),  # a GPU with no free memory owns nothing
    ],
)
def test_water_fill_by_hand(capacities: list[float], expected: tuple[float, ...]) -> None:
    fractions = water_fill(capacities)
    assert fractions == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("capacities", [[0.2, 0.3], [0.0, 0.0], [0.999], [-0.1, 2.0]])
def test_water_fill_without_room_or_with_a_negative_capacity_is_none(
    capacities: list[float],
) -> None:
    assert water_fill(capacities) is None


def _check_against_lp(capacities: list[float]) -> None:
    fractions = water_fill(capacities)
    optimum = _lp_min_max(capacities)
    if sum(capacities) < 1.0 - 1e-9:
        assert fractions is None and optimum is None
        return
    if sum(capacities) < 1.0 + 1e-9:
        return  # at the boundary the two may round either way
    assert fractions is not None and optimum is not None
    assert len(fractions) == len(capacities)
    assert sum(fractions) == pytest.approx(1.0, abs=1e-12)
    assert all(0.0 <= f <= c + 1e-12 for f, c in zip(fractions, capacities, strict=True))
    level = max(fractions)
    assert level == pytest.approx(optimum, rel=1e-7, abs=1e-9)
    # The most even optimum: every fraction below the level is at its capacity.
    for f, c in zip(fractions, capacities, strict=True):
        assert f == pytest.approx(min(c, level), abs=1e-9)


def test_water_fill_matches_the_lp_on_seeded_random_capacities() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 6)
        capacities = [rng.choice([rng.uniform(0.0, 0.6), rng.uniform(0.0, 3.0)]) for _ in range(n)]
        _check_against_lp(capacities)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.0, 2.0, allow_nan=False), min_size=1, max_size=6))
def test_water_fill_matches_the_lp(capacities: list[float]) -> None:
    _check_against_lp(capacities)


# -- build_stage ------------------------------------------------------------------------


PIEBALD_RULES = PIEBALD.stage_rules


def _cluster(*gpus: str) -> ClusterSpec:
    """One single-GPU node per entry, all on one InfiniBand fabric."""
    nodes = [
        {
            "name": f"n{i}",
            "gpu": gpu,
            "gpus_per_node": 1,
            "nic": {"kind": "infiniband", "bandwidth": "200Gb/s"},
        }
        for i, gpu in enumerate(gpus)
    ]
    return parse_cluster({"name": "stage", "nodes": nodes}, source="test")


def _build(
    cluster: ClusterSpec,
    model: str,
    job: JobSpec,
    *,
    rules: StageRules = PIEBALD_RULES,
    size: int = 1,
) -> StageChoice | None:
    spec = load_model(model)
    ranks = tuple(range(cluster.num_gpus))
    return build_stage(
        cluster,
        model=spec,
        job=job,
        ranks=ranks,
        layer_start=0,
        layer_end=spec.num_layers,
        micro_batch_sizes=(size,) * len(ranks),
        stage_index=0,
        num_stages=1,
        widths=(len(ranks),),
        rules=rules,
    )


def _pass_s(cluster: ClusterSpec, rank: int, model: str, job: JobSpec) -> float:
    spec, device = load_model(model), cluster.device_of(rank)
    times = pass_times(
        spec,
        shape=PassShape(
            device=device,
            dtype=device.training_dtype(job.precision),
            micro_batch_size=1,
            seq_len=job.seq_len,
            recompute=Recompute.NONE,
        ),
    )
    return times.pass_s(0, spec.num_layers)


NO_TRAFFIC = StageRules(zero_modes=(ZeroMode.NONE,), recompute=(Recompute.NONE,))
GPT2_JOB = JobSpec(global_batch_size=24, seq_len=512)


@pytest.mark.parametrize(
    "gpus",
    [("A100-80GB", "V100-32GB", "T4"), ("T4", "L4", "RTX-4090"), ("L4", "A100-80GB")],
)
@pytest.mark.parametrize("rules", [NO_TRAFFIC, PIEBALD_RULES], ids=["no-traffic", "piebald"])
def test_faster_gpus_get_at_least_as_many_micro_batches(
    gpus: tuple[str, ...], rules: StageRules
) -> None:
    cluster = _cluster(*gpus)
    choice = _build(cluster, "gpt2", GPT2_JOB, rules=rules)
    assert choice is not None
    counts = choice.stage.num_micro_batches
    assert sum(counts) == GPT2_JOB.global_batch_size
    times = [_pass_s(cluster, rank, "gpt2", GPT2_JOB) for rank in range(cluster.num_gpus)]
    for i, j in itertools.permutations(range(len(gpus)), 2):
        if times[i] < times[j]:
            assert counts[i] >= counts[j], (gpus, times, counts)
    # The fastest GPU does strictly more than the slowest when they differ by 2x or more.
    fastest, slowest = times.index(min(times)), times.index(max(times))
    if times[slowest] >= 2 * times[fastest]:
        assert counts[fastest] > counts[slowest], (gpus, times, counts)


@pytest.mark.parametrize("gpus", [("A100-80GB", "V100-32GB", "T4"), ("T4", "L4", "RTX-4090")])
def test_without_traffic_the_busy_time_is_the_brute_force_min_makespan(
    gpus: tuple[str, ...],
) -> None:
    cluster = _cluster(*gpus)
    choice = _build(cluster, "gpt2", GPT2_JOB, rules=NO_TRAFFIC)
    assert choice is not None
    times = [_pass_s(cluster, rank, "gpt2", GPT2_JOB) for rank in range(cluster.num_gpus)]
    total = GPT2_JOB.global_batch_size
    best = min(
        max(c * t for c, t in zip(counts, times, strict=True))
        for counts in itertools.product(range(total + 1), repeat=len(times))
        if sum(counts) == total
    )
    assert choice.busy_s == pytest.approx(best, rel=1e-12)
    # The sync is one ring all-reduce of the gradients over the three 200 Gb/s links (RDMA
    # latency 10 us) at NCCL's bus efficiency E: 2 (n - 1) (alpha + S / (n B E)). Both
    # clusters mix bf16 ranks with an fp16 T4 (and V100), so the group communicates in fp32
    # (cost.precision).
    grad_bytes = 4.0 * load_model("gpt2").num_params
    expected_s = 2 * 2 * (10e-6 + grad_bytes / (3 * 200e9 / 8 * BUS_EFFICIENCY))
    assert choice.sync_s == pytest.approx(expected_s, rel=1e-9)


LLAMA_JOB = JobSpec(global_batch_size=16, seq_len=512)


def _one_stage_plan(cluster: ClusterSpec, model: str, job: JobSpec, choice: StageChoice) -> Plan:
    stage = choice.stage
    order = [stage.ranks[i] for i in weighted_round_robin(stage.num_micro_batches)]
    return Plan(
        cluster=cluster,
        model=load_model(model),
        job=job,
        stages=(stage,),
        routes=tuple((rank,) for rank in order),
    )


def test_a_memory_poor_fast_gpu_gets_the_smaller_shard() -> None:
    # RTX-4090: 24 GiB, 165 bf16 TFLOP/s; A6000: 48 GiB, 155 TFLOP/s. llama-3.2-3b's
    # training state (~3.2e9 params x 16 bytes under AdamW) fits neither alone, so it must
    # be sharded, and the 4090 can hold less of it.
    cluster = _cluster("RTX-4090", "A6000")
    choice = _build(cluster, "llama-3.2-3b", LLAMA_JOB)
    assert choice is not None
    stage = choice.stage
    assert stage.zero is not ZeroMode.NONE
    rtx, a6000 = stage.shard_fraction
    assert rtx < 0.5 < a6000
    assert rtx + a6000 == pytest.approx(1.0, abs=1e-12)
    # The faster card is not starved of work for having less memory.
    assert stage.num_micro_batches[0] >= stage.num_micro_batches[1]
    # Water-filling: the 4090's shard is as large as its memory allows, and everything fits.
    memory = estimate_plan(_one_stage_plan(cluster, "llama-3.2-3b", LLAMA_JOB, choice)).stages[0]
    rtx_capacity = cluster.device_of(0).memory_bytes
    assert memory.memory[0].total_bytes == pytest.approx(rtx_capacity, rel=1e-9)
    assert memory.memory[1].total_bytes <= cluster.device_of(1).memory_bytes


def test_equal_micro_batches_rule_gives_every_rank_the_same_count() -> None:
    cluster = _cluster("A100-80GB", "T4")
    rules = StageRules(equal_micro_batches=True)
    choice = _build(cluster, "gpt2", GPT2_JOB, rules=rules)
    assert choice is not None
    assert choice.stage.num_micro_batches == (12, 12)
    free = _build(cluster, "gpt2", GPT2_JOB)
    assert free is not None and free.stage.num_micro_batches[0] > 12  # the rule binds
    assert free.busy_s < choice.busy_s
    # 24 micro-batches cannot be split equally over 5 GPUs.
    five = _cluster("A100-80GB", "T4", "T4", "L4", "L4")
    assert _build(five, "gpt2", GPT2_JOB, rules=rules) is None
    # With micro-batches of 2 there are 12, split 4/4/4 over three GPUs.
    three = _cluster("A100-80GB", "T4", "L4")
    sized = _build(three, "gpt2", GPT2_JOB, rules=rules, size=2)
    assert sized is not None and sized.stage.num_micro_batches == (4, 4, 4)


@pytest.mark.parametrize(("model", "fits"), [("llama-3.2-1b", True), ("llama-3.2-3b", False)])
def test_even_shards_rule_gives_equal_fractions_or_nothing(model: str, fits: bool) -> None:
    cluster = _cluster("RTX-4090", "A6000")
    choice = _build(cluster, model, LLAMA_JOB, rules=StageRules(even_shards=True))
    free = _build(cluster, model, LLAMA_JOB)
    assert free is not None  # uneven shards always find room here
    if not fits:
        # Half of llama-3.2-3b's sharded state does not fit the 24 GiB card.
        assert choice is None
        return
    assert choice is not None
    assert choice.stage.shard_fraction == (0.5, 0.5)


def test_an_unsharded_stage_has_even_fractions() -> None:
    cluster = _cluster("A100-80GB", "T4", "L4")
    choice = _build(cluster, "gpt2", GPT2_JOB, rules=NO_TRAFFIC)
    assert choice is not None and choice.stage.zero is ZeroMode.NONE
    assert choice.stage.shard_fraction == pytest.approx((1 / 3, 1 / 3, 1 / 3), abs=1e-15)
