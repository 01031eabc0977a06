"""The cluster model: rank order, node names, the link rules (Holmes) and the YAML loader.

Expected ranks and link bandwidths are worked out by hand from the rules in the docstring
of :mod:`piebald.specs.cluster`: ranks in file order (node group, node, local GPU); inside a
node the intra-node link; between nodes of one site RDMA at the slower NIC when both NICs
are of one RDMA class, else Ethernet; between sites the site link, capped by Ethernet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piebald.errors import SpecError
from piebald.examples import example_path
from piebald.specs.cluster import (
    DEFAULT_INTRA_LATENCY_S,
    ClusterSpec,
    LinkKind,
    NicKind,
)
from piebald.specs.cluster_yaml import cluster_to_dict, load_cluster, parse_cluster
from piebald.specs.devices import (
    ATTENTION_SHARE_OF_MATMUL,
    DEFAULT_MATMUL_EFFICIENCY,
    DeviceType,
    Dtype,
    builtin_catalog,
)

GIB = 2**30
GBIT_S = 1e9 / 8  # bytes per second in one Gb/s

THREE_GROUPS = """\
name: three
nodes:
  - name: big
    count: 2
    gpu: H100-SXM
    gpus_per_node: 4
    intra_link: 900GB/s
    nic: {kind: infiniband, bandwidth: 400Gb/s}
    ethernet: 100Gb/s
  - name: mid
    count: 3
    gpu: A100-80GB
    gpus_per_node: 2
    intra_link: 600GB/s
    nic: {kind: infiniband, bandwidth: 200Gb/s}
    ethernet: 25Gb/s
  - name: old
    count: 2
    gpu: V100-32GB
    gpus_per_node: 1
    nic: {kind: roce, bandwidth: 100Gb/s}
    ethernet: 40Gb/s
"""

ETHERNET_ONLY = """\
name: eth
nodes:
  - {name: ws, count: 2, gpu: RTX-4090, gpus_per_node: 2, intra_link: 32GB/s,
     nic: {kind: ethernet, bandwidth: 25Gb/s}}
  - {name: fast, gpu: L40S, gpus_per_node: 1, nic: {kind: ethernet, bandwidth: 100Gb/s}}
  - {name: ib, gpu: A100-80GB, gpus_per_node: 1, nic: {kind: infiniband, bandwidth: 200Gb/s},
     ethernet: 50Gb/s}
  - {name: plain, count: 2, gpu: T4, gpus_per_node: 1}
"""

THREE_SITES = """\
name: sites
nodes:
  - {name: a, count: 2, gpu: H100-SXM, gpus_per_node: 1, site: dc1,
     nic: {kind: infiniband, bandwidth: 400Gb/s}, ethernet: 100Gb/s}
  - {name: b, gpu: A100-80GB, gpus_per_node: 1, site: dc2,
     nic: {kind: infiniband, bandwidth: 200Gb/s}, ethernet: 25Gb/s}
  - {name: c, gpu: L4, gpus_per_node: 1, site: dc3, ethernet: 100Gb/s}
sites:
  - {between: [dc1, dc2], bandwidth: 10Gb/s, latency: 15ms}
  - {between: [dc2, dc3], bandwidth: 100Gb/s, latency: 2ms}
  - {between: [dc3, dc1], bandwidth: 40Gb/s, latency: 30ms}
"""

CUSTOM_TYPE = """\
name: custom
gpu_types:
  - {name: MyGPU-24GB, memory: 24GiB, bf16_tflops: 80, fp16_tflops: 80, fp32_tflops: 20,
     memory_bandwidth: 900GB/s}
nodes:
  - {name: ws, gpu: MyGPU-24GB, gpus_per_node: 2, intra_link: 32GB/s}
  - {name: dc, gpu: A100-80GB, gpus_per_node: 2, intra_link: 600GB/s}
"""


NAMED_HOSTS = """\
name: named
nodes:
  - {name: a100, count: 2, gpu: A100-80GB, gpus_per_node: 4, intra_link: 600GB/s,
     hosts: [gpu-07.lab, gpu-03.lab]}
  - {name: t4, gpu: T4, gpus_per_node: 1, hosts: [old_box-1]}
