"""Communication model: alpha-beta messages, ring closed forms, flat vs hierarchical groups.

Clusters are built from small mappings with ``parse_cluster`` and every expected time is
the ring formula (n-1)(alpha + S/(nBE)) evaluated by hand on the link that should pace it,
E being NCCL's bus efficiency (the fraction of a link's rate a ring step reaches).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from piebald.cost.comm import (
    BUS_EFFICIENCY,
    Collective,
    collective_time_s,
    p2p_time_s,
    ring_profile,
    ring_time_s,
)
from piebald.specs.cluster import ClusterSpec, Link, LinkKind
from piebald.specs.cluster_yaml import parse_cluster

E = BUS_EFFICIENCY


def _cluster(nodes: list[dict[str, Any]], sites: list[dict[str, Any]] | None = None) -> ClusterSpec:
    data: dict[str, Any] = {"name": "test", "nodes": nodes}
    if sites:
        data["sites"] = sites
    return parse_cluster(data, source="test")


def _group(name: str, *, count: int, gpus: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "count": count, "gpu": "A100-80GB", "gpus_per_node": gpus, **extra}


# --- point to point and ring closed forms -----------------------------------------------


def test_p2p_is_latency_plus_size_over_bandwidth() -> None:
    link = Link(kind=LinkKind.RDMA, bandwidth_bytes_per_s=1e9, latency_s=1e-5)
    assert p2p_time_s(num_bytes=1e6, link=link) == pytest.approx(1e-5 + 1e-3, rel=1e-12)
    assert p2p_time_s(num_bytes=0, link=link) == pytest.approx(1e-5)


@pytest.mark.parametrize("kind", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER])
def test_ring_reduce_scatter_and_all_gather(kind: Collective) -> None:
    # n = 4, S = 4e6 B, B = 1e9 B/s, alpha = 10 us: 3 x (10 us + 1 ms) = 3.03 ms.
    time_s = ring_time_s(
        kind, num_bytes=4e6, num_ranks=4, bandwidth_bytes_per_s=1e9, latency_s=1e-5
    )
    assert time_s == pytest.approx(3.03e-3, rel=1e-12)


def test_ring_all_reduce_is_twice_a_reduce_scatter() -> None:
    time_s = ring_time_s(
        Collective.ALL_REDUCE, num_bytes=4e6, num_ranks=4, bandwidth_bytes_per_s=1e9, latency_s=1e-5
    )
    assert time_s == pytest.approx(6.06e-3, rel=1e-12)


@pytest.mark.parametrize("kind", list(Collective))
def test_ring_of_one_rank_is_free(kind: Collective) -> None:
    assert (
        ring_time_s(kind, num_bytes=1e9, num_ranks=1, bandwidth_bytes_per_s=1e9, latency_s=1) == 0
    )


def test_ring_bandwidth_term_approaches_two_s_over_b() -> None:
    # All-reduce moves 2 (n-1)/n x S per rank: the bandwidth term tends to 2 S / B.
    big = ring_time_s(
        Collective.ALL_REDUCE,
        num_bytes=1e9,
        num_ranks=1000,
        bandwidth_bytes_per_s=1e9,
        latency_s=0.0,
    )
    assert big == pytest.approx(2 * 999 / 1000, rel=1e-12)


# --- collectives on clusters --------------------------------------------------------------


def test_one_node_group_is_a_ring_at_intra_node_bandwidth() -> None:
    cluster = _cluster([_group("a", count=1, gpus=4, intra_link="100GB/s", intra_latency="5us")])
    # S = 4e8: all-reduce = 2 x 3 x (5 us + 4e8 / (4 x 1e11 x E)).
    time_s = collective_time_s(
        Collective.ALL_REDUCE, num_bytes=4e8, ranks=[0, 1, 2, 3], cluster=cluster
    )
    assert time_s == pytest.approx(6 * (5e-6 + 1e-3 / E), rel=1e-12)
    all_gather_s = collective_time_s(
        Collective.ALL_GATHER, num_bytes=4e8, ranks=[3, 1, 0, 2], cluster=cluster
    )
    assert all_gather_s == pytest.approx(3 * (5e-6 + 1e-3 / E), rel=1e-12)


def test_single_rank_or_empty_buffer_costs_nothing() -> None:
    cluster = _cluster([_group("a", count=1, gpus=2, intra_link="100GB/s")])
    assert collective_time_s(Collective.ALL_REDUCE, num_bytes=1e9, ranks=[1], cluster=cluster) == 0
    assert collective_time_s(Collective.ALL_REDUCE, num_bytes=0, ranks=[0, 1], cluster=cluster) == 0


def _two_by_two_ib(intra_link: str) -> ClusterSpec:
    nic = {"kind": "infiniband", "bandwidth": "200Gb/s", "latency": "10us"}  # 2.5e10 B/s
    return _cluster(
        [_group("ib", count=2, gpus=2, intra_link=intra_link, intra_latency="5us", nic=nic)]
    )


def test_two_nodes_hierarchical_wins_with_fast_intra_links() -> None:
    cluster = _two_by_two_ib("100GB/s")
    size = 1e9
    # Flat ring 0-1-2-3-0 crosses the NIC twice: B = 2.5e10, alpha = 10 us.
    flat_s = 2 * 3 * (10e-6 + size / (4 * 2.5e10 * E))
    # Hierarchical: RS and AG in each node of 2 at 1e11, all-reduce between 2 nodes on IB.
    intra_s = 1 * (5e-6 + size / (2 * 1e11 * E))
    inter_s = 2 * 1 * (10e-6 + size / (2 * 2.5e10 * E))
    hierarchical_s = 2 * intra_s + inter_s
    assert hierarchical_s < flat_s
    time_s = collective_time_s(
        Collective.ALL_REDUCE, num_bytes=size, ranks=[0, 1, 2, 3], cluster=cluster
    )
    assert time_s == pytest.approx(min(flat_s, hierarchical_s), rel=1e-12)


@pytest.mark.parametrize("ranks", [[0, 2], [0, 1, 2, 3]])
@pytest.mark.parametrize("kind", list(Collective))
def test_rings_sharing_a_nic_see_a_nic_of_its_bandwidth_over_their_number(
    ranks: list[int], kind: Collective
) -> None:
    # Two rings at once over nodes of 200 Gb/s NICs run as one ring over 100 Gb/s NICs
    # (inside a node every GPU keeps its own port): the flat ring and the hierarchical one.
    shared = ring_profile(_two_by_two_ib("100GB/s"), ranks, rings_per_nic=2)
    nic = {"kind": "infiniband", "bandwidth": "100Gb/s", "latency": "10us"}
    halved = _cluster(
        [_group("ib", count=2, gpus=2, intra_link="100GB/s", intra_latency="5us", nic=nic)]
    )
    alone = ring_profile(halved, ranks)
    assert shared.time_s(kind, num_bytes=1e9) == pytest.approx(
        alone.time_s(kind, num_bytes=1e9), rel=1e-12
    )
    assert shared.time_s(kind, num_bytes=1e9) > ring_profile(
        _two_by_two_ib("100GB/s"), ranks
    ).time_s(kind, num_bytes=1e9)


def test_two_nodes_reduce_scatter_hierarchical_has_one_intra_phase() -> None:
    cluster = _two_by_two_ib("100GB/s")
    size = 1e9
    flat_s = 3 * (10e-6 + size / (4 * 2.5e10 * E))
    hierarchical_s = (5e-6 + size / (2 * 1e11 * E)) + (10e-6 + size / (2 * 2.5e10 * E))
    time_s = collective_time_s(
        Collective.REDUCE_SCATTER, num_bytes=size, ranks=[0, 1, 2, 3], cluster=cluster
    )
    assert time_s == pytest.approx(min(flat_s, hierarchical_s), rel=1e-12)


def test_two_nodes_flat_wins_when_intra_and_inter_bandwidths_match() -> None:
    cluster = _two_by_two_ib("25GB/s")  # the same 2.5e10 B/s as the NIC
    size = 1e9
    flat_s = 2 * 3 * (10e-6 + size / (4 * 2.5e10 * E))  # 2 x 3/4 x S/(BE) + latency
    hierarchical_s = 2 * (5e-6 + size / (2 * 2.5e10 * E)) + 2 * (10e-6 + size / (2 * 2.5e10 * E))
    assert flat_s < hierarchical_s
    time_s = collective_time_s(
        Collective.ALL_REDUCE, num_bytes=size, ranks=[0, 1, 2, 3], cluster=cluster
    )
    assert time_s == pytest.approx(flat_s, rel=1e-12)


def test_infiniband_and_roce_nodes_fall_back_to_ethernet() -> None:
    cluster = _cluster(
        [
            _group(
                "ib",
                count=1,
                gpus=1,
                ethernet="25Gb/s",
                nic={"kind": "infiniband", "bandwidth": "400Gb/s"},
            ),
            _group(
                "roce",
                count=1,
                gpus=1,
                ethernet="10Gb/s",
                nic={"kind": "roce", "bandwidth": "400Gb/s"},
            ),
        ]
    )
    # No RDMA between IB and RoCE: the slower Ethernet (10 Gb/s = 1.25e9 B/s) at the default
    # 50 us latency. All-reduce over 2 ranks of S = 1e8: 2 x (50 us + 1e8 / (2 x 1.25e9 x E)).
    time_s = collective_time_s(Collective.ALL_REDUCE, num_bytes=1e8, ranks=[0, 1], cluster=cluster)
    assert time_s == pytest.approx(2 * (50e-6 + 1e8 / (2 * 1.25e9 * E)), rel=1e-12)


def test_two_infiniband_nodes_use_rdma() -> None:
    cluster = _cluster(
        [
            _group(
                "ib",
                count=2,
                gpus=1,
                ethernet="10Gb/s",
                nic={"kind": "infiniband", "bandwidth": "400Gb/s", "latency": "10us"},
            )
        ]
    )
    time_s = collective_time_s(Collective.ALL_REDUCE, num_bytes=1e8, ranks=[0, 1], cluster=cluster)
    assert time_s == pytest.approx(2 * (10e-6 + 1e8 / (2 * 5e10 * E)), rel=1e-12)


def test_mixed_rdma_nodes_with_two_gpus_each_are_paced_by_ethernet() -> None:
    cluster = _cluster(
        [
            _group(
                "ib",
                count=1,
                gpus=2,
                intra_link="100GB/s",
                intra_latency="5us",
                ethernet="10Gb/s",
                nic={"kind": "infiniband", "bandwidth": "400Gb/s"},
            ),
            _group(
                "roce",
                count=1,
                gpus=2,
                intra_link="100GB/s",
                intra_latency="5us",
                ethernet="10Gb/s",
                nic={"kind": "roce", "bandwidth": "400Gb/s"},
            ),
        ]
    )
    size, ethernet = 1e8, 1.25e9
    flat_s = 2 * 3 * (50e-6 + size / (4 * ethernet * E))
    hierarchical_s = 2 * (5e-6 + size / (2 * 1e11 * E)) + 2 * (50e-6 + size / (2 * ethernet * E))
    time_s = collective_time_s(
        Collective.ALL_REDUCE, num_bytes=size, ranks=[0, 1, 2, 3], cluster=cluster
    )
    assert time_s == pytest.approx(min(flat_s, hierarchical_s), rel=1e-12)


def test_uneven_shards_cost_a_padded_even_collective() -> None:
    cluster = _cluster([_group("a", count=1, gpus=4, intra_link="100GB/s", intra_latency="5us")])
    size, fractions = 1e9, [0.4, 0.2, 0.2, 0.2]
    uneven_s = collective_time_s(
        Collective.ALL_GATHER,
        num_bytes=size,
        ranks=[0, 1, 2, 3],
        cluster=cluster,
        shard_fractions=fractions,
    )
    padded_s = collective_time_s(
        Collective.ALL_GATHER, num_bytes=4 * 0.4 * size, ranks=[0, 1, 2, 3], cluster=cluster
    )
    # Every rank contributes a 0.4 S chunk: 3 x (5 us + 1.6e9 / (4 x 1e11 x E)).
    assert uneven_s == pytest.approx(3 * (5e-6 + 4e-3 / E), rel=1e-12)
    assert uneven_s == pytest.approx(padded_s, rel=1e-12)


def test_even_shard_fractions_cost_the_same_as_none() -> None:
    cluster = _cluster([_group("a", count=1, gpus=4, intra_link="100GB/s")])
    kwargs: dict[str, Any] = dict(num_bytes=1e9, ranks=[0, 1, 2, 3], cluster=cluster)
    even = collective_time_s(Collective.REDUCE_SCATTER, shard_fractions=[0.25] * 4, **kwargs)
    assert even == pytest.approx(collective_time_s(Collective.REDUCE_SCATTER, **kwargs), rel=1e-12)


def test_shard_fractions_must_match_the_ranks() -> None:
    cluster = _cluster([_group("a", count=1, gpus=4, intra_link="100GB/s")])
    with pytest.raises(ValueError, match="3 shard fractions for 4 ranks"):
        collective_time_s(
            Collective.ALL_GATHER,
            num_bytes=1e9,
            ranks=[0, 1, 2, 3],
            cluster=cluster,
            shard_fractions=[0.5, 0.25, 0.25],
        )


def _two_site_cluster(gpus: int) -> ClusterSpec:
    nic = {"kind": "infiniband", "bandwidth": "200Gb/s", "latency": "10us"}
    common = dict(intra_link="100GB/s", intra_latency="5us", ethernet="100Gb/s", nic=nic)
    return _cluster(
        [
            _group("east", count=1, gpus=gpus, site="dc1", **common),
            _group("west", count=1, gpus=gpus, site="dc2", **common),
        ],
        sites=[{"between": ["dc1", "dc2"], "bandwidth": "1Gb/s", "latency": "15ms"}],
    )


def test_group_across_sites_is_paced_by_the_site_link() -> None:
    cluster = _two_site_cluster(gpus=1)
    # Site link 1 Gb/s = 1.25e8 B/s, 15 ms: 2 x (15 ms + 1e8 / (2 x 1.25e8 x E)).
    time_s = collective_time_s(Collective.ALL_REDUCE, num_bytes=1e8, ranks=[0, 1], cluster=cluster)
    assert time_s == pytest.approx(2 * (15e-3 + 1e8 / (2 * 1.25e8 * E)), rel=1e-12)


def test_two_sites_of_two_gpus_take_the_better_of_flat_and_hierarchical() -> None:
    cluster = _two_site_cluster(gpus=2)
    size, site = 1e8, 1.25e8
    flat_s = 2 * 3 * (15e-3 + size / (4 * site * E))
    hierarchical_s = 2 * (5e-6 + size / (2 * 1e11 * E)) + 2 * (15e-3 + size / (2 * site * E))
    time_s = collective_time_s(
        Collective.ALL_REDUCE, num_bytes=size, ranks=[0, 1, 2, 3], cluster=cluster
    )
    assert time_s == pytest.approx(min(flat_s, hierarchical_s), rel=1e-12)


# --- the ring profile against walking every rank ------------------------------------------


def test_flat_ring_is_paced_by_the_slowest_link_between_consecutive_ranks() -> None:
    """ring_profile takes each node's own link and the links between consecutive nodes
    once; brute force walks every pair of consecutive ranks (the last back to the first)
    and asks the cluster afresh, on random groups of a cluster with two sites, three NIC
    kinds and nodes of 1, 2 and 4 GPUs."""
    ib = {"kind": "infiniband", "bandwidth": "200Gb/s", "latency": "10us"}
    roce = {"kind": "roce", "bandwidth": "100Gb/s", "latency": "12us"}
    eth = {"kind": "ethernet", "bandwidth": "50Gb/s", "latency": "40us"}
    cluster = _cluster(
        [
            _group("a", count=2, gpus=4, intra_link="300GB/s", nic=ib, site="dc1"),
            _group("b", count=2, gpus=2, intra_link="64GB/s", nic=roce, site="dc1"),
            _group("c", count=3, gpus=1, intra_link="32GB/s", nic=ib, site="dc1"),
            _group("d", count=2, gpus=4, intra_link="600GB/s", nic=eth, site="dc2"),
        ],
        sites=[{"between": ["dc1", "dc2"], "bandwidth": "10Gb/s", "latency": "5ms"}],
    )
    rng = random.Random(7)
    for _ in range(300):
        ranks = sorted(rng.sample(range(cluster.num_gpus), rng.randint(2, cluster.num_gpus)))
        pairs = list(zip(ranks, ranks[1:] + ranks[:1], strict=True))
        links = []
        for a, b in pairs:
            node_a, node_b = cluster.gpus[a].node_index, cluster.gpus[b].node_index
            if node_a == node_b:
                group = cluster.group_of(a)
                links.append((group.intra_link_bytes_per_s, group.intra_latency_s))
            else:
                link = cluster.node_link(node_a, node_b)
                links.append((link.bandwidth_bytes_per_s, link.latency_s))
        flat = ring_profile(cluster, rng.sample(ranks, len(ranks))).flat
        assert flat.num_ranks == len(ranks)
        assert flat.bandwidth_bytes_per_s == min(bandwidth for bandwidth, _ in links) * E
        assert flat.latency_s == max(latency for _, latency in links)
