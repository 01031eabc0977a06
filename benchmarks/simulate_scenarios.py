"""Planner-predicted against simulated step time on the literature scenarios.

For each scenario (benchmarks/scenarios/*.yaml) and model, plans with piebald's search,
simulates the chosen plan event by event, and prints a markdown table: predicted and
simulated step time, their difference, the simulated bubble, and whether the simulated
peak memory stays within the estimate on every rank.

One more column takes the difference apart: "free transfers" simulates the same plan with
every activation/gradient transfer free, leaving compute, ZeRO traffic and collectives:
what remains against the prediction is the schedule against the closed form.

    .venv/bin/python benchmarks/simulate_scenarios.py [--models llama-3-8b,llama-2-13b]
"""

from __future__ import annotations

import math
import time

from piebald.planner.search import Infeasible, search
from piebald.schedule.prices import Prices, Transfer
from piebald.simulator.engine import simulate
from piebald.specs.cluster import Link, LinkKind
from piebald.specs.presets import load_model
from scenario_options import scenario_clusters, scenario_job, scenario_parser


class FreeTransferPrices(Prices):
    """The plan's prices with transfers that cost nothing."""

    def transfer(self, sender: int, receiver: int) -> Transfer:
        free = Link(kind=LinkKind.INTRA_NODE, bandwidth_bytes_per_s=math.inf, latency_s=0.0)
        return Transfer(num_bytes=0.0, link=free, resources=())


def main() -> None:
    args = scenario_parser(__doc__.splitlines()[0]).parse_args()
    job = scenario_job(args)
    print(
        f"global batch {job.global_batch_size} x {job.seq_len} tokens; piebald's plan for each "
        "scenario and model, simulated"
    )
    print(
        "| scenario | model | GPUs used | stages | schedule | predicted step (s) | "
        "simulated (s) | sim / pred | bubble | memory within estimate | "
        "free transfers (s) | sim / pred | simulate time (s) |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for name, cluster in scenario_clusters(args):
        for model_name in args.models.split(","):
            model = load_model(model_name)
            try:
                result = search(cluster, model=model, job=job)
            except Infeasible:
                print(f"| {name} | {model.name} | does not fit |" + " |" * 10)
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
            free = simulate(plan, prices=FreeTransferPrices(plan), record=False)
            print(
                f"| {name} | {model.name} | {len(plan.used_ranks)} | {plan.num_stages} | "
                f"{plan.schedule.value} | {predicted.step_time_s:.3f} | {sim.step_time_s:.3f} | "
                f"{sim.step_time_s / predicted.step_time_s:.3f} | {sim.bubble_fraction:.1%} | "
                f"{'yes' if within else 'NO'} | {free.step_time_s:.3f} | "
                f"{free.step_time_s / predicted.step_time_s:.3f} | {elapsed:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
