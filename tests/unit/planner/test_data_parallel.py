"""The one-stage data-parallel planner on a mixed cluster: allocation, validity, memory.

Fast GPUs must take at least as many micro-batches as slow ones, the plan must pass the
Plan validation (and survive a JSON round trip), every rank's predicted peak must fit its
GPU, and a model that cannot fit must fail with a message that names it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from piebald.planner.data_parallel import Infeasible, ScoredPlan, build_data_parallel_plan
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan, weighted_round_robin
from piebald.specs.plan_io import plan_from_dict, plan_to_dict
from piebald.specs.presets import load_model


def _cluster(groups: list[dict[str, Any]]) -> ClusterSpec:
    return parse_cluster({"name": "mixed", "nodes": groups}, source="test")


MIXED = _cluster(
    [
        {
            "name": "fast",
            "gpu": "A100-80GB",
            "gpus_per_node": 2,
            "intra_link": "300GB/s",
            "ethernet": "25Gb/s",
        },
        {
            "name": "slow",
            "gpu": "T4",
            "gpus_per_node": 2,
            "intra_link": "16GB/s",
            "ethernet": "25Gb/s",
        },
    ]
)
FAST_RANKS, SLOW_RANKS = (0, 1), (2, 3)


@pytest.fixture(scope="module")
def gpt2_plan() -> ScoredPlan:
    job = JobSpec(global_batch_size=32, seq_len=1024)
    return build_data_parallel_plan(MIXED, model=load_model("gpt2"), job=job, micro_batch_size=2)


def test_faster_gpus_get_at_least_as_many_micro_batches(gpt2_plan: ScoredPlan) -> None:
    (stage,) = gpt2_plan.plan.stages
    count_of = dict(zip(stage.ranks, stage.num_micro_batches, strict=True))
    assert min(count_of[r] for r in FAST_RANKS) >= max(count_of[r] for r in SLOW_RANKS)
    # An A100 is several times a T4 (312 vs 65 TFLOP/s): strictly more here.
    assert count_of[0] > count_of[2]
    assert sum(count_of.values()) == 32 // 2


def test_plan_covers_all_gpus_and_validates(gpt2_plan: ScoredPlan) -> None:
    plan: Plan = gpt2_plan.plan
    (stage,) = plan.stages
    assert stage.ranks == (0, 1, 2, 3)
    assert (stage.layer_start, stage.layer_end) == (0, plan.model.num_layers)
    assert stage.micro_batch_size == (2, 2, 2, 2)
    assert stage.num_sequences == 32
    assert sum(stage.shard_fraction) == pytest.approx(1.0)
    # Routes interleave the ranks by weighted round robin of the counts.
    assert [route[0] for route in plan.routes] == [
        stage.ranks[i] for i in weighted_round_robin(stage.num_micro_batches)
    ]
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))), source="dp.json")
    assert again == plan


def test_every_rank_fits_its_memory(gpt2_plan: ScoredPlan) -> None:
    plan: Plan = gpt2_plan.plan
    assert plan.predicted is not None
    peaks = plan.predicted.peak_memory_bytes
    assert set(peaks) == {0, 1, 2, 3}
    for rank, peak in peaks.items():
        assert 0 < peak <= MIXED.device_of(rank).memory_bytes, rank
    assert plan.predicted.step_time_s == gpt2_plan.estimate.step_time_s
    assert plan.predicted.tokens_per_s == pytest.approx(32 * 1024 / plan.predicted.step_time_s)


def test_model_too_large_is_infeasible_and_named() -> None:
    two_t4 = _cluster([{"name": "t4", "gpu": "T4", "gpus_per_node": 2, "intra_link": "16GB/s"}])
    with pytest.raises(Infeasible, match="llama-3-70b"):
        build_data_parallel_plan(
            two_t4, model=load_model("llama-3-70b"), job=JobSpec(global_batch_size=4, seq_len=512)
        )


def test_state_sharding_lets_a_larger_model_fit() -> None:
    # llama-3.2-1b (1.24e9 params) needs ~20 GB of replicated AdamW state: too much for a
    # 16 GiB T4, but it fits once the state is sharded over four of them.
    four_t4 = _cluster([{"name": "t4", "gpu": "T4", "gpus_per_node": 4, "intra_link": "16GB/s"}])
    scored = build_data_parallel_plan(
        four_t4, model=load_model("llama-3.2-1b"), job=JobSpec(global_batch_size=8, seq_len=512)
    )
    (stage,) = scored.plan.stages
    assert stage.zero.value != "none"
    assert scored.plan.predicted is not None
    assert all(
        peak <= four_t4.device_of(rank).memory_bytes
        for rank, peak in scored.plan.predicted.peak_memory_bytes.items()
    )


def test_batch_must_divide_into_micro_batches() -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        build_data_parallel_plan(
            MIXED,
            model=load_model("tiny"),
            job=JobSpec(global_batch_size=5, seq_len=64),
            micro_batch_size=2,
        )


def test_sharded_state_follows_gpu_memory() -> None:
    # The T4s cannot hold llama-3.2-1b's replicated state, so the state is sharded, in
    # proportion to memory: 80 GiB, 80 GiB, 16 GiB, 16 GiB -> 5/12, 5/12, 1/12, 1/12.
    scored = build_data_parallel_plan(
        MIXED, model=load_model("llama-3.2-1b"), job=JobSpec(global_batch_size=16, seq_len=512)
    )
    (stage,) = scored.plan.stages
    assert stage.zero.value != "none"
    assert stage.shard_fraction == pytest.approx((5 / 12, 5 / 12, 1 / 12, 1 / 12), rel=1e-12)
