"""Simulator scaling: wall time to simulate one step of piebald's plan for 64 to 1024 GPUs.

Target on a 2-core machine: a 1024-GPU plan in under 30 s. The clusters and jobs
are those of benchmarks/planner_scaling.py (six GPU types, global batch max(512, GPUs)
sequences); each plan is made by ``search`` (not timed here), then simulated REPEATS times
with the timeline recorded (what ``piebald simulate --trace/--gantt`` needs) and once
without. Prints a markdown table.

    .venv/bin/python benchmarks/simulator_scaling.py [--model llama-3-70b] [--sizes 64,1024]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from piebald.planner.search import Infeasible, search
from piebald.schedule.build import build_schedule
from piebald.simulator.engine import simulate
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model
from scaling_clusters import scaling_cluster

REPEATS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    model = load_model(args.model)
    print(f"model {model.name}, seq {args.seq_len}, global batch = max(512, GPUs) sequences")
    print(
        "| GPUs | stages | micro-batches | operations | plan time (s) | simulate, median (s) | "
        "without timeline (s) | simulated step (s) | predicted step (s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        cluster = scaling_cluster(size)
        job = JobSpec(global_batch_size=max(512, size), seq_len=args.seq_len)
        started = time.perf_counter()
        try:
            result = search(cluster, model=model, job=job)
        except Infeasible as error:  # a size the model does not fit: a row, not a traceback
            print(f"| {size} | infeasible: {error} | | | | | | | |", flush=True)
            continue
        plan_s = time.perf_counter() - started
        plan = result.best.plan
        num_ops = sum(len(ops) for ops in build_schedule(plan).rank_ops.values())
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            sim = simulate(plan)
            times.append(time.perf_counter() - started)
        started = time.perf_counter()
        simulate(plan, record=False)
        bare_s = time.perf_counter() - started
        print(
            f"| {size} | {plan.num_stages} | {len(plan.routes)} | {num_ops:,} | {plan_s:.1f} | "
            f"{statistics.median(times):.2f} | {bare_s:.2f} | {sim.step_time_s:.2f} | "
            f"{result.best.estimate.step_time_s:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
