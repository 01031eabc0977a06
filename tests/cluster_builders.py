"""Small clusters and models shared by the tests (tests/conftest.py puts this on the path):
node groups as the cluster YAML spells them, and the round-number GPU types and small
Llama whose layer times the cost and simulator tests work out by hand."""

from __future__ import annotations

from typing import Any

from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.model import Family, ModelArch, ModelSpec

# Two slow "GPUs" on one box, as a cluster file: what the CLI and API tests plan and
# emulate on CPU processes.
CPU_LAB_YAML = """\
name: cpu-lab
gpu_types:
  - {name: cpu-a, memory: 8GiB, fp32_tflops: 0.05, memory_bandwidth: 5GB/s}
nodes:
  - {name: box, gpu: cpu-a, gpus_per_node: 2, intra_link: 2GB/s}
"""


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


# A 1 TFLOP/s (bf16) GPU type with 1 TB/s of memory bandwidth, and one at half of each.
ROUND_GPU: dict[str, Any] = {
    "name": "round",
    "memory": "100GB",
    "bf16_tflops": 1,
    "fp16_tflops": 1,
    "fp32_tflops": 0.5,
    "memory_bandwidth": "1TB/s",
}
HALF_GPU: dict[str, Any] = {
    "name": "half",
    "memory": "100GB",
    "bf16_tflops": 0.5,
    "fp16_tflops": 0.5,
    "fp32_tflops": 0.25,
    "memory_bandwidth": "0.5TB/s",
}


def hand_model(num_blocks: int) -> ModelSpec:
    """A small Llama (h = 64, 4 heads, 2 KV heads, f = 128, V = 640) whose head costs
    exactly one block at 32-token sequences (tests/unit/cost/test_plan_estimate.py)."""
    return ModelSpec(
        name="hand",
        arch=ModelArch(
            family=Family.LLAMA,
            num_blocks=num_blocks,
            hidden_size=64,
            num_heads=4,
            num_kv_heads=2,
            ffn_hidden_size=128,
            vocab_size=640,
            max_seq_len=64,
            tie_embeddings=False,
        ),
    )
