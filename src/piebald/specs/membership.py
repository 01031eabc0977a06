"""Which nodes of a cluster are live, and the cluster they form: what elastic training plans
for after a node is lost, leaves or joins (docs/guides/elastic.md).

A node is named as ``ClusterSpec.nodes`` names it (``a100-0``: its group and its index in the
group), or by its host where the cluster file lists hosts; both are accepted wherever a node
is named. The live sub-cluster keeps the file's order: each group keeps its live nodes, in
order, and a group with none left is dropped, so the k-th node of a group in the sub-cluster
is its k-th live node in the file. Nodes of a group are identical, so which ones of a group
are lost does not change the sub-cluster's plan, only where it runs.

A membership file is YAML naming the live nodes::

    nodes: [a100-0, v100-0]    # every other node of the cluster is out

Pure: no torch, no I/O besides :func:`read_membership`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from piebald.errors import SpecError
from piebald.specs.cluster import ClusterSpec, Node

__all__ = ["Membership", "node_named", "read_membership", "some_nodes"]


def node_named(cluster: ClusterSpec, name: str) -> Node | None:
    """The node called ``name`` (its node name or its host), or None."""
    for node in cluster.nodes:
        if name in (node.name, node.host):
            return node
    return None


def some_nodes(cluster: ClusterSpec, *, most: int = 8) -> str:
    """The first ``most`` node names of ``cluster``, for an error that says what exists."""
    more = ", ..." if len(cluster.nodes) > most else ""
    return ", ".join(node.name for node in cluster.nodes[:most]) + more


@dataclass(frozen=True, slots=True, kw_only=True)
class Membership:
    """The live nodes of ``cluster`` (node names, in the cluster's order)."""

    cluster: ClusterSpec
    live: tuple[str, ...]

    @classmethod
    def everyone(cls, cluster: ClusterSpec) -> Membership:
        return cls(cluster=cluster, live=tuple(node.name for node in cluster.nodes))

    @classmethod
    def of(cls, cluster: ClusterSpec, names: Iterable[str], *, source: str) -> Membership:
        """The membership of the nodes ``names`` (node names or hosts); an unknown name is a
        SpecError naming ``source``."""
        chosen: set[int] = set()
        for name in names:
            node = node_named(cluster, name)
            if node is None:
                raise SpecError(
                    source=source,
                    field="nodes",
                    value=name,
                    expected=f"a node of cluster {cluster.name} ({some_nodes(cluster)})",
                )
            chosen.add(node.index)
        return cls(cluster=cluster, live=tuple(cluster.nodes[i].name for i in sorted(chosen)))

    @property
    def is_everyone(self) -> bool:
        return len(self.live) == len(self.cluster.nodes)

    @property
    def live_nodes(self) -> tuple[Node, ...]:
        """The live nodes of ``cluster``, in its order: the sub-cluster's node i is the i-th."""
        names = set(self.live)
        return tuple(node for node in self.cluster.nodes if node.name in names)

    @property
    def num_gpus(self) -> int:
        return sum(node.num_gpus for node in self.live_nodes)

    def without(self, names: Iterable[str]) -> Membership:
        gone = set(names)
        return replace(self, live=tuple(name for name in self.live if name not in gone))

    def sub_cluster(self) -> ClusterSpec:
        """The cluster of the live nodes (the whole cluster itself when every node is live);
        a membership without nodes is a ValueError."""
        if self.is_everyone:
            return self.cluster
        if not self.live:
            raise ValueError(f"cluster {self.cluster.name}: no live node")
        by_group: dict[int, list[Node]] = {}
        for node in self.live_nodes:
            by_group.setdefault(node.group_index, []).append(node)
        groups = []
        for index, group in enumerate(self.cluster.node_groups):
            nodes = by_group.get(index)
            if not nodes:
                continue
            hosts = tuple(node.host for node in nodes if node.host is not None)
            groups.append(replace(group, count=len(nodes), hosts=hosts))
        lost = [node.name for node in self.cluster.nodes if node.name not in set(self.live)]
        gone = ", ".join(lost) if len(lost) <= 3 else f"{len(lost)} nodes"
        return ClusterSpec(
            name=f"{self.cluster.name} without {gone}",
            node_groups=tuple(groups),
            site_links=self.cluster.site_links,
            custom_types=self.cluster.custom_types,
        )

    def cluster_node(self, sub_rank: int) -> Node:
        """The node of ``cluster`` that rank ``sub_rank`` of the sub-cluster runs on."""
        sub = self.sub_cluster()
        return self.live_nodes[sub.gpus[sub_rank].node_index]


def read_membership(path: Path, cluster: ClusterSpec) -> Membership:
    """The membership a membership file states (``nodes: [names]``); a file that cannot be
    read, is not that YAML, names an unknown node or no node at all is a one-line SpecError
    naming the file."""
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SpecError(
            source=source,
            field="file",
            value=error.strerror or str(error),
            expected="a readable membership file",
        ) from None
    except yaml.YAMLError as error:
        raise SpecError(
            source=source,
            field="yaml",
            value=" ".join(str(error).split())[:120],
            expected="YAML of the form `nodes: [node names]`",
        ) from None
    names = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise SpecError(
            source=source,
            field="nodes",
            value=names if isinstance(data, dict) else data,
            expected="a non-empty list of the live nodes' names (e.g. nodes: [a100-0])",
        )
    return Membership.of(cluster, names, source=source)