"""


def load_text(tmp_path: Path, text: str, name: str = "cluster.yaml") -> ClusterSpec:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_cluster(path)


# --- rank order and node names -------------------------------------------------------------


def test_rank_order_is_group_then_node_then_local_index(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, THREE_GROUPS)
    # big: 2 nodes x 4 GPUs, mid: 3 nodes x 2 GPUs, old: 2 nodes x 1 GPU -> 16 ranks.
    expected = [
        ("big-0", 0),
        ("big-0", 1),
        ("big-0", 2),
        ("big-0", 3),
        ("big-1", 0),
        ("big-1", 1),
        ("big-1", 2),
        ("big-1", 3),
        ("mid-0", 0),
        ("mid-0", 1),
        ("mid-1", 0),
        ("mid-1", 1),
        ("mid-2", 0),
        ("mid-2", 1),
        ("old-0", 0),
        ("old-1", 0),
    ]
    assert cluster.num_gpus == 16
    assert [gpu.rank for gpu in cluster.gpus] == list(range(16))
    actual = [(cluster.node_of(rank).name, cluster.gpus[rank].local_index) for rank in range(16)]
    assert actual == expected


def test_nodes_are_named_group_dash_index(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, THREE_GROUPS)
    assert [node.name for node in cluster.nodes] == [
        "big-0",
        "big-1",
        "mid-0",
        "mid-1",
        "mid-2",
        "old-0",
        "old-1",
    ]
    assert [node.first_rank for node in cluster.nodes] == [0, 4, 8, 10, 12, 14, 15]
    assert [node.num_gpus for node in cluster.nodes] == [4, 4, 2, 2, 2, 1, 1]
    assert [node.index for node in cluster.nodes] == list(range(7))
    assert [node.index_in_group for node in cluster.nodes] == [0, 1, 0, 1, 2, 0, 1]


def test_rank_lookups(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, THREE_GROUPS)
    assert cluster.group_of(7).name == "big"
    assert cluster.group_of(8).name == "mid"
    assert cluster.group_of(15).name == "old"
    assert cluster.device_of(0).name == "H100-SXM"
    assert cluster.device_of(13).name == "A100-80GB"
    assert cluster.device_of(14).name == "V100-32GB"
    # 8 x 80GiB + 6 x 80GiB + 2 x 32GiB
    assert cluster.total_memory_bytes == pytest.approx((8 * 80 + 6 * 80 + 2 * 32) * GIB)


# --- links ---------------------------------------------------------------------------------


def test_same_node_uses_the_intra_link(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, THREE_GROUPS)
    link = cluster.link_between(0, 3)
    assert link.kind is LinkKind.INTRA_NODE
    assert link.bandwidth_bytes_per_s == pytest.approx(9e11)  # 900GB/s
    assert link.latency_s == pytest.approx(DEFAULT_INTRA_LATENCY_S)
    mid = cluster.link_between(10, 11)  # both on mid-1
    assert mid.kind is LinkKind.INTRA_NODE
    assert mid.bandwidth_bytes_per_s == pytest.approx(6e11)


def test_infiniband_pairs_use_rdma_at_the_slower_nic(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, THREE_GROUPS)
    same_group = cluster.link_between(0, 4)  # big-0 <-> big-1, both 400Gb/s
    assert same_group.kind is LinkKind.RDMA
    assert same_group.bandwidth_bytes_per_s == pytest.approx(400 * GBIT_S)
    mixed = cluster.link_between(3, 8)  # big (400Gb/s) <-> mid (200Gb/s)
    assert mixed.kind is LinkKind.RDMA
    assert mixed.bandwidth_bytes_per_s == pytest.approx(200 * GBIT_S)
    neighbours = cluster.link_between(9, 10)  # mid-0 <-> mid-1
    assert neighbours.kind is LinkKind.RDMA
    assert neighbours.bandwidth_bytes_per_s == pytest.approx(200 * GBIT_S)


def test_roce_pairs_use_rdma(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, THREE_GROUPS)
    link = cluster.link_between(14, 15)  # old-0 <-> old-1, both RoCE 100Gb/s
    assert link.kind is LinkKind.RDMA
    assert link.bandwidth_bytes_per_s == pytest.approx(100 * GBIT_S)


def test_infiniband_with_roce_falls_back_to_ethernet(tmp_path: Path) -> None:
    # Holmes: IB and RoCE cannot talk RDMA to each other; the slower Ethernet carries it.
    cluster = load_text(tmp_path, THREE_GROUPS)
    mid_old = cluster.link_between(8, 14)  # mid: ethernet 25Gb/s, old: ethernet 40Gb/s
    assert mid_old.kind is LinkKind.ETHERNET
    assert mid_old.bandwidth_bytes_per_s == pytest.approx(25 * GBIT_S)
    big_old = cluster.link_between(0, 15)  # big: ethernet 100Gb/s, old: 40Gb/s
    assert big_old.kind is LinkKind.ETHERNET
    assert big_old.bandwidth_bytes_per_s == pytest.approx(40 * GBIT_S)
    # Ethernet is never faster than RDMA would have been on either side.
    assert big_old.bandwidth_bytes_per_s < cluster.link_between(0, 4).bandwidth_bytes_per_s


def test_links_are_symmetric(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, THREE_GROUPS)
    for rank_a, rank_b in [(0, 3), (0, 4), (3, 8), (8, 14), (0, 15), (14, 15)]:
        assert cluster.link_between(rank_a, rank_b) == cluster.link_between(rank_b, rank_a)


def test_a_rank_has_no_link_to_itself(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, THREE_GROUPS)
    with pytest.raises(ValueError, match="rank 5"):
        cluster.link_between(5, 5)


def test_ethernet_nics_run_at_their_nic_rate(tmp_path: Path) -> None:
    # ranks: ws-0 0-1, ws-1 2-3, fast-0 4, ib-0 5, plain-0 6, plain-1 7
    cluster = load_text(tmp_path, ETHERNET_ONLY)
    ws_ws = cluster.link_between(1, 2)
    assert ws_ws.kind is LinkKind.ETHERNET
    assert ws_ws.bandwidth_bytes_per_s == pytest.approx(25 * GBIT_S)  # NIC, not the 10Gb/s default
    ws_fast = cluster.link_between(0, 4)
    assert ws_fast.kind is LinkKind.ETHERNET
    assert ws_fast.bandwidth_bytes_per_s == pytest.approx(25 * GBIT_S)  # min(25, 100)
    fast_ib = cluster.link_between(4, 5)  # fast NIC 100Gb/s, ib node's ethernet 50Gb/s
    assert fast_ib.kind is LinkKind.ETHERNET
    assert fast_ib.bandwidth_bytes_per_s == pytest.approx(50 * GBIT_S)
    plain = cluster.link_between(6, 7)  # no nic, no ethernet: the 10Gb/s default
    assert plain.kind is LinkKind.ETHERNET
    assert plain.bandwidth_bytes_per_s == pytest.approx(10 * GBIT_S)


def test_explicit_nic_latency_is_kept(tmp_path: Path) -> None:
    cluster = load_text(
        tmp_path,
        """\
