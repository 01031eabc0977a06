"""The live sub-cluster of a membership: the file's order kept, groups shrunk or dropped,
hosts followed, and a membership file's mistakes as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_builders import cluster, group
from piebald.errors import SpecError
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.membership import Membership, node_named, read_membership

CLUSTER = cluster(
    "three",
    group("a", "A100-80GB", 4, count=3),
    group("v", "V100-32GB", 2, count=1),
    group("t", "T4", 1, count=2),
)


def test_everyone_is_the_cluster_itself() -> None:
    everyone = Membership.everyone(CLUSTER)
    assert everyone.is_everyone and everyone.sub_cluster() is CLUSTER
    assert everyone.num_gpus == CLUSTER.num_gpus


def test_a_lost_node_shrinks_its_group_and_an_emptied_group_goes() -> None:
    live = Membership.everyone(CLUSTER).without(["a-1", "v-0"])
    sub = live.sub_cluster()
    assert [(g.name, g.count) for g in sub.node_groups] == [("a", 2), ("t", 2)]
    assert sub.num_gpus == live.num_gpus == 2 * 4 + 2 * 1
    assert "a-1" in sub.name and "v-0" in sub.name
    # The sub-cluster's node i is the i-th live node of the file: a-0, a-2, t-0, t-1.
    assert [node.name for node in live.live_nodes] == ["a-0", "a-2", "t-0", "t-1"]
    for rank in range(sub.num_gpus):
        node = live.cluster_node(rank)
        assert node.name == live.live_nodes[sub.gpus[rank].node_index].name
        assert node.num_gpus == sub.node_of(rank).num_gpus


def test_losing_any_node_of_a_group_gives_the_same_cluster_shape() -> None:
    shapes = {
        tuple(
            (g.name, g.count)
            for g in Membership.everyone(CLUSTER).without([n]).sub_cluster().node_groups
        )
        for n in ("a-0", "a-1", "a-2")
    }
    assert shapes == {(("a", 2), ("v", 1), ("t", 2))}


def test_hosts_follow_their_nodes() -> None:
    hosted = parse_cluster(
        {
            "name": "hosted",
            "nodes": [
                {**group("a", "A100-80GB", 2, count=3), "hosts": ["h0", "h1", "h2"]},
            ],
        },
        source="test",
    )
    assert (
        node_named(hosted, "h1") is hosted.nodes[1] and node_named(hosted, "a-1") is hosted.nodes[1]
    )
    live = Membership.of(hosted, ["h2", "a-0"], source="test")
    assert live.live == ("a-0", "a-2")
    assert live.sub_cluster().node_groups[0].hosts == ("h0", "h2")


def test_no_live_node_has_no_cluster() -> None:
    with pytest.raises(ValueError, match="no live node"):
        Membership(cluster=CLUSTER, live=()).sub_cluster()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("nodes: [a-0, x-9]\n", "nodes"),
        ("nodes: []\n", "nodes"),
        ("[a-0]\n", "nodes"),
        ("nodes: [a-0\n", "yaml"),
    ],
)
def test_a_membership_file_mistake_is_one_line(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "membership.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        read_membership(path, CLUSTER)
    assert caught.value.source == str(path) and caught.value.field == field
    assert "\n" not in str(caught.value)


def test_a_membership_file_names_the_live_nodes(tmp_path: Path) -> None:
    path = tmp_path / "membership.yaml"
    path.write_text("nodes: [t-1, a-0]  # any order\n")
    assert read_membership(path, CLUSTER).live == ("a-0", "t-1")
    with pytest.raises(SpecError, match="readable"):
        read_membership(tmp_path / "missing.yaml", CLUSTER)
