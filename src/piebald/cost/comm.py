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

A ring step does not move data at the link's full rate: NCCL's measured bus bandwidth is a
fraction of it (:data:`BUS_EFFICIENCY`), so every ring runs at ``B * BUS_EFFICIENCY``.
Point-to-point messages (pipeline hops) run at the link's rate.

Several rings may cross the same NICs at once (a tensor-parallel stage's data-parallel
groups, one per position of its tensor groups, span the same nodes and sync together):
``ring_profile(..., rings_per_nic=n)`` gives each of them 1/n of every inter-node link.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from piebald.specs.cluster import ClusterSpec, Link

__all__ = [
    "BUS_EFFICIENCY",
    "Collective",
    "RingProfile",
    "collective_time_s",
    "p2p_time_s",
    "ring_profile",
    "ring_time_s",
]


# NCCL all-reduce bus bandwidth over a link's rate per direction: 231.6 GB/s on the 300 GB/s
# of an A100's NVLink (Azure AI-benchmarking-guide, ND_A100_v4_results.md, 8 GB messages).
BUS_EFFICIENCY = 0.77


class Collective(StrEnum):
    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"


def p2p_time_s(*, num_bytes: float, link: Link) -> float:
    """One message of ``num_bytes`` over ``link``: alpha + S / B."""
    return link.latency_s + num_bytes / link.bandwidth_bytes_per_s


def broadcast_time_s(*, num_bytes: float, link: Link, num_ranks: int) -> float:
    """One rank's message of ``num_bytes`` to ``num_ranks - 1`` others over ``link``
    (the ranks of one node): a pipelined broadcast moves every byte over each of the
    chain's hops once, with chunks in flight on all of them, so alpha per hop plus one
    message's S / B; nothing for a group of one."""
    if num_ranks <= 1:
        return 0.0
    return p2p_time_s(num_bytes=num_bytes, link=link) + (num_ranks - 2) * link.latency_s


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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ring:
    num_ranks: int
    bandwidth_bytes_per_s: float  # the slowest link of the ring paces every step
    latency_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RingProfile:
    """What a collective over a group costs, reduced to a few numbers: computing it walks
    the group once, after which any collective size is priced in O(1)."""

    num_ranks: int
    flat: _Ring
    intra: _Ring | None  # hierarchical phases, when every node holds the same number
    inter: _Ring | None

    def time_s(
        self, kind: Collective, *, num_bytes: float, shard_fractions: Sequence[float] | None = None
    ) -> float:
        if self.num_ranks <= 1 or num_bytes <= 0:
            return 0.0
        if shard_fractions is not None:
            if len(shard_fractions) != self.num_ranks:
                raise ValueError(
                    f"{len(shard_fractions)} shard fractions for {self.num_ranks} ranks"
                )
            num_bytes = num_bytes * self.num_ranks * max(shard_fractions)

        def ring(kind: Collective, r: _Ring) -> float:
            return ring_time_s(
                kind,
                num_bytes=num_bytes,
                num_ranks=r.num_ranks,
                bandwidth_bytes_per_s=r.bandwidth_bytes_per_s,
                latency_s=r.latency_s,
            )

        flat_s = ring(kind, self.flat)
        if self.intra is None or self.inter is None:
            return flat_s
        phases = 2 if kind is Collective.ALL_REDUCE else 1  # RS+AG around an all-reduce
        # Each of the g GPUs of a node runs its own inter-node ring on num_bytes / g through
        # the shared NIC: the same bandwidth term as one ring carrying num_bytes.
        hierarchical_s = phases * ring(Collective.REDUCE_SCATTER, self.intra) + ring(
            kind, self.inter
        )
        return min(flat_s, hierarchical_s)


def _ring_over(links: Sequence[Link], num_ranks: int) -> _Ring:
    return _Ring(
        num_ranks=num_ranks,
        bandwidth_bytes_per_s=min(link.bandwidth_bytes_per_s for link in links) * BUS_EFFICIENCY,
        latency_s=max(link.latency_s for link in links),
    )


def ring_profile(
    cluster: ClusterSpec, ranks: Sequence[int], *, rings_per_nic: int = 1
) -> RingProfile:
    """The flat ring in rank order (each node one flow in, one out) and, when every node
    holds the same number of the group's GPUs, the hierarchical alternative.
    ``rings_per_nic``: rings over the same nodes running at once, sharing each node's NIC
    equally (inside a node every GPU has its own port)."""
    ordered = sorted(ranks)
    if len(ordered) <= 1:
        single = _Ring(num_ranks=len(ordered), bandwidth_bytes_per_s=1.0, latency_s=0.0)
        return RingProfile(num_ranks=len(ordered), flat=single, intra=None, inter=None)
    by_node: dict[int, int] = {}
    for rank in ordered:
        node = cluster.gpus[rank].node_index
        by_node[node] = by_node.get(node, 0) + 1
    # A node's ranks are consecutive in rank order, so the flat ring's links are those
    # inside each node and one from each node to the next (the last back to the first):
    # taking each once gives the same slowest link as walking every rank.
    nodes = list(by_node)
    if len(nodes) == 1:
        links = [cluster.link_between(ordered[0], ordered[1])]
    else:  # (link_between remembers links by node pair; node_link would build them anew)
        firsts = [cluster.nodes[node].first_rank for node in nodes]
        links = [
            _shared(cluster.link_between(firsts[i - 1], firsts[i]), rings_per_nic)
            for i in range(len(nodes))
        ]
        links += [
            cluster.link_between(first, first + 1)
            for first, count in zip(firsts, by_node.values(), strict=True)
            if count > 1
        ]
    flat = _ring_over(links, len(ordered))
    sizes = set(by_node.values())
    if len(by_node) < 2 or len(sizes) != 1 or sizes == {1}:
        return RingProfile(num_ranks=len(ordered), flat=flat, intra=None, inter=None)
    per_node = sizes.pop()
    groups = [cluster.node_groups[cluster.nodes[node].group_index] for node in by_node]
    intra = _Ring(
        num_ranks=per_node,
        bandwidth_bytes_per_s=min(g.intra_link_bytes_per_s for g in groups) * BUS_EFFICIENCY,
        latency_s=max(g.intra_latency_s for g in groups),
    )
    inter = _ring_over(links[: len(nodes)], len(nodes))  # the node-to-node links above
    return RingProfile(num_ranks=len(ordered), flat=flat, intra=intra, inter=inter)


def _shared(link: Link, rings: int) -> Link:
    """``link`` as each of ``rings`` rings crossing it at once sees it."""
    if rings == 1:
        return link
    return dataclasses.replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s / rings)


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
    return ring_profile(cluster, ranks).time_s(
        kind, num_bytes=num_bytes, shard_fractions=shard_fractions
    )
