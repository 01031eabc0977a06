"""Planner-predicted against simulated step time on the literature scenarios.

For each scenario (benchmarks/scenarios/*.yaml) and model, plans with piebald's search,
simulates the chosen plan event by event, and prints a markdown table: predicted and
simulated step time, their difference, the simulated bubble, and whether the simulated
peak memory stays within the estimate on every rank.

Two more columns take the plan's differences from the estimate apart:

- "steady in-flight": the same plan with the in-flight budget a 1F1B pipeline needs to run
  without waiting on memory (``steady_in_flight``: Little's law, the rank's share of its
  stage's micro-batches times the ranks of this and every later stage), the budget the
  estimate's step time implicitly assumes;
- "+ free transfers": that, with every activation/gradient transfer free, leaving compute,
  ZeRO traffic and collectives: what remains is the schedule against the closed form.

    .venv/bin/python benchmarks/simulate_scenarios.py [--models llama-3-8b,llama-2-13b]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from piebald.planner.search import Infeasible, search
from piebald.simulator.engine import simulate
from piebald.simulator.prices import Prices, Transfer
from piebald.specs.cluster import Link, LinkKind
from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan
from piebald.specs.presets import load_model

SCENARIOS = Path(__file__).parent / "scenarios"


def steady_in_flight(plan: Plan, rank: int) -> int:
    """Micro-batches rank r of stage s holds in a 1F1B steady state (Little's law): it
    starts n_r of N per step and holds each while it visits one rank of every stage
    s..p-1 and comes back, about sum over those stages of (step / per-rank count), so
    n_r / N x (ranks of stages s..p-1 that compute), at least 1, at most n_r."""
    s = plan.stage_of_rank[rank]
    stage = plan.stages[s]
    count = stage.num_micro_batches[stage.ranks.index(rank)]
    total = sum(stage.num_micro_batches)
    ranks_below = sum(sum(1 for c in later.num_micro_batches if c) for later in plan.stages[s:])
    return min(count, max(1, math.ceil(count * ranks_below / total)))


class SteadyPrices(Prices):
    """The plan's prices with the steady-state in-flight budget instead of the estimate's."""

    def in_flight_limit(self, rank: int) -> int:
        return max(super().in_flight_limit(rank), steady_in_flight(self.plan, rank))


class FreeTransferPrices(SteadyPrices):
    """Steady in-flight budget, and transfers that cost nothing."""

    def transfer(self, sender: int, receiver: int) -> Transfer:
        free = Link(kind=LinkKind.INTRA_NODE, bandwidth_bytes_per_s=math.inf, latency_s=0.0)
        return Transfer(num_bytes=0.0, link=free, resources=())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3-8b,llama-2-13b")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--scenarios", default="", help="comma-separated names; default all")
    args = parser.parse_args()
    names = (
        args.scenarios.split(",")
        if args.scenarios
        else sorted(p.stem for p in SCENARIOS.glob("*.yaml"))
    )
    job = JobSpec(global_batch_size=args.global_batch, seq_len=args.seq_len)
    print(
        f"global batch {job.global_batch_size} x {job.seq_len} tokens; piebald's plan for each "
        "scenario and model, simulated"
    )
    print(
        "| scenario | model | GPUs used | stages | schedule | predicted step (s) | "
        "simulated (s) | sim / pred | bubble | memory within estimate | "
        "steady in-flight (s) | sim / pred | + free transfers (s) | sim / pred | "
        "simulate time (s) |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for name in names:
        cluster = load_cluster(SCENARIOS / f"{name}.yaml")
        for model_name in args.models.split(","):
            model = load_model(model_name)
            try:
                result = search(cluster, model=model, job=job)
            except Infeasible:
                print(f"| {name} | {model.name} | does not fit |" + " |" * 12)
                continue
            plan = result.best.plan
            predicted = result.best.estimate
            started = time.perf_counter()
            sim = simulate(plan, record=False)
            elapsed = time.perf_counter() - started
            peaks = predicted.prediction().peak_memory_bytes
            within = all(
                stats.peak_memory_bytes <= peaks[stats.rank] * (1 + 1e-9) for stats in sim.ranks
            )
            steady = simulate(plan, prices=SteadyPrices(plan), record=False)
            free = simulate(plan, prices=FreeTransferPrices(plan), record=False)
            print(
                f"| {name} | {model.name} | {len(plan.used_ranks)} | {plan.num_stages} | "
                f"{plan.schedule.value} | {predicted.step_time_s:.3f} | {sim.step_time_s:.3f} | "
                f"{sim.step_time_s / predicted.step_time_s:.3f} | {sim.bubble_fraction:.1%} | "
                f"{'yes' if within else 'NO'} | {steady.step_time_s:.3f} | "
                f"{steady.step_time_s / predicted.step_time_s:.3f} | {free.step_time_s:.3f} | "
                f"{free.step_time_s / predicted.step_time_s:.3f} | {elapsed:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
