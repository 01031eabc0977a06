"""Emulated training on the demo cluster: measured tokens/s of the piebald plan and of the
best homogeneous baseline (Megatron-style or even ZeRO), against the planner's prediction
and the simulator (target: measured within 10% of the simulator).

The setting of ``piebald demo``: llama-3.2-1b planned for the built-in lab-mix cluster
(global batch 16 x 512), trained by one CPU process per GPU at reduced width, every
operation paced to the full model's time on its emulated GPU x TIME_SCALE. Each plan is
trained STEPS steps; measured is the median over the steps after the first.

    .venv/bin/python benchmarks/emulated_training.py [--steps 5] [--time-scale 50]
"""

from __future__ import annotations

import argparse

from piebald.cli.demo import GLOBAL_BATCH, MODEL, SEQ_LEN, TIME_SCALE, best_homogeneous
from piebald.examples import example_path
from piebald.planner.compare import compare_strategies
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.runtime.training.reduced import DEFAULT_MAX_EMULATED_PARAMS
from piebald.simulator.engine import simulate
from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan
from piebald.specs.presets import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=TIME_SCALE)
    args = parser.parse_args()
    cluster = load_cluster(example_path())
    model = load_model(MODEL)
    job = JobSpec(global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN)
    comparison = compare_strategies(cluster, model=model, job=job)
    plans: list[tuple[str, Plan]] = [
        (row.strategy, row.plan)
        for row in comparison.rows
        if row.strategy == "piebald" and row.plan is not None
    ]
    baseline = best_homogeneous(comparison)
    if baseline is not None:
        plans.append(baseline)
    print(
        f"{model.name} on {cluster.name}, global batch {GLOBAL_BATCH} x {SEQ_LEN}, "
        f"{args.steps} steps, time scale {args.time_scale:g}"
    )
    print(
        "| plan | GPUs used | predicted tokens/s | simulated | measured (emulated) | "
        "measured / simulated | measured / predicted | overruns |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, plan in plans:
        simulated = simulate(plan).tokens_per_s
        predicted = plan.predicted.tokens_per_s if plan.predicted is not None else float("nan")
        run = emulate(
            plan,
            TrainConfig(steps=args.steps, seed=0, time_scale=args.time_scale),
            max_params=DEFAULT_MAX_EMULATED_PARAMS,
            lines_to_stderr=True,
        )
        print(
            f"| {name} | {len(plan.used_ranks)} | {predicted:,.0f} | {simulated:,.0f} | "
            f"{run.tokens_per_s:,.0f} | {run.tokens_per_s / simulated:.3f} | "
            f"{run.tokens_per_s / predicted:.3f} | {run.overruns} / {run.paced_operations} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
