"""What every worker of an elastic (re)start checks alike before any plan is made: the
live membership that torchrun's workers form, refused in one line when a worker names no
node of the cluster, or a node runs other than one worker per GPU."""

from __future__ import annotations

import pytest

from cluster_builders import cluster, group
from piebald.errors import SpecError
from piebald.runtime.training.elastic_rendezvous import NodeWorker, check_workers

# Two 2-GPU nodes and a 1-GPU node, on named hosts.
CLUSTER = cluster(
    "three",
    {**group("a100", "A100-80GB", 2, count=2), "hosts": ["gpu-a", "gpu-b"]},
    {**group("t4", "T4", 1), "hosts": ["old-1"]},
)


def _workers(*nodes: tuple[str, int]) -> list[NodeWorker]:
    """``(node, gpus)`` for each agent, in torchrun's rank order."""
    return [
        NodeWorker(node=name, local_rank=local, local_world_size=gpus)
        for name, gpus in nodes
        for local in range(gpus)
    ]


def test_the_live_nodes_are_the_workers_nodes_in_the_clusters_order() -> None:
    # torchrun orders agents its own way; a node may be named by its host.
    membership = check_workers(CLUSTER, _workers(("old-1", 1), ("a100-1", 2)))
    assert membership.live == ("a100-1", "t4-0")
    assert [node.name for node in membership.live_nodes] == ["a100-1", "t4-0"]
    assert check_workers(CLUSTER, _workers(("a100-0", 2), ("a100-1", 2), ("t4-0", 1))).is_everyone


@pytest.mark.parametrize(
    ("workers", "words"),
    [
        (_workers(("a100-0", 2), ("gpu-9", 1)), ["--node-name", "'gpu-9'", "torchrun rank 2"]),
        (_workers(("a100-0", 2), ("a100-1", 1)), ["2 workers on node a100-1", "started 1"]),
        (_workers(("a100-0", 3)), ["2 workers on node a100-0", "started 3"]),
        (_workers(("a100-0", 2), ("a100-0", 2)), ["a100-0", "two agents claim it"]),
    ],
)
def test_a_wrong_start_is_one_line(workers: list[NodeWorker], words: list[str]) -> None:
    with pytest.raises(SpecError) as raised:
        check_workers(CLUSTER, workers)
    message = str(raised.value)
    assert "\n" not in message and all(word in message for word in words), message
