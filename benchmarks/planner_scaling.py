"""Planner scaling: wall time of `search` for 64, 256, 1024 and 4096 GPUs of six types.

Targets on a 2-core machine: 1024 GPUs in under 10 s, 4096 in under 60 s.
Each size is planned REPEATS times and the median is reported, with the number of coarse
structures the DP priced and the predicted throughput of the winner.

    .venv/bin/python benchmarks/planner_scaling.py [--model llama-3-70b] [--sizes 64,256]

``--cluster FILE`` plans one cluster file instead of the synthetic sizes (the big
1,024-GPU two-site cluster: ``benchmarks/clusters/six-type-1024.yaml`` with
``--global-batch 2048``) and prints the chosen structure stage by stage. ``--workers N``
limits the processes a search uses (default: every core; the plans are the same).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from piebald.planner.search import Infeasible, SearchResult, search
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.presets import load_model
from scaling_clusters import TYPES, scaling_cluster

REPEATS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--sizes", default="64,256,1024,4096")
    parser.add_argument("--cluster", type=Path, help="a cluster file instead of --sizes")
    parser.add_argument("--global-batch", type=int, help="default: max(512, GPUs) sequences")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument(
        "--workers", type=int, help="processes the search may use; default: every core"
    )
    args = parser.parse_args()
    model = load_model(args.model)
    if args.cluster is not None:
        clusters = [load_cluster(args.cluster)]
        kinds = sorted({gpu.device.name for gpu in clusters[0].gpus})
    else:
        clusters = [scaling_cluster(int(size)) for size in args.sizes.split(",")]
        kinds = [t[0] for t in TYPES]
    batch = "max(512, GPUs)" if args.global_batch is None else str(args.global_batch)
    print(
        f"model {model.name}, seq {args.seq_len}, global batch {batch} sequences; "
        f"GPU types: {', '.join(kinds)}"
    )
    print(
        "| GPUs | nodes | median plan time (s) | min..max (s) | structures | stages | "
        "idle GPUs | predicted tokens/s | efficiency vs bound |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    results = [_plan(cluster, model=model, args=args) for cluster in clusters]
    if args.cluster is not None and results[0] is not None:
        _print_structure(results[0])


def _plan(
    cluster: ClusterSpec, *, model: ModelSpec, args: argparse.Namespace
) -> SearchResult | None:
    size = cluster.num_gpus
    job = JobSpec(global_batch_size=args.global_batch or max(512, size), seq_len=args.seq_len)
    times = []
    started = time.perf_counter()
    try:
        for _ in range(args.repeats):
            started = time.perf_counter()
            result = search(cluster, model=model, job=job, workers=args.workers)
            times.append(time.perf_counter() - started)
    except Infeasible as error:
        seconds = time.perf_counter() - started
        print(f"| {size} | {len(cluster.nodes)} | {seconds:.1f} (infeasible) | | | | {error} | |")
        return None
    plan = result.best.plan
    tokens = result.best.estimate.tokens_per_s
    print(
        f"| {size} | {len(cluster.nodes)} | {statistics.median(times):.1f} | "
        f"{min(times):.1f}..{max(times):.1f} | {result.num_structures} | "
        f"{plan.num_stages} | {len(plan.idle_ranks)} | {tokens:,.0f} | "
        f"{tokens / result.upper_bound_tokens_per_s:.2f} |",
        flush=True,
    )
    return result


def _print_structure(result: SearchResult) -> None:
    """The winner stage by stage, and the GPU types it leaves idle."""
    plan = result.best.plan
    cluster = plan.cluster
    print("\n| stage | layers | GPUs | TP | ZeRO | recompute | micro-batches per group |")
    print("|---:|---|---|---:|---|---|---:|")
    for index, stage in enumerate(plan.stages):
        kinds = Counter(cluster.device_of(rank).name for rank in stage.ranks)
        gpus = ", ".join(f"{count} {name}" for name, count in kinds.items())
        print(
            f"| {index} | {stage.layer_start}-{stage.layer_end - 1} | {gpus} | "
            f"{stage.tensor_parallel_degree} | {stage.zero.value} | "
            f"{stage.recompute.value} | {max(stage.num_micro_batches)} |"
        )
    idle = Counter(cluster.device_of(rank).name for rank in plan.idle_ranks)
    print("\nidle:", ", ".join(f"{count} {name}" for name, count in idle.items()) or "none")
    for note in plan.notes[1:]:
        print("note:", note if len(note) < 300 else note[:120] + " ... " + note[-80:])


if __name__ == "__main__":
    main()
