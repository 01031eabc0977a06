"""Which physical resources a point-to-point transfer occupies, and their capacities.

Concurrent transfers share a resource's bandwidth: every GPU has its own port into the
node's interconnect (NVLink/PCIe), but all GPUs of a node that talk to other nodes share
the node's NIC (one per direction), and all traffic between two sites shares the site
link. The plan estimate bounds a stage boundary by its busiest resource; the simulator
splits each resource among the transfers that use it at the same time.
"""

from __future__ import annotations

from collections.abc import Hashable

from piebald.specs.cluster import ClusterSpec, LinkKind

__all__ = ["Resource", "transfer_resources"]

Resource = tuple[Hashable, float]  # (resource key, capacity in bytes/s)


def transfer_resources(cluster: ClusterSpec, sender: int, receiver: int) -> tuple[Resource, ...]:
    """The resources a transfer from ``sender`` to ``receiver`` occupies."""
    link = cluster.link_between(sender, receiver)
    if link.kind is LinkKind.INTRA_NODE:
        return (
            (("gpu-out", sender), link.bandwidth_bytes_per_s),
            (("gpu-in", receiver), link.bandwidth_bytes_per_s),
        )
    node_a, node_b = cluster.gpus[sender].node_index, cluster.gpus[receiver].node_index
    group_a, group_b = cluster.group_of(sender), cluster.group_of(receiver)
    if link.kind is LinkKind.RDMA:
        port = "rdma"
        cap_a, cap_b = group_a.nic.bandwidth_bytes_per_s, group_b.nic.bandwidth_bytes_per_s
    else:
        port = "ethernet"
        cap_a, cap_b = group_a.ethernet_link_bytes_per_s, group_b.ethernet_link_bytes_per_s
    resources: tuple[Resource, ...] = (
        (("nic-out", node_a, port), cap_a),
        (("nic-in", node_b, port), cap_b),
    )
    if link.kind is LinkKind.SITE:
        wan = cluster.site_link(group_a.site, group_b.site)
        resources += ((("site", group_a.site, group_b.site), wan.bandwidth_bytes_per_s),)
    return resources
