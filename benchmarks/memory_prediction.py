"""Measured against predicted memory on random plans: for each of the first 30 random plans
of ``tests/distributed/memory_cases.py`` (1-4 stages, every ZeRO mode, every recompute mode,
GPipe and 1F1B, uneven shards, bf16 and fp16 GPUs), one unpaced emulated step in the GPUs'
own dtypes, and every rank's measured peak of live tensor bytes beside ``predicted_bytes``
(the memory model's peak for the micro-batches the rank's schedule holds and this backend's
collectives, ``rank_worker.predicted_tensor_bytes``); then the distribution of the ratios.
``tests/distributed/test_memory_prediction.py`` requires each within [0.75, 1.05].

    .venv/bin/python benchmarks/memory_prediction.py [--plans 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.runtime.training.precision import ComputeDtype

# The random plans live beside the test harness that builds them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "distributed"))
from memory_cases import random_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=30)
    args = parser.parse_args()
    print(
        "| seed | rank | GPU | stage | ZeRO | recompute | schedule | seq | measured | "
        "predicted | ratio |"
    )
    print("|---:|---:|---|---|---|---|---|---:|---:|---:|---:|")
    ratios: list[float] = []
    for seed in range(args.plans):
        plan = random_plan(random.Random(seed))
        config = TrainConfig(
            steps=1,
            seed=seed,
            optimizer=OptimizerConfig(lr=1e-3),
            compute_dtype=ComputeDtype.NATIVE,
        )
        run = emulate(plan, config, max_params=10**9, lines_to_stderr=True)
        for rank_text, sizes in sorted(run.memory.items(), key=lambda item: int(item[0])):
            rank = int(rank_text)
            index = plan.stage_of_rank[rank]
            stage = plan.stages[index]
            ratio = sizes["measured_bytes"] / sizes["predicted_bytes"]
            ratios.append(ratio)
            print(
                f"| {seed} | {rank} | {plan.cluster.device_of(rank).name} | "
                f"{index + 1}/{plan.num_stages} | {stage.zero.value} | {stage.recompute} | "
                f"{plan.schedule.value} | {plan.job.seq_len} | "
                f"{sizes['measured_bytes'] / 2**10:.0f} KiB | "
                f"{sizes['predicted_bytes'] / 2**10:.0f} KiB | {ratio:.2f} |",
                flush=True,
            )
    inside = sum(0.75 <= r <= 1.05 for r in ratios)
    print(
        f"\n{len(ratios)} ranks: measured / predicted median {statistics.median(ratios):.2f}, "
        f"min {min(ratios):.2f}, max {max(ratios):.2f}; {inside} within [0.75, 1.05]"
    )


if __name__ == "__main__":
    main()
