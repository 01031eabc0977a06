"""The cluster: node groups of GPUs, their links, sites, and the global rank order.

Ranks are numbered in file order: node group, then node index inside the group, then local
GPU index inside the node. The link between two GPUs follows Holmes (arXiv 2312.03549):
inside a node the intra-node link; between nodes of one site RDMA at the slower NIC's rate
when both NICs are of the same RDMA class (InfiniBand with InfiniBand, RoCE with RoCE),
otherwise the Ethernet fallback, because IB and RoCE cannot talk RDMA to each other; between
sites the site link, never faster than either node's Ethernet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from piebald.specs.devices import DeviceType, Dtype

__all__ = [
    "ClusterSpec",
    "Gpu",
    "Link",
    "LinkKind",
    "Nic",
    "NicKind",
    "Node",
    "NodeGroup",
    "SiteLink",
]

# Per-message latencies (alpha of the alpha-beta model) when the file gives none: typical
# NCCL small-message latencies for NVLink/PCIe, RDMA and TCP sockets.
DEFAULT_INTRA_LATENCY_S = 5e-6
DEFAULT_RDMA_LATENCY_S = 10e-6
DEFAULT_ETHERNET_LATENCY_S = 50e-6


class NicKind(StrEnum):
    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"


class LinkKind(StrEnum):
    """Classes of links from fastest to slowest in a typical cluster."""

    INTRA_NODE = "intra-node"
    RDMA = "rdma"
    ETHERNET = "ethernet"
    SITE = "site"


@dataclass(frozen=True, slots=True, kw_only=True)
class Nic:
    kind: NicKind
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGroup:
    """``count`` identical nodes, each with ``gpus_per_node`` GPUs of one type; ``hosts``
    names the host of each node (empty: the file names none)."""

    name: str
    count: int
    device: DeviceType
    gpus_per_node: int
    intra_link_bytes_per_s: float
    intra_latency_s: float
    nic: Nic
    ethernet_bytes_per_s: float
    site: str
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.hosts and len(self.hosts) != self.count:
            raise ValueError(
                f"node group {self.name!r}: {len(self.hosts)} hosts for {self.count} nodes"
            )

    @property
    def ethernet_link_bytes_per_s(self) -> float:
        """What this node reaches over plain Ethernet: its primary NIC if that is Ethernet."""
        if self.nic.kind is NicKind.ETHERNET:
            return max(self.nic.bandwidth_bytes_per_s, self.ethernet_bytes_per_s)
        return self.ethernet_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class SiteLink:
    sites: tuple[str, str]
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """The path between two GPUs as the alpha-beta model sees it."""

    kind: LinkKind
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    name: str
    index: int  # global node index, in rank order
    group_index: int
    index_in_group: int
    first_rank: int
    num_gpus: int
    host: str | None = None  # from the cluster file's ``hosts``, where it names them


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    rank: int
    device: DeviceType
    node_index: int
    local_index: int
    group_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """A validated cluster. Build it with :func:`piebald.specs.cluster_yaml.load_cluster`."""

    name: str
    node_groups: tuple[NodeGroup, ...]
    site_links: tuple[SiteLink, ...] = ()
    custom_types: tuple[DeviceType, ...] = ()
    nodes: tuple[Node, ...] = field(init=False)
    gpus: tuple[Gpu, ...] = field(init=False)
    # link_between's answers by (node, node): the planner and the estimate ask for the same
    # few links over and over.
    _links: dict[tuple[int, int], Link] = field(
        init=False, default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        nodes: list[Node] = []
        gpus: list[Gpu] = []
        for group_index, group in enumerate(self.node_groups):
            for index_in_group in range(group.count):
                node_index = len(nodes)
                nodes.append(
                    Node(
                        name=f"{group.name}-{index_in_group}",
                        index=node_index,
                        group_index=group_index,
                        index_in_group=index_in_group,
                        first_rank=len(gpus),
                        num_gpus=group.gpus_per_node,
                        host=group.hosts[index_in_group] if group.hosts else None,
                    )
                )
                for local_index in range(group.gpus_per_node):
                    gpus.append(
                        Gpu(
                            rank=len(gpus),
                            device=group.device,
                            node_index=node_index,
                            local_index=local_index,
                            group_index=group_index,
                        )
                    )
        object.__setattr__(self, "nodes", tuple(nodes))
        object.__setattr__(self, "gpus", tuple(gpus))

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(group.site for group in self.node_groups))

    def group_of(self, rank: int) -> NodeGroup:
        return self.node_groups[self.gpus[rank].group_index]

    def node_of(self, rank: int) -> Node:
        return self.nodes[self.gpus[rank].node_index]

    def device_of(self, rank: int) -> DeviceType:
        return self.gpus[rank].device

    def site_link(self, site_a: str, site_b: str) -> SiteLink:
        for link in self.site_links:
            if set(link.sites) == {site_a, site_b}:
                return link
        raise KeyError(f"no link between sites {site_a!r} and {site_b!r}")

    def node_link(self, node_a: int, node_b: int) -> Link:
        """The link between two different nodes (one flow, the NIC not shared)."""
        assert node_a != node_b, "same node: use the intra-node link"
        group_a = self.node_groups[self.nodes[node_a].group_index]
        group_b = self.node_groups[self.nodes[node_b].group_index]
        ethernet = min(group_a.ethernet_link_bytes_per_s, group_b.ethernet_link_bytes_per_s)
        if group_a.site != group_b.site:
            wan = self.site_link(group_a.site, group_b.site)
            return Link(
                kind=LinkKind.SITE,
                latency_s=wan.latency_s,
                bandwidth_bytes_per_s=min(wan.bandwidth_bytes_per_s, ethernet),
            )
        if group_a.nic.kind == group_b.nic.kind and group_a.nic.kind is not NicKind.ETHERNET:
            return Link(
                kind=LinkKind.RDMA,
                bandwidth_bytes_per_s=min(
                    group_a.nic.bandwidth_bytes_per_s, group_b.nic.bandwidth_bytes_per_s
                ),
                latency_s=max(group_a.nic.latency_s, group_b.nic.latency_s),
            )
        latency_s = max(
            DEFAULT_ETHERNET_LATENCY_S,
            group_a.nic.latency_s if group_a.nic.kind is NicKind.ETHERNET else 0.0,
            group_b.nic.latency_s if group_b.nic.kind is NicKind.ETHERNET else 0.0,
        )
        return Link(kind=LinkKind.ETHERNET, bandwidth_bytes_per_s=ethernet, latency_s=latency_s)

    def link_between(self, rank_a: int, rank_b: int) -> Link:
        """The link a point-to-point transfer from ``rank_a`` to ``rank_b`` uses."""
        if rank_a == rank_b:
            raise ValueError(f"rank {rank_a} has no link to itself")
        gpu_a, gpu_b = self.gpus[rank_a], self.gpus[rank_b]
        key = (gpu_a.node_index, gpu_b.node_index)
        link = self._links.get(key)
        if link is None:
            if gpu_a.node_index == gpu_b.node_index:
                group = self.node_groups[gpu_a.group_index]
                link = Link(
                    kind=LinkKind.INTRA_NODE,
                    bandwidth_bytes_per_s=group.intra_link_bytes_per_s,
                    latency_s=group.intra_latency_s,
                )
            else:
                link = self.node_link(gpu_a.node_index, gpu_b.node_index)
            self._links[key] = link
        return link

    def total_peak_flops(self, requested: Dtype = Dtype.BF16) -> float:
        """Sum of dense peaks, each GPU in the dtype it trains in for a ``requested`` job."""
        return sum(gpu.device.training_peak_flops(requested) for gpu in self.gpus)

    @property
    def total_memory_bytes(self) -> float:
        return sum(gpu.device.memory_bytes for gpu in self.gpus)
