"""The coarse structure the planner enumerates: units of GPUs and the orders they line up in.

A unit is a whole node (so a stage's data-parallel traffic stays on NVLink/PCIe where it
can), or a single GPU in clusters of at most ``GPU_UNITS_UP_TO`` GPUs, where splitting a
node across pipeline stages can pay. In clusters of more than ``MERGE_NODES_ABOVE`` nodes,
a unit is several identical nodes in a row (one node class, so one site and NIC class):
enough of them to make ``UNIT_GPUS`` GPUs, and no more units than ``MAX_UNITS`` (plus one
shorter last unit per class). The search's cost grows with the number of units, not of
GPUs, so thousands of one-GPU nodes plan about as fast as a few hundred eight-GPU ones.

Stages are contiguous runs of units in an order; the orders keep sites and NIC classes
together (Holmes: data-parallel groups inside one RDMA class, pipeline boundaries on the
slow links between classes) and try different class orders inside them, so the search
never has to enumerate set partitions.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from piebald.specs.cluster import ClusterSpec, NicKind, NodeGroup
from piebald.specs.devices import DeviceType, Dtype

__all__ = [
    "GPU_UNITS_UP_TO",
    "MAX_UNITS",
    "MERGE_NODES_ABOVE",
    "UNIT_GPUS",
    "Unit",
    "build_units",
    "node_classes",
    "nodes_per_unit",
    "unit_orders",
]

GPU_UNITS_UP_TO = 16
ALL_PERMUTATIONS_UP_TO = 4  # node classes; beyond this, a few heuristic orders
ROTATIONS_UP_TO = 8  # units; small clusters also try every rotation of each order
MERGE_NODES_ABOVE = 64  # nodes; larger clusters merge nodes of few GPUs into units
UNIT_GPUS = 8  # GPUs a merged unit of small nodes reaches (a typical node's worth)
MAX_UNITS = 512  # units; clusters of more nodes merge nodes until about this many are left


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    ranks: tuple[int, ...]
    device: DeviceType
    group_index: int  # the node class (``node_classes``): identical groups share one
    node_indices: tuple[int, ...]  # the nodes it holds GPUs of, in rank order
    domain: tuple[str, str]  # (site, NIC class): stages inside one domain talk RDMA
    peak_flops: float  # summed training peak of the unit's GPUs, the speed proxy for cuts
    memory_bytes: float


def _domain(group: NodeGroup) -> tuple[str, str]:
    # RDMA classes: InfiniBand and RoCE nodes cannot talk RDMA to each other, and plain
    # Ethernet nodes talk to nobody over RDMA, so each Ethernet node group is its own class.
    nic = group.nic.kind.value if group.nic.kind is not NicKind.ETHERNET else f"eth:{group.name}"
    return (group.site, nic)


def node_classes(cluster: ClusterSpec) -> tuple[int, ...]:
    """Per node group, the index of the first group with identical nodes in the same
    domain: the cost model reads nothing else of a group, so a file that lists every node
    as its own group plans like one that counts them (structures are priced once per
    class, and idle subsets leave whole classes out)."""
    first: dict[tuple[object, ...], int] = {}
    classes = []
    for index, group in enumerate(cluster.node_groups):
        key = (
            group.device,
            group.gpus_per_node,
            group.intra_link_bytes_per_s,
            group.intra_latency_s,
            group.nic,
            group.ethernet_bytes_per_s,
            _domain(group),
        )
        classes.append(first.setdefault(key, index))
    return tuple(classes)


def nodes_per_unit(cluster: ClusterSpec, group: NodeGroup) -> int:
    """How many of ``group``'s nodes one unit holds (1 up to ``MERGE_NODES_ABOVE`` nodes)."""
    num_nodes = len(cluster.nodes)
    if num_nodes <= MERGE_NODES_ABOVE:
        return 1
    return max(math.ceil(UNIT_GPUS / group.gpus_per_node), math.ceil(num_nodes / MAX_UNITS))