name: lat
nodes:
  - {name: a, count: 2, gpu: H100-SXM, gpus_per_node: 1,
     nic: {kind: infiniband, bandwidth: 400Gb/s, latency: 3us}}
""",
    )
    assert cluster.node_groups[0].nic.latency_s == pytest.approx(3e-6)
    assert cluster.link_between(0, 1).latency_s == pytest.approx(3e-6)


def test_different_sites_use_the_site_link_capped_by_ethernet(tmp_path: Path) -> None:
    # ranks: a-0 0, a-1 1 (dc1), b-0 2 (dc2), c-0 3 (dc3)
    cluster = load_text(tmp_path, THREE_SITES)
    assert cluster.sites == ("dc1", "dc2", "dc3")

    inside = cluster.link_between(0, 1)  # same site: RDMA as usual
    assert inside.kind is LinkKind.RDMA
    assert inside.bandwidth_bytes_per_s == pytest.approx(400 * GBIT_S)

    dc1_dc2 = cluster.link_between(0, 2)  # site 10Gb/s < ethernet min(100, 25)
    assert dc1_dc2.kind is LinkKind.SITE
    assert dc1_dc2.bandwidth_bytes_per_s == pytest.approx(10 * GBIT_S)
    assert dc1_dc2.latency_s == pytest.approx(0.015)

    dc2_dc3 = cluster.link_between(2, 3)  # site 100Gb/s, capped by b's 25Gb/s ethernet
    assert dc2_dc3.kind is LinkKind.SITE
    assert dc2_dc3.bandwidth_bytes_per_s == pytest.approx(25 * GBIT_S)
    assert dc2_dc3.latency_s == pytest.approx(0.002)

    dc3_dc1 = cluster.link_between(3, 1)  # listed as [dc3, dc1]; order does not matter
    assert dc3_dc1.kind is LinkKind.SITE
    assert dc3_dc1.bandwidth_bytes_per_s == pytest.approx(40 * GBIT_S)
    assert dc3_dc1.latency_s == pytest.approx(0.030)
    assert cluster.site_link("dc1", "dc3") == cluster.site_link("dc3", "dc1")


# --- defaults and custom types -------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    cluster = load_text(
        tmp_path, "name: solo\nnodes:\n  - {name: solo, gpu: T4, gpus_per_node: 1}\n"
    )
    (group,) = cluster.node_groups
    assert group.count == 1
    assert group.ethernet_bytes_per_s == pytest.approx(10 * GBIT_S)
    assert group.site == "default"
    assert group.nic.kind is NicKind.ETHERNET
    assert group.nic.bandwidth_bytes_per_s == pytest.approx(10 * GBIT_S)
    assert [node.name for node in cluster.nodes] == ["solo-0"]
    assert cluster.sites == ("default",)
    assert cluster.site_links == ()
    assert cluster.name == "solo"


def test_custom_gpu_type_is_used_by_a_node_group(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, CUSTOM_TYPE)
    device = cluster.device_of(0)
    assert device.name == "MyGPU-24GB"
    assert device.memory_bytes == pytest.approx(24 * GIB)
    assert device.bf16_flops == pytest.approx(80e12)
    assert device.fp16_flops == pytest.approx(80e12)
    assert device.fp32_flops == pytest.approx(20e12)
    assert device.memory_bandwidth_bytes_per_s == pytest.approx(9e11)
    assert [custom.name for custom in cluster.custom_types] == ["MyGPU-24GB"]
    assert cluster.device_of(2) is builtin_catalog()["A100-80GB"]


def test_a_custom_type_may_redefine_a_catalog_name(tmp_path: Path) -> None:
    cluster = load_text(
        tmp_path,
        """\
