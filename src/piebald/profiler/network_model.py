"""Measured links, applied to a cluster: the same ClusterSpec, with measured alpha and beta.

The communication model (``piebald.cost.comm``) asks the cluster for links
(``link_between``, ``node_link``); measured numbers therefore enter as a cluster whose
links carry them, and comm.py is unchanged:

* an intra-node point-to-point measurement in node group g replaces g's intra-node link
  bandwidth and latency (a plain ClusterSpec field, so a saved plan keeps it);
* an inter-node measurement between node groups a and b (a == b: two nodes of one group)
  replaces the link between any node of a and any node of b, via
  :class:`MeasuredCluster`, which overrides :meth:`ClusterSpec.node_link`.

Collective measurements are kept in the DB and shown by ``piebald profile show``; the ring
model derives collectives from these links.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from piebald.profiler.db import ProfileDB
from piebald.profiler.records import NetworkKind
from piebald.specs.cluster import ClusterSpec, Link
from piebald.specs.plan import MeasuredLink

__all__ = ["MeasuredCluster", "apply_network_profiles"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredCluster(ClusterSpec):
    """A cluster whose inter-node links between some node groups were measured."""

    measured_links: tuple[MeasuredLink, ...] = ()

    def node_link(self, node_a: int, node_b: int) -> Link:
        base = ClusterSpec.node_link(self, node_a, node_b)  # no zero-argument super() here
        names = {
            self.node_groups[self.nodes[node_a].group_index].name,
            self.node_groups[self.nodes[node_b].group_index].name,
        }
        for link in self.measured_links:
            if link.scope == "inter-node" and set(link.between) == names:
                return replace(
                    base,
                    bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
                    latency_s=link.latency_s,
                )
        return base


def measured_links(db: ProfileDB, cluster: ClusterSpec) -> tuple[MeasuredLink, ...]:
    """The point-to-point fits of ``db`` between node groups that ``cluster`` has."""
    names = {group.name for group in cluster.node_groups}
    links: list[MeasuredLink] = []
    for key in db.network_runs:
        if key.kind is not NetworkKind.P2P or not set(key.groups) <= names:
            continue
        profile = db.network(key)
        assert profile is not None
        a, b = key.groups
        links.append(
            MeasuredLink(
                between=(a, b),
                scope=key.scope,
                latency_s=profile.latency_s,
                bandwidth_bytes_per_s=profile.bandwidth_bytes_per_s,
            )
        )
    return tuple(links)


def apply_network_profiles(cluster: ClusterSpec, db: ProfileDB) -> ClusterSpec:
    """``cluster`` with every measured link of ``db`` in place of its nominal one."""
    links = measured_links(db, cluster)
    if not links:
        return cluster
    intra = {link.between[0]: link for link in links if link.scope == "intra-node"}
    groups = tuple(
        replace(
            group,
            intra_link_bytes_per_s=intra[group.name].bandwidth_bytes_per_s,
            intra_latency_s=intra[group.name].latency_s,
        )
        if group.name in intra
        else group
        for group in cluster.node_groups
    )
    return MeasuredCluster(
        name=cluster.name,
        node_groups=groups,
        site_links=cluster.site_links,
        custom_types=cluster.custom_types,
        measured_links=tuple(link for link in links if link.scope == "inter-node"),
    )
