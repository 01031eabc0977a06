"""Measured against predicted memory per ZeRO mode: the runtime's memory meter (peak bytes of
live tensors per rank) beside the plan's prediction without the framework reserve.

For each ZeRO mode, ``piebald plan --strategy zero-even --zero MODE`` (one data-parallel
stage over all four GPUs, even shards) on a cluster of two A100s in bf16 and two V100s in
fp16, so the stage mixes dtypes; then two unpaced emulated steps
in the GPUs' own dtypes (``--compute-dtype native``) on CPU processes. The model is small
enough to run at full width, so measured and predicted describe the same tensors.

    .venv/bin/python benchmarks/memory_by_zero.py [--model tiny] [--global-batch 8]
"""

from __future__ import annotations

import argparse

from piebald.planner.search import search
from piebald.planner.strategies import STRATEGIES
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.runtime.training.precision import ComputeDtype
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.presets import load_model

ZERO_EVEN = STRATEGIES["zero-even"]
CLUSTER = {
    "name": "four-mixed",
    "nodes": [
        {"name": "a", "gpu": "A100-80GB", "gpus_per_node": 2, "intra_link": "300GB/s"},
        {"name": "v", "gpu": "V100-32GB", "gpus_per_node": 2, "intra_link": "300GB/s"},
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    cluster = parse_cluster(CLUSTER, source="memory_by_zero")
    model = load_model(args.model)
    job = JobSpec(global_batch_size=args.global_batch, seq_len=args.seq_len)
    print(
        f"{model.name} on {cluster.name} (2x A100 bf16, 2x V100 fp16), batch "
        f"{job.global_batch_size} x {job.seq_len}, 2 unpaced steps, native dtypes\n"
    )
    print(
        "| ZeRO mode | stages | rank | GPU | measured (MiB) | predicted (MiB) | "
        "measured / predicted |"
    )
    print("|---|---:|---:|---|---:|---:|---:|")
    config = TrainConfig(steps=2, seed=0, compute_dtype=ComputeDtype.NATIVE)
    for zero in ZeroMode:
        plan = search(cluster, model=model, job=job, strategy=ZERO_EVEN, zero=zero).best.plan
        run = emulate(plan, config, max_params=10**12, lines_to_stderr=True)
        for rank_text, sizes in sorted(run.memory.items(), key=lambda item: int(item[0])):
            rank = int(rank_text)
            measured, predicted = sizes["measured_bytes"], sizes["predicted_bytes"]
            print(
                f"| {zero.value} | {plan.num_stages} | {rank} | "
                f"{cluster.device_of(rank).name} | {measured / 2**20:.2f} | "
                f"{predicted / 2**20:.2f} | {measured / predicted:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