name: redefined
gpu_types:
  - {name: A100-80GB, memory: 40GiB, bf16_tflops: 100, fp32_tflops: 10, memory_bandwidth: 1TB/s}
nodes:
  - {name: a, gpu: A100-80GB, gpus_per_node: 1}
""",
    )
    device = cluster.device_of(0)
    assert device.memory_bytes == pytest.approx(40 * GIB)  # not the catalog's 80GiB
    assert device.bf16_flops == pytest.approx(100e12)
    assert device.fp16_flops == 0  # omitted: no fp16
    assert device.memory_bandwidth_bytes_per_s == pytest.approx(1e12)
    # The built-in catalog itself is untouched.
    assert builtin_catalog()["A100-80GB"].memory_bytes == pytest.approx(80 * GIB)


def test_hosts_name_each_node_in_file_order(tmp_path: Path) -> None:
    cluster = load_text(tmp_path, NAMED_HOSTS)
    assert [(node.name, node.host) for node in cluster.nodes] == [
        ("a100-0", "gpu-07.lab"),
        ("a100-1", "gpu-03.lab"),
        ("t4-0", "old_box-1"),
    ]
    assert all(node.host is None for node in load_text(tmp_path, THREE_GROUPS).nodes)


# --- round trip ----------------------------------------------------------------------------


def _assert_same_device(actual: DeviceType, expected: DeviceType) -> None:
    assert actual.name == expected.name
    assert actual.memory_bytes == expected.memory_bytes
    assert actual.memory_bandwidth_bytes_per_s == expected.memory_bandwidth_bytes_per_s
    # TFLOP/s are written as flops / 1e12 and read back times 1e12: rounding may differ.
    assert actual.bf16_flops == pytest.approx(expected.bf16_flops, rel=1e-12)
    assert actual.fp16_flops == pytest.approx(expected.fp16_flops, rel=1e-12)
    assert actual.fp32_flops == pytest.approx(expected.fp32_flops, rel=1e-12)


def _assert_same_cluster(actual: ClusterSpec, expected: ClusterSpec) -> None:
    assert actual.name == expected.name
    assert actual.site_links == expected.site_links
    assert len(actual.custom_types) == len(expected.custom_types)
    for got, want in zip(actual.custom_types, expected.custom_types, strict=True):
        _assert_same_device(got, want)
    assert len(actual.node_groups) == len(expected.node_groups)
    for got, want in zip(actual.node_groups, expected.node_groups, strict=True):
        _assert_same_device(got.device, want.device)
        assert got.name == want.name
        assert got.count == want.count
        assert got.gpus_per_node == want.gpus_per_node
        assert got.intra_link_bytes_per_s == want.intra_link_bytes_per_s
        assert got.intra_latency_s == want.intra_latency_s
        assert got.nic == want.nic
        assert got.ethernet_bytes_per_s == want.ethernet_bytes_per_s
        assert got.site == want.site
        assert got.hosts == want.hosts
    assert actual.nodes == expected.nodes
    assert [gpu.rank for gpu in actual.gpus] == [gpu.rank for gpu in expected.gpus]


@pytest.mark.parametrize(
    "text", [THREE_GROUPS, ETHERNET_ONLY, THREE_SITES, CUSTOM_TYPE, NAMED_HOSTS]
)
def test_cluster_to_dict_round_trip(tmp_path: Path, text: str) -> None:
    cluster = load_text(tmp_path, text)
    # Through JSON, as a plan file embeds it.
    data = json.loads(json.dumps(cluster_to_dict(cluster)))
    again = parse_cluster(data, source="plan.json")
    _assert_same_cluster(again, cluster)
    if not cluster.custom_types:  # catalog devices come back as the very same objects
        assert again == cluster


def test_example_round_trips() -> None:
    cluster = load_cluster(example_path())
    _assert_same_cluster(parse_cluster(cluster_to_dict(cluster), source="again"), cluster)


# --- catalog and training dtype ------------------------------------------------------------

CATALOG_NAMES = [
    "H200",
    "H100-SXM",
    "H100-PCIe",
    "A100-80GB",
    "A100-40GB",
    "L40S",
    "A6000",
    "A10G",
    "L4",
    "T4",
    "V100-32GB",
    "V100-16GB",
    "P100",
    "P40",
    "RTX-4090",
    "RTX-3090",
    "MI250X",
    "MI300X",
]


def test_builtin_catalog_has_the_common_gpus() -> None:
    catalog = builtin_catalog()
    missing = [name for name in CATALOG_NAMES if name not in catalog]
    assert missing == []
    for name, device in catalog.items():
        assert device.name == name
        assert device.memory_bytes > 0
        assert device.fp32_flops > 0
        assert device.memory_bandwidth_bytes_per_s > 0


@pytest.mark.parametrize("name", ["T4", "V100-32GB", "V100-16GB", "P100"])
def test_devices_without_bf16_train_in_fp16(name: str) -> None:
    device = builtin_catalog()[name]
    assert not device.bf16_supported
    assert device.training_dtype(Dtype.BF16) is Dtype.FP16
    assert device.training_dtype(Dtype.FP16) is Dtype.FP16
    assert device.training_peak_flops(Dtype.BF16) == device.fp16_flops


def test_p40_trains_in_fp32_because_its_fp16_is_slower() -> None:
    p40 = builtin_catalog()["P40"]
    assert p40.fp16_flops < p40.fp32_flops
    assert p40.training_dtype(Dtype.BF16) is Dtype.FP32
    assert p40.training_dtype(Dtype.FP16) is Dtype.FP32
    assert p40.training_peak_flops(Dtype.BF16) == pytest.approx(12e12)


@pytest.mark.parametrize("name", ["H100-SXM", "A100-80GB", "MI300X", "RTX-4090"])
def test_bf16_devices_train_in_bf16(name: str) -> None:
    device = builtin_catalog()[name]
    assert device.training_dtype(Dtype.BF16) is Dtype.BF16
    assert device.training_dtype(Dtype.FP32) is Dtype.FP32


@pytest.mark.parametrize("name", CATALOG_NAMES)
def test_fp32_requested_is_fp32_everywhere(name: str) -> None:
    assert builtin_catalog()[name].training_dtype(Dtype.FP32) is Dtype.FP32


def test_dtype_sizes() -> None:
    assert Dtype.BF16.num_bytes == 2
    assert Dtype.FP16.num_bytes == 2
    assert Dtype.FP32.num_bytes == 4


# --- the shipped example -------------------------------------------------------------------


def test_example_cluster_loads() -> None:
    cluster = load_cluster(example_path())
    assert cluster.name == "lab-mix"
    assert cluster.num_gpus == 6
    assert [node.name for node in cluster.nodes] == ["a100-0", "v100-0", "ws-0"]
    assert [custom.name for custom in cluster.custom_types] == ["MyGPU-24GB"]
    # a100 (IB 200Gb/s) <-> v100 (IB 100Gb/s): RDMA at 100Gb/s.
    rdma = cluster.link_between(0, 2)
    assert rdma.kind is LinkKind.RDMA
    assert rdma.bandwidth_bytes_per_s == pytest.approx(100 * GBIT_S)
    # v100 (ethernet 25Gb/s) <-> ws (Ethernet NIC 25Gb/s): Ethernet at 25Gb/s.
    eth = cluster.link_between(2, 4)
    assert eth.kind is LinkKind.ETHERNET
    assert eth.bandwidth_bytes_per_s == pytest.approx(25 * GBIT_S)
    # bf16 job: A100 2 x 312, V100 in fp16 2 x 125, MyGPU 2 x 80 TFLOP/s.
    assert cluster.total_peak_flops(Dtype.BF16) == pytest.approx((624 + 250 + 160) * 1e12)
    assert cluster.total_memory_bytes == pytest.approx((160 + 64 + 48) * GIB)


def test_a_custom_type_may_give_its_measured_efficiencies(tmp_path: Path) -> None:
    """Measured GEMM and attention fractions, per dtype, are kept, round-trip through a
    plan's cluster, and default (as ``piebald gpus`` marks) where not given; a fraction
    above 1 is an error naming the field."""
    text = """\
