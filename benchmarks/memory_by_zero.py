"""Measured against predicted memory per ZeRO mode: the runtime's memory meter (peak bytes of
live tensors per rank) beside the plan's prediction without the framework reserve.

Two cases, each planned with ``piebald plan --strategy zero-even --zero MODE`` (one
data-parallel stage over all four GPUs, even shards) and trained for two unpaced emulated
steps in the GPUs' own dtypes (``--compute-dtype native``) on CPU processes, at full width,
so measured and predicted describe the same tensors:

* ``tiny`` on two A100s (bf16) and two V100s (fp16), 2 sequences of 128 tokens per rank:
  activations dominate and the stage mixes dtypes (an fp32 wire);
* a 3.2 M-parameter Llama (width 256, 4 blocks, vocabulary 512) on four A100s, one
  sequence of 64 tokens per rank: the training state dominates.

    .venv/bin/python benchmarks/memory_by_zero.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from piebald.planner.search import search
from piebald.planner.strategies import STRATEGIES
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.runtime.training.precision import ComputeDtype
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.presets import load_model

# The state-heavy case is shared with the test that checks ZeRO-3 against it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "distributed"))
from memory_cases import FOUR_A100, STATE_HEAVY

ZERO_EVEN = STRATEGIES["zero-even"]
MIXED: dict[str, Any] = {
    "name": "four-mixed",
    "nodes": [
        {"name": "a", "gpu": "A100-80GB", "gpus_per_node": 2, "intra_link": "300GB/s"},
        {"name": "v", "gpu": "V100-32GB", "gpus_per_node": 2, "intra_link": "300GB/s"},
    ],
}
CASES = (
    (
        load_model("tiny"),
        parse_cluster(MIXED, source="memory_by_zero"),
        JobSpec(global_batch_size=8, seq_len=128),
    ),
    (STATE_HEAVY, FOUR_A100, JobSpec(global_batch_size=4, seq_len=64)),
)


def main() -> None:
    print(
        "| model | cluster | batch | ZeRO mode | rank | GPU | measured (MiB) | "
        "predicted (MiB) | measured / predicted |"
    )
    print("|---|---|---|---|---:|---|---:|---:|---:|")
    config = TrainConfig(steps=2, seed=0, compute_dtype=ComputeDtype.NATIVE)
    for model, cluster, job in CASES:
        for zero in ZeroMode:
            plan = search(cluster, model=model, job=job, strategy=ZERO_EVEN, zero=zero).best.plan
            run = emulate(plan, config, max_params=10**12, lines_to_stderr=True)
            for rank_text, sizes in sorted(run.memory.items(), key=lambda item: int(item[0])):
                rank = int(rank_text)
                measured, predicted = sizes["measured_bytes"], sizes["predicted_bytes"]
                print(
                    f"| {model.name} | {cluster.name} | {job.global_batch_size} x "
                    f"{job.seq_len} | {zero.value} | {rank} | {cluster.device_of(rank).name} "
                    f"| {measured / 2**20:.2f} | {predicted / 2**20:.2f} | "
                    f"{measured / predicted:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
