"""Synthetic clusters of N GPUs of six types for the planner-scaling benchmark.

One mapping, :func:`scaling_cluster_data` (the fields of a cluster YAML file), is the
source of both forms: :func:`scaling_cluster` parses it into a ClusterSpec and
:func:`scaling_cluster_yaml` writes it as a file for ``piebald plan --cluster``.
"""

from __future__ import annotations

from typing import Any

import yaml

from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster

__all__ = ["TYPES", "scaling_cluster", "scaling_cluster_data", "scaling_cluster_yaml"]

# (GPU type, intra-node link, NIC kind, NIC bandwidth): six generations, three NIC classes.
TYPES = (
    ("H100-SXM", "900GB/s", "infiniband", "400Gb/s"),
    ("A100-80GB", "600GB/s", "infiniband", "200Gb/s"),
    ("A100-40GB", "600GB/s", "roce", "100Gb/s"),
    ("L40S", "32GB/s", "roce", "100Gb/s"),
    ("V100-32GB", "300GB/s", "infiniband", "100Gb/s"),
    ("A10G", "32GB/s", "ethernet", "50Gb/s"),
)


def scaling_cluster_data(num_gpus: int, *, gpus_per_node: int = 8) -> dict[str, Any]:
    """The cluster file's fields: ``num_gpus`` GPUs in nodes of ``gpus_per_node``, spread
    as evenly as possible over TYPES (the first types take one node more)."""
    num_nodes = num_gpus // gpus_per_node
    if num_nodes * gpus_per_node != num_gpus or num_nodes < len(TYPES):
        raise ValueError(f"{num_gpus} GPUs do not make >= {len(TYPES)} nodes of {gpus_per_node}")
    base, extra = divmod(num_nodes, len(TYPES))
    nodes: list[dict[str, Any]] = []
    for index, (gpu, intra, nic, bandwidth) in enumerate(TYPES):
        nodes.append(
            {
                "name": gpu.lower().replace("-", ""),
                "count": base + (index < extra),
                "gpu": gpu,
                "gpus_per_node": gpus_per_node,
                "intra_link": intra,
                "nic": {"kind": nic, "bandwidth": bandwidth},
                "ethernet": "25Gb/s",
            }
        )
    return {"name": f"scaling-{num_gpus}", "nodes": nodes}


def scaling_cluster(num_gpus: int, *, gpus_per_node: int = 8) -> ClusterSpec:
    """The synthetic cluster of :func:`scaling_cluster_data`, parsed."""
    data = scaling_cluster_data(num_gpus, gpus_per_node=gpus_per_node)
    return parse_cluster(data, source="scaling")


def scaling_cluster_yaml(num_gpus: int, *, gpus_per_node: int = 8) -> str:
    """The synthetic cluster of :func:`scaling_cluster_data` as cluster-file text, one
    node group a line."""
    data = scaling_cluster_data(num_gpus, gpus_per_node=gpus_per_node)
    lines = [
        f"# Synthetic: {num_gpus} GPUs of six types in nodes of {gpus_per_node} "
        "(benchmarks/scaling_clusters.py).",
        f"name: {data['name']}",
        "nodes:",
    ]
    for group in data["nodes"]:
        flow = yaml.safe_dump(group, default_flow_style=True, sort_keys=False, width=10**6)
        lines.append(f"  - {flow.strip()}")
    return "\n".join(lines) + "\n"
