"""Where no structure fits with every node, the search still tries leaving nodes idle.

A node of 3 GPUs cannot form tensor groups of 2 whole; with it first in rank order no
structure over every node exists at degree 2, but the other node alone (4 GPUs, two
groups) trains the model. The search used to try its idle subsets only after finding a
structure over every node, and reported the job infeasible."""

from __future__ import annotations

from cluster_builders import cluster, group
from piebald.planner.search import search
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model

# The same GPU type in both groups: they differ only in their GPU count.
CLUSTER = cluster(
    "three-then-four",
    group("three", "H100-SXM", 3, intra="900GB/s"),
    group("four", "H100-SXM", 4, intra="900GB/s"),
)


def test_a_subset_is_planned_where_every_node_together_fits_nothing() -> None:
    result = search(
        CLUSTER,
        model=load_model("tiny"),
        job=JobSpec(global_batch_size=8, seq_len=64),
        tensor_parallel=2,
    )
    plan = result.best.plan
    assert plan.idle_ranks == (0, 1, 2)  # the 3-GPU node
    assert {stage.tensor_parallel_degree for stage in plan.stages} == {2}
    assert sorted(rank for stage in plan.stages for rank in stage.ranks) == [3, 4, 5, 6]
