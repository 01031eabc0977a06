"""Small cluster builders shared by the planner tests (tests/conftest.py puts this on the path)."""

from __future__ import annotations

from typing import Any

from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster


def group(
    name: str,
    gpu: str,
    gpus_per_node: int,
    *,
    count: int = 1,
    intra: str = "64GB/s",
    nic: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One node group as the cluster YAML spells it."""
    spec: dict[str, Any] = {
        "name": name,
        "gpu": gpu,
        "gpus_per_node": gpus_per_node,
        "count": count,
        "intra_link": intra,
    }
    if nic is not None:
        spec["nic"] = {"kind": nic[0], "bandwidth": nic[1]}
    return spec


def cluster(name: str, *groups: dict[str, Any]) -> ClusterSpec:
    return parse_cluster({"name": name, "nodes": list(groups)}, source=f"test:{name}")
