"""Which nodes take part: the subsets of a cluster a search tries leaving idle."""

from __future__ import annotations

import itertools

from piebald.planner.search.settings import SearchSettings
from piebald.planner.search_units import node_classes
from piebald.planner.strategies import Strategy
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import Dtype

__all__ = ["idle_subsets"]


def idle_subsets(
    cluster: ClusterSpec, strategy: Strategy, precision: Dtype, settings: SearchSettings
) -> list[frozenset[int]]:
    """Nodes (by index) that take part: all of them first; then, where idle GPUs are
    allowed, all but one node class (identical groups are one), and the fastest k types
    alone (what dropping the slowest GPUs gives); in small clusters of a few nodes, every
    subset of nodes (one node of a group alone may beat the whole group when the group's
    nodes share a slow network)."""
    everything = frozenset(node.index for node in cluster.nodes)
    subsets = [everything]
    if not strategy.allow_idle_groups:
        return subsets
    class_of = node_classes(cluster)
    members: dict[int, set[int]] = {}
    for node in cluster.nodes:
        members.setdefault(class_of[node.group_index], set()).add(node.index)
    nodes_of = {c: frozenset(nodes) for c, nodes in members.items()}
    groups = list(nodes_of)
    if len(groups) > 1:
        subsets += [everything - nodes_of[g] for g in groups]
        speed = {g: cluster.node_groups[g].device.training_peak_flops(precision) for g in groups}
        fastest = sorted(groups, key=lambda g: -speed[g])
        for k in range(1, len(fastest) - 1):
            subsets.append(
                frozenset().union(
                    *(nodes_of[g] for g in fastest if speed[g] >= speed[fastest[k - 1]])
                )
            )
    if len(everything) <= settings.all_node_subsets_up_to and settings.small_cluster:
        subsets += [
            frozenset(chosen)
            for size in range(len(everything) - 1, 0, -1)
            for chosen in itertools.combinations(sorted(everything), size)
        ]
    return [subset for subset in dict.fromkeys(subsets) if subset]
