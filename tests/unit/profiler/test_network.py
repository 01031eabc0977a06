"""Network profiling: which pairs and groups are measured, emulation on loopback, and
measured links applied to the cluster the cost model reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from piebald.profiler.db import load_profile_db, write_profile
from piebald.profiler.fit import fit_alpha_beta
from piebald.profiler.network_model import MeasuredCluster, apply_network_profiles
from piebald.profiler.records import NetworkKey, NetworkKind, NetworkProfile
from piebald.specs.cluster_yaml import cluster_to_dict, parse_cluster

from .conftest import provenance

TWO_GROUPS = {
    "name": "two",
    "nodes": [
        {"name": "fast", "gpu": "A100-80GB", "gpus_per_node": 2, "count": 2,
         "intra_link": "600GB/s", "nic": {"kind": "infiniband", "bandwidth": "200Gb/s"}},
        {"name": "slow", "gpu": "T4", "gpus_per_node": 2, "intra_link": "16GB/s"},
    ],
}  # fmt: skip


def _p2p(scope: str, a: str, b: str, latency_s: float, bandwidth: float) -> NetworkProfile:
    sizes = (2.0**20, 2.0**22, 2.0**24)
    times = tuple(latency_s + size / bandwidth for size in sizes)
    fit = fit_alpha_beta(sizes, times)
    return NetworkProfile(
        key=NetworkKey(kind=NetworkKind.P2P, scope=scope, groups=(a, b), num_ranks=2),
        backend="nccl",
        message_bytes=sizes,
        time_s=times,
        latency_s=fit.latency_s,
        bandwidth_bytes_per_s=fit.bandwidth_bytes_per_s,
        provenance=provenance(),
    )


def test_measured_links_replace_the_nominal_ones(tmp_path: Path) -> None:
    cluster = parse_cluster(TWO_GROUPS, source="test")
    write_profile(_p2p("intra-node", "fast", "fast", 3e-6, 250e9), tmp_path)
    write_profile(_p2p("inter-node", "fast", "slow", 80e-6, 1e9), tmp_path)
    write_profile(_p2p("inter-node", "elsewhere", "slow", 1e-3, 1e6), tmp_path)  # not ours
    measured = apply_network_profiles(cluster, load_profile_db(tmp_path))
    assert isinstance(measured, MeasuredCluster)
    intra = measured.link_between(0, 1)
    assert intra.bandwidth_bytes_per_s == pytest.approx(250e9)
    assert intra.latency_s == pytest.approx(3e-6)
    across = measured.link_between(0, 4)  # fast node 0 to the slow node
    assert across.bandwidth_bytes_per_s == pytest.approx(1e9)
    assert across.latency_s == pytest.approx(80e-6)
    # Unmeasured links keep their nominal numbers.
    assert measured.link_between(0, 2) == cluster.link_between(0, 2)
    assert measured.link_between(4, 5) == cluster.link_between(4, 5)
    # Intra-node numbers live in the node group, so a saved plan keeps them.
    saved = parse_cluster(cluster_to_dict(measured), source="saved")
    assert saved.link_between(0, 1).bandwidth_bytes_per_s == pytest.approx(250e9)


def test_measurement_list_covers_pairs_and_groups() -> None:
    pytest.importorskip("torch")
    from piebald.profiler.measure_network import network_measurements

    cluster = parse_cluster(TWO_GROUPS, source="test")
    measurements = network_measurements(cluster)
    p2p = {(m.key.scope, m.key.groups): m.ranks for m in measurements if m.key.kind == "p2p"}
    assert p2p == {
        ("intra-node", ("fast", "fast")): (0, 1),
        ("inter-node", ("fast", "fast")): (0, 2),  # two nodes of one group
        ("inter-node", ("fast", "slow")): (0, 4),
        ("intra-node", ("slow", "slow")): (4, 5),
    }
    groups = {m.ranks for m in measurements if m.key.kind == "all-reduce"}
    assert groups == {(0, 1), (0, 1, 2, 3), (4, 5), (0, 1, 2, 3, 4, 5)}


@pytest.mark.distributed
def test_emulated_network_writes_a_db_the_cluster_uses(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from piebald.profiler.measure_network import emulate_network

    cluster = parse_cluster(
        {"name": "pair", "nodes": [
            {"name": "g", "gpu": "T4", "gpus_per_node": 2, "intra_link": "16GB/s"}]},
        source="test",
    )  # fmt: skip
    profiles = emulate_network(
        cluster, message_bytes=(2**16, 2**20), num_warmup=1, num_repeats=2, max_processes=2
    )
    kinds = sorted(str(p.key.kind) for p in profiles)
    assert kinds == ["all-gather", "all-reduce", "p2p", "reduce-scatter"]
    for profile in profiles:
        assert all(t > 0 for t in profile.time_s) and profile.bandwidth_bytes_per_s > 0
        write_profile(profile, tmp_path)
    measured = apply_network_profiles(cluster, load_profile_db(tmp_path))
    (p2p,) = [p for p in profiles if p.key.kind is NetworkKind.P2P]
    assert measured.link_between(0, 1).latency_s == pytest.approx(p2p.latency_s)
