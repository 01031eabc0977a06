"""Fingerprints of every plan, prediction and simulated step on a fixed scenario set.

A refactor of the cost model, the search or the simulator that claims to change nothing
is checked by running this before and after and diffing the outputs: one line per
(scenario, model, strategy) with a hash of the plan file (structure, layer split,
micro-batches, shards, ZeRO, recompute, notes, runners-up), the predicted step time and
tokens/s to full float precision, and the simulated step time of piebald's plan.

    .venv/bin/python benchmarks/plan_fingerprints.py > before.txt
    (change)
    .venv/bin/python benchmarks/plan_fingerprints.py > after.txt && diff before.txt after.txt

``--quick`` keeps the scenarios that plan in seconds (for a first check while working).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from piebald.planner.compare import compare_strategies
from piebald.simulator.engine import simulate
from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan_io import plan_to_dict
from piebald.specs.presets import load_model

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "benchmarks" / "scenarios"
LAB_MIX = ROOT / "src" / "piebald" / "examples" / "lab-mix.yaml"

# (cluster file, model, global batch, seq len): the literature scenarios at the sizes the
# README's tables use, plus the demo cluster with a small model (deep pipelines, many
# micro-batch choices) and a long sequence (memory-bound choices).
QUICK = (
    (LAB_MIX, "gpt2", 64, 1024),
    (LAB_MIX, "llama-3-8b", 256, 2048),
    (SCENARIOS / "zorse.yaml", "llama-3.2-1b", 256, 2048),
    (SCENARIOS / "memory-poor-fast.yaml", "llama-2-13b", 128, 4096),
)
FULL = QUICK + tuple(
    (path, model, 256, 2048)
    for path in sorted(SCENARIOS.glob("*.yaml"))
    for model in ("llama-3-8b", "llama-2-13b")
    if (path, model, 256, 2048) not in QUICK
)


def plan_hash(plan_dict: dict[str, object]) -> str:
    text = json.dumps(plan_dict, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few fast scenarios only")
    args = parser.parse_args()
    for path, model_name, batch, seq_len in QUICK if args.quick else FULL:
        cluster = load_cluster(path)
        model = load_model(model_name)
        job = JobSpec(global_batch_size=batch, seq_len=seq_len)
        comparison = compare_strategies(cluster, model=model, job=job)
        case = f"{path.stem} {model_name} {batch}x{seq_len}"
        print(f"{case} bound={comparison.upper_bound_tokens_per_s!r}")
        for row in comparison.rows:
            if row.plan is None:
                print(f"  {row.strategy}: infeasible: {row.reason}")
                continue
            line = (
                f"  {row.strategy}: plan={plan_hash(plan_to_dict(row.plan))} "
                f"step={row.step_time_s!r} tok/s={row.tokens_per_s!r}"
            )
            if row.strategy == "piebald":
                line += f" simulated={simulate(row.plan, record=False).step_time_s!r}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
