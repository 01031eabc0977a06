"""Communication time: alpha-beta per link, ring and hierarchical collectives.

A point-to-point message of S bytes over a link takes ``alpha + S / B``. A ring collective
over n ranks (Thakur, Rabenseifner and Gropp 2005; Patarasuk and Yuan 2009) runs n-1 steps
each moving one chunk of S/n over every ring link at once, so the slowest link paces it:

    reduce-scatter = all-gather = (n-1) * (alpha + S/(n*B)),   all-reduce = twice that.

A group spanning several nodes may run hierarchically (intra-node reduce-scatter, a ring
between nodes in which every GPU of a node carries 1/g of the data through the node's NIC,
intra-node all-gather); NCCL picks whichever is faster, and so does :func:`collective_time_s`.
Uneven shards run as a padded even collective of the largest shard (as the runtime does on
NCCL), i.e. S becomes n * max(fraction) * S.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from piebald.specs.cluster import ClusterSpec, Link

__all__ = ["Collective", "collective_time_s", "p2p_time_s", "ring_time_s"]


class Collective(StrEnum):
    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"


def p2p_time_s(*, num_bytes: float, link: Link) -> float:
    """One message of ``num_bytes`` over ``link``: alpha + S / B."""
    return link.latency_s + num_bytes / link.bandwidth_bytes_per_s


def ring_time_s(
    kind: Collective,
    *,
    num_bytes: float,
    num_ranks: int,
    bandwidth_bytes_per_s: float,
    latency_s: float,
) -> float:
    """Ring collective of ``num_bytes`` (the full buffer) over ``num_ranks``."""
    if num_ranks <= 1:
        return 0.0
    one_pass_s = (num_ranks - 1) * (latency_s + num_bytes / (num_ranks * bandwidth_bytes_per_s))
    return 2.0 * one_pass_s if kind is Collective.ALL_REDUCE else one_pass_s


def _flat_ring_s(
    kind: Collective, *, num_bytes: float, ranks: Sequence[int], cluster: ClusterSpec
) -> float:
    """Ring in rank order: each node has one flow in and one out, the slowest link paces."""
    links = [cluster.link_between(ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks))]
    return ring_time_s(
        kind,
        num_bytes=num_bytes,
        num_ranks=len(ranks),
        bandwidth_bytes_per_s=min(link.bandwidth_bytes_per_s for link in links),
        latency_s=max(link.latency_s for link in links),
    )


def _hierarchical_s(
    kind: Collective, *, num_bytes: float, by_node: dict[int, list[int]], cluster: ClusterSpec
) -> float | None:
    """Intra-node phase, inter-node ring, intra-node phase; None unless nodes are equal."""
    sizes = {len(members) for members in by_node.values()}
    if len(by_node) < 2 or len(sizes) != 1 or sizes == {1}:
        return None
    intra_s = max(
        _flat_ring_s(Collective.REDUCE_SCATTER, num_bytes=num_bytes, ranks=members, cluster=cluster)
        for members in by_node.values()
    )
    nodes = sorted(by_node)
    inter = [cluster.node_link(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]
    # per_node parallel rings each carry num_bytes / per_node through one shared NIC: the
    # same bandwidth term as one ring over the nodes carrying all num_bytes.
    inter_s = ring_time_s(
        kind,
        num_bytes=num_bytes,
        num_ranks=len(nodes),
        bandwidth_bytes_per_s=min(link.bandwidth_bytes_per_s for link in inter),
        latency_s=max(link.latency_s for link in inter),
    )
    phases = 2 if kind is Collective.ALL_REDUCE else 1  # RS+AG around an all-reduce
    return phases * intra_s + inter_s


def collective_time_s(
    kind: Collective,
    *,
    num_bytes: float,
    ranks: Sequence[int],
    cluster: ClusterSpec,
    shard_fractions: Sequence[float] | None = None,
) -> float:
    """Time of a collective over ``ranks`` on ``cluster``, the faster of flat and hierarchical.

    ``num_bytes`` is the whole buffer (what an all-reduce reduces, what an all-gather
    assembles); ``shard_fractions`` make a reduce-scatter or all-gather uneven.
    """
    if len(ranks) <= 1 or num_bytes <= 0:
        return 0.0
    if shard_fractions is not None:
        if len(shard_fractions) != len(ranks):
            raise ValueError(f"{len(shard_fractions)} shard fractions for {len(ranks)} ranks")
        num_bytes = num_bytes * len(ranks) * max(shard_fractions)
    ordered = sorted(ranks)
    flat_s = _flat_ring_s(kind, num_bytes=num_bytes, ranks=ordered, cluster=cluster)
    by_node: dict[int, list[int]] = {}
    for rank in ordered:
        by_node.setdefault(cluster.gpus[rank].node_index, []).append(rank)
    hierarchical_s = _hierarchical_s(kind, num_bytes=num_bytes, by_node=by_node, cluster=cluster)
    return flat_s if hierarchical_s is None else min(flat_s, hierarchical_s)
