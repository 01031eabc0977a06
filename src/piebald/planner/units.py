"""The coarse structure the planner enumerates: units of GPUs and the orders they line up in.

A unit is a whole node (so a stage's data-parallel traffic stays on NVLink/PCIe where it
can), or a single GPU in clusters of at most ``GPU_UNITS_UP_TO`` GPUs, where splitting a
node across pipeline stages can pay. Stages are contiguous runs of units in an order; the
orders keep sites and NIC classes together (Holmes: data-parallel groups inside one RDMA
class, pipeline boundaries on the slow links between classes) and try different type
orders inside them, so the search never has to enumerate set partitions.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype

__all__ = ["GPU_UNITS_UP_TO", "Unit", "build_units", "unit_orders"]

GPU_UNITS_UP_TO = 16
ALL_PERMUTATIONS_UP_TO = 4  # node groups; beyond this, a few heuristic orders
ROTATIONS_UP_TO = 8  # units; small clusters also try every rotation of each order


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    ranks: tuple[int, ...]
    device: DeviceType
    group_index: int
    node_index: int
    domain: tuple[str, str]  # (site, NIC class): stages inside one domain talk RDMA
    peak_flops: float  # summed training peak of the unit's GPUs, the speed proxy for cuts
    memory_bytes: float


def build_units(cluster: ClusterSpec, *, precision: Dtype, nodes: frozenset[int]) -> list[Unit]:
    """Units of the nodes (by index) in ``nodes``, in rank order."""
    per_gpu = cluster.num_gpus <= GPU_UNITS_UP_TO
    units = []
    for node in cluster.nodes:
        if node.index not in nodes:
            continue
        group = cluster.node_groups[node.group_index]
        ranks = tuple(range(node.first_rank, node.first_rank + node.num_gpus))
        # RDMA classes: InfiniBand and RoCE nodes cannot talk RDMA to each other, and plain
        # Ethernet nodes talk to nobody over RDMA, so each Ethernet node group is its own class.
        nic = group.nic.kind.value if group.nic.kind.value != "ethernet" else f"eth:{group.name}"
        for chunk in [(rank,) for rank in ranks] if per_gpu else [ranks]:
            units.append(
                Unit(
                    ranks=chunk,
                    device=group.device,
                    group_index=node.group_index,
                    node_index=node.index,
                    domain=(group.site, nic),
                    peak_flops=len(chunk) * group.device.training_peak_flops(precision),
                    memory_bytes=len(chunk) * group.device.memory_bytes,
                )
            )
    return units


def unit_orders(units: list[Unit]) -> list[tuple[Unit, ...]]:
    """Candidate orders: units grouped by site and NIC class, node groups in different
    orders inside them (all permutations for a few groups, else by speed and memory)."""
    groups = list(dict.fromkeys(unit.group_index for unit in units))
    domains = list(dict.fromkeys(unit.domain for unit in units))
    by_group = {g: [u for u in units if u.group_index == g] for g in groups}
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
    orders: list[tuple[Unit, ...]] = []
    seen: set[tuple[tuple[int, int], ...]] = set()
    for group_order in group_orders:
        rank_of = {g: i for i, g in enumerate(group_order)}
        # Keep domains together, in the order of their first group in this permutation.
        domain_rank = {
            d: min(rank_of[u.group_index] for u in units if u.domain == d) for d in domains
        }
        order = tuple(
            sorted(units, key=lambda u: (domain_rank[u.domain], rank_of[u.group_index], u.ranks))
        )
        candidates = [order]
        if len(units) <= ROTATIONS_UP_TO:
            # Every rotation, so one group can sit at both ends of the pipeline (a fast GPU
            # first and last around slower middle stages).
            candidates += [order[shift:] + order[:shift] for shift in range(1, len(order))]
        if any(len(u.ranks) == 1 for u in units):
            # Striped: GPU i of every node of a group together, so a stage takes one GPU per
            # node and a micro-batch's pipeline hops stay inside its node, while
            # data-parallel traffic crosses nodes once per step.
            local = {
                u.ranks[0]: u.ranks[0]
                - min(v.ranks[0] for v in units if v.node_index == u.node_index)
                for u in units
            }
            candidates.append(
                tuple(
                    sorted(
                        units,
                        key=lambda u: (
                            domain_rank[u.domain],
                            rank_of[u.group_index],
                            local[u.ranks[0]],
                            u.node_index,
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


def _structure_key(order: tuple[Unit, ...]) -> tuple[tuple[int, int], ...]:
    """Orders equal up to renaming interchangeable nodes of a group cost the same."""
    renamed: dict[int, int] = {}
    return tuple((u.group_index, renamed.setdefault(u.node_index, len(renamed))) for u in order)
