"""Planner scaling: wall time of `search` for 64, 256, 1024 and 4096 GPUs of six types.

Targets on a 2-core machine (issue 3): 1024 GPUs in under 10 s, 4096 in under 60 s.
Each size is planned REPEATS times and the median is reported, with the number of coarse
structures the DP priced and the predicted throughput of the winner.

    .venv/bin/python benchmarks/planner_scaling.py [--model llama-3-70b] [--sizes 64,256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from piebald.planner.search import Infeasible, search
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model
from scaling_clusters import TYPES, scaling_cluster

REPEATS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--sizes", default="64,256,1024,4096")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    model = load_model(args.model)
    print(
        f"model {model.name}, seq {args.seq_len}, global batch = max(512, GPUs) sequences; "
        f"GPU types: {', '.join(t[0] for t in TYPES)}"
    )
    print(
        "| GPUs | nodes | median plan time (s) | min..max (s) | structures | stages | "
        "idle GPUs | predicted tokens/s | efficiency vs bound |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        cluster = scaling_cluster(size)
        job = JobSpec(global_batch_size=max(512, size), seq_len=args.seq_len)
        times = []
        try:
            for _ in range(args.repeats):
                started = time.perf_counter()
                result = search(cluster, model=model, job=job)
                times.append(time.perf_counter() - started)
        except Infeasible as error:
            seconds = time.perf_counter() - started
            where = f"| {size} | {len(cluster.nodes)} | {seconds:.1f} (infeasible) |"
            print(f"{where} | | | | {error} | |")
            continue
        plan = result.best.plan
        tokens = result.best.estimate.tokens_per_s
        print(
            f"| {size} | {len(cluster.nodes)} | {statistics.median(times):.1f} | "
            f"{min(times):.1f}..{max(times):.1f} | {result.num_structures} | "
            f"{plan.num_stages} | {len(plan.idle_ranks)} | {tokens:,.0f} | "
            f"{tokens / result.upper_bound_tokens_per_s:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
