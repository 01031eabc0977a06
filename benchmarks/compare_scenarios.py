"""piebald against every baseline on the literature scenarios (benchmarks/scenarios/*.yaml).

For each scenario and model, prints a markdown table of predicted tokens/s per strategy
(the same cost model for all; baselines "as modelled"), the upper bound, and whether
piebald is at least as fast as every baseline.

    .venv/bin/python benchmarks/compare_scenarios.py [--models llama-3-8b,llama-2-13b]
"""

from __future__ import annotations

import time

from piebald.planner.compare import compare_strategies
from piebald.specs.presets import load_model
from scenario_options import scenario_clusters, scenario_job, scenario_parser


def main() -> None:
    args = scenario_parser(__doc__.splitlines()[0]).parse_args()
    job = scenario_job(args)
    summary = []
    for name, cluster in scenario_clusters(args):
        for model_name in args.models.split(","):
            model = load_model(model_name)
            started = time.perf_counter()
            comparison = compare_strategies(cluster, model=model, job=job)
            elapsed = time.perf_counter() - started
            bound = comparison.upper_bound_tokens_per_s
            print(
                f"\n### {name} ({cluster.num_gpus} GPUs), {model.name}, batch "
                f"{job.global_batch_size} x {job.seq_len}\n"
            )
            print("| strategy | tokens/s | of bound | GPUs used | stages |")
            print("|---|---:|---:|---:|---:|")
            for row in comparison.rows:
                if row.feasible and row.plan is not None:
                    print(
                        f"| {row.strategy} | {row.tokens_per_s:,.0f} | "
                        f"{row.tokens_per_s / bound:.0%} | {row.num_gpus_used} | "
                        f"{row.plan.num_stages} |"
                    )
                else:
                    print(f"| {row.strategy} | does not fit | - | - | - |")
            piebald = comparison.rows[0].tokens_per_s
            best_baseline = max((r.tokens_per_s for r in comparison.rows[1:]), default=0.0)
            winner = max(comparison.rows[1:], key=lambda r: r.tokens_per_s).strategy
            print(f"\nupper bound {bound:,.0f} tokens/s; compared in {elapsed:.1f} s")
            summary.append((name, model.name, piebald, best_baseline, winner, bound))
    print("\n### summary\n")
    print(
        "| scenario | model | piebald tokens/s | best baseline | which | piebald / best "
        "baseline | piebald / bound |"
    )
    print("|---|---|---:|---:|---|---:|---:|")
    for name, model_name, piebald, best, winner, bound in summary:
        if not piebald:
            print(f"| {name} | {model_name} | nothing fits | | | | |")
            continue
        ratio = f"{piebald / best:.2f}x" if best else "only piebald fits"
        print(
            f"| {name} | {model_name} | {piebald:,.0f} | {best:,.0f} | {winner} | {ratio} | "
            f"{piebald / bound:.0%} |"
        )


if __name__ == "__main__":
    main()