def build_units(cluster: ClusterSpec, *, precision: Dtype, nodes: frozenset[int]) -> list[Unit]:
    """Units of the nodes (by index) in ``nodes``, in rank order; merged units take runs
    of nodes of one class, so whole classes in or out leave the other units unchanged."""
    per_gpu = cluster.num_gpus <= GPU_UNITS_UP_TO
    classes = node_classes(cluster)
    by_class: dict[int, list[int]] = {}
    for node in cluster.nodes:
        if node.index in nodes:
            by_class.setdefault(classes[node.group_index], []).append(node.index)
    units = []
    for class_index, members in by_class.items():
        group = cluster.node_groups[class_index]
        step = 1 if per_gpu else nodes_per_unit(cluster, group)
        peak = group.device.training_peak_flops(precision)
        for start in range(0, len(members), step):
            run = tuple(members[start : start + step])
            ranks = tuple(
                rank
                for index in run
                for rank in range(
                    cluster.nodes[index].first_rank,
                    cluster.nodes[index].first_rank + cluster.nodes[index].num_gpus,
                )
            )
            for chunk in [(rank,) for rank in ranks] if per_gpu else [ranks]:
                units.append(
                    Unit(
                        ranks=chunk,
                        device=group.device,
                        group_index=class_index,
                        node_indices=(cluster.gpus[chunk[0]].node_index,) if per_gpu else run,
                        domain=_domain(group),
                        peak_flops=len(chunk) * peak,
                        memory_bytes=len(chunk) * group.device.memory_bytes,
                    )
                )
    units.sort(key=lambda u: u.ranks[0])
    return units


def unit_orders(units: list[Unit]) -> list[tuple[Unit, ...]]:
    """Candidate orders: units grouped by site and NIC class, node classes in different
    orders inside them (all permutations for a few classes, else by speed and memory)."""
    by_group: dict[int, list[Unit]] = {}
    for unit in units:
        by_group.setdefault(unit.group_index, []).append(unit)
    groups = list(by_group)
    domain_of = {g: by_group[g][0].domain for g in groups}
    speed = {g: by_group[g][0].peak_flops / len(by_group[g][0].ranks) for g in groups}
    memory = {g: by_group[g][0].device.memory_bytes for g in groups}
    if len(groups) <= ALL_PERMUTATIONS_UP_TO:
        group_orders = [list(order) for order in itertools.permutations(groups)]
    else:
        group_orders = [
            groups,
            sorted(groups, key=lambda g: -speed[g]),
            sorted(groups, key=lambda g: speed[g]),
            sorted(groups, key=lambda g: (-memory[g], -speed[g])),
        ]
    # Striped: GPU i of every node of a class together, so a stage takes one GPU per node
    # and a micro-batch's pipeline hops stay inside its node, while data-parallel traffic
    # crosses nodes once per step. Only per-GPU units split nodes.
    first_rank: dict[int, int] = {}
    for unit in units:
        if len(unit.ranks) == 1:
            node = unit.node_indices[0]
            first_rank[node] = min(first_rank.get(node, unit.ranks[0]), unit.ranks[0])
    orders: list[tuple[Unit, ...]] = []
    seen: set[tuple[tuple[int, int, int], ...]] = set()
    for group_order in group_orders:
        rank_of = {g: i for i, g in enumerate(group_order)}
        # Keep domains together, in the order of their first class in this permutation.
        domain_rank: dict[tuple[str, str], int] = {}
        for g in group_order:
            domain_rank.setdefault(domain_of[g], rank_of[g])
        order = tuple(
            sorted(units, key=lambda u: (domain_rank[u.domain], rank_of[u.group_index], u.ranks))
        )
        candidates = [order]
        if len(units) <= ROTATIONS_UP_TO:
            # Every rotation, so one class can sit at both ends of the pipeline (a fast GPU
            # first and last around slower middle stages).
            candidates += [order[shift:] + order[:shift] for shift in range(1, len(order))]
        if first_rank:
            candidates.append(
                tuple(
                    sorted(
                        units,
                        key=lambda u: (
                            domain_rank[u.domain],
                            rank_of[u.group_index],
                            u.ranks[0] - first_rank.get(u.node_indices[0], u.ranks[0]),
                            u.node_indices[0],
                        ),
                    )
                )
            )
        for candidate in candidates:
            key = _structure_key(candidate)
            if key not in seen:
                seen.add(key)
                orders.append(candidate)
    return orders


def _structure_key(order: tuple[Unit, ...]) -> tuple[tuple[int, int, int], ...]:
    """Orders equal up to renaming interchangeable nodes of a class cost the same."""
    renamed: dict[int, int] = {}
    return tuple(
        (u.group_index, len(u.ranks), renamed.setdefault(u.node_indices[0], len(renamed)))
        for u in order
    )