name: measured
gpu_types:
  - {name: Mine, memory: 40GiB, bf16_tflops: 100, fp32_tflops: 10, memory_bandwidth: 1TB/s,
     matmul_efficiency: 0.7, attention_efficiency: 0.4, fp32_matmul_efficiency: 0.6,
     fp32_attention_efficiency: 0.3}
  - {name: Unmeasured, memory: 40GiB, bf16_tflops: 100, fp32_tflops: 10, memory_bandwidth: 1TB/s}
nodes:
  - {name: a, gpu: Mine, gpus_per_node: 1}
  - {name: b, gpu: Unmeasured, gpus_per_node: 1}
"""
    cluster = load_text(tmp_path, text)
    mine, unmeasured = cluster.device_of(0), cluster.device_of(1)
    for dtype in (Dtype.BF16, Dtype.FP16):
        assert mine.sustained_matmul_efficiency(dtype) == 0.7
        assert mine.sustained_attention_efficiency(dtype) == 0.4
    assert mine.sustained_matmul_efficiency(Dtype.FP32) == 0.6
    assert mine.sustained_attention_efficiency(Dtype.FP32) == 0.3
    assert unmeasured.matmul_efficiency is None and unmeasured.fp32_matmul_efficiency is None
    for dtype in Dtype:
        default = DEFAULT_MATMUL_EFFICIENCY[dtype]
        assert unmeasured.sustained_matmul_efficiency(dtype) == default
        assert unmeasured.sustained_attention_efficiency(dtype) == pytest.approx(
            default * ATTENTION_SHARE_OF_MATMUL
        )
    again = parse_cluster(json.loads(json.dumps(cluster_to_dict(cluster))), source="json")
    assert again.custom_types == cluster.custom_types
    with pytest.raises(SpecError, match="matmul_efficiency"):
        load_text(tmp_path, text.replace("matmul_efficiency: 0.7", "matmul_efficiency: 1.5"))
    with pytest.raises(SpecError, match="fp32_matmul_efficiency"):
        load_text(
            tmp_path, text.replace("fp32_matmul_efficiency: 0.6", "fp32_matmul_efficiency: 0")
        )
