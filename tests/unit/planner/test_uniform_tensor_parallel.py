"""Megatron holds every stage to one tensor-parallel degree (its
``--tensor-model-parallel-size``), and its plan is the best of one search per degree.

Oracle: the restricted searches, one per degree (``search(..., tensor_parallel=t)``), are
each uniform by construction; the unrestricted Megatron search must match the fastest of
them and never mix degrees."""

from __future__ import annotations

import pytest

from piebald.planner.search import Infeasible, search
from piebald.planner.strategies import STRATEGIES
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model

MEGATRON = STRATEGIES["megatron"]
# Two nodes of 4 A10G (24 GB): llama-2-7b fits with its blocks split two ways, so the
# degree is a real choice here (Megatron picks TP 2 over TP 1).
CLUSTER = parse_cluster(
    {
        "name": "a10g-2x4",
        "nodes": [
            {
                "name": "a",
                "count": 2,
                "gpu": "A10G",
                "gpus_per_node": 4,
                "intra_link": "32GB/s",
                "nic": {"kind": "ethernet", "bandwidth": "100Gb/s"},
            }
        ],
    },
    source="test",
)
MODEL = load_model("llama-2-7b")
JOB = JobSpec(global_batch_size=16, seq_len=2048)


def test_megatron_plans_one_degree_the_best_of_each_degree_alone() -> None:
    result = search(CLUSTER, model=MODEL, job=JOB, strategy=MEGATRON)
    degrees = {stage.tensor_parallel_degree for stage in result.best.plan.stages}
    assert len(degrees) == 1
    by_degree = {}
    for degree in MEGATRON.stage_rules.tensor_parallel_degrees:
        try:
            alone = search(CLUSTER, model=MODEL, job=JOB, strategy=MEGATRON, tensor_parallel=degree)
        except Infeasible:
            continue
        assert {s.tensor_parallel_degree for s in alone.best.plan.stages} == {degree}
        by_degree[degree] = alone.best.estimate.tokens_per_s
    assert len(by_degree) >= 2  # a real choice between degrees
    fastest = max(by_degree, key=by_degree.__getitem__)
    assert degrees == {fastest}
    assert result.best.estimate.tokens_per_s == pytest.approx(by_degree[fastest], rel=1e-9)
    assert result.num_structures > max(1, len(by_degree))  # every degree was searched


def test_megatron_infeasible_at_every_degree_says_what_does_not_fit() -> None:
    job = JobSpec(global_batch_size=16, seq_len=2048)
    with pytest.raises(Infeasible) as caught:
        search(CLUSTER, model=load_model("llama-2-13b"), job=job, strategy=MEGATRON)
    assert "llama-2-13b" in str(caught.value)
