"""Planning time on many one-GPU nodes (a cluster a hostile user tried): 1,024 to 32,768 nodes.

A unit of the search is a run of identical nodes (``planner.search_units``), so thousands of
one-GPU nodes plan about as fast as a few hundred eight-GPU ones. Two shapes: one node
group of N one-GPU H100 nodes (the default), or ``--mixed``: N one-GPU nodes spread over
the six GPU types of ``planner_scaling.py``. ``--one-group-per-node`` lists every node as
its own group (what a generated cluster file may do); identical groups plan as one.
Prints wall and CPU seconds (the machine may be shared), predicted tokens/s and stages.

    .venv/bin/python benchmarks/many_small_nodes.py [--sizes 1024,4096,8192] [--mixed]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from piebald.planner.search import search
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model
from scaling_clusters import scaling_cluster


def one_gpu_nodes(num_nodes: int, *, one_group_per_node: bool) -> ClusterSpec:
    """``num_nodes`` one-GPU H100 nodes on InfiniBand, counted or listed one by one."""
    node = {
        "gpu": "H100-SXM",
        "gpus_per_node": 1,
        "intra_link": "900GB/s",
        "nic": {"kind": "infiniband", "bandwidth": "400Gb/s"},
        "ethernet": "25Gb/s",
    }
    groups: list[dict[str, Any]]
    if one_group_per_node:
        groups = [{"name": f"h{i}", "count": 1, **node} for i in range(num_nodes)]
    else:
        groups = [{"name": "h100", "count": num_nodes, **node}]
    return parse_cluster({"name": f"small-nodes-{num_nodes}", "nodes": groups}, source="bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--sizes", default="1024,4096,8192")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--mixed", action="store_true", help="six GPU types, not one")
    parser.add_argument("--one-group-per-node", action="store_true")
    args = parser.parse_args()
    model = load_model(args.model)
    shape = "six GPU types" if args.mixed else "H100-SXM"
    if args.one_group_per_node:
        shape += ", one group per node"
    print(
        f"model {model.name}, seq {args.seq_len}, global batch = max(512, GPUs) sequences; "
        f"one GPU per node ({shape})"
    )
    print("| nodes | GPUs | plan time (s) | CPU (s) | structures | stages | idle GPUs | tokens/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        if args.mixed:
            cluster = scaling_cluster(size, gpus_per_node=1)
        else:
            cluster = one_gpu_nodes(size, one_group_per_node=args.one_group_per_node)
        job = JobSpec(global_batch_size=max(512, size), seq_len=args.seq_len)
        started, cpu = time.perf_counter(), time.process_time()
        result = search(cluster, model=model, job=job)
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        plan = result.best.plan
        print(
            f"| {len(cluster.nodes)} | {cluster.num_gpus} | {wall_s:.1f} | {cpu_s:.1f} | "
            f"{result.num_structures} | {plan.num_stages} | {len(plan.idle_ranks)} | "
            f"{result.best.estimate.tokens_per_s:,.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
