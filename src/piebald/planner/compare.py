"""piebald against every baseline, each the same search restricted to what it can express."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.planner.bounds import upper_bound_tokens_per_s
from piebald.planner.search import Infeasible, ScoredPlan, search
from piebald.planner.strategies import PIEBALD, STRATEGIES, Strategy
from piebald.report.describe import describe_plan
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan

__all__ = ["Comparison", "ComparisonRow", "compare_strategies"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ComparisonRow:
    strategy: str
    feasible: bool
    tokens_per_s: float
    step_time_s: float
    num_gpus_used: int
    reason: str  # the plan's structure, or why nothing fits
    plan: Plan | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    rows: tuple[ComparisonRow, ...]
    upper_bound_tokens_per_s: float


def compare_strategies(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    strategies: Sequence[Strategy] = tuple(STRATEGIES.values()),
    curve: EfficiencyCurve = DEFAULT_CURVE,
    on_strategy: Callable[[str], None] | None = None,
    workers: int | None = None,
) -> Comparison:
    """Plan with every strategy under one cost model; infeasible ones say why. ``workers``:
    processes each search may use (``search``)."""
    rows = []
    seeds: list[ScoredPlan] = []
    # Baselines first: their plans lie in piebald's plan space and seed its search.
    ordered = sorted(strategies, key=lambda s: s is PIEBALD)
    for strategy in ordered:
        if on_strategy is not None:
            on_strategy(strategy.name)
        try:
            result = search(
                cluster,
                model=model,
                job=job,
                strategy=strategy,
                curve=curve,
                seeds=seeds if strategy is PIEBALD else (),
                workers=workers,
            )
            if strategy is not PIEBALD:
                seeds.append(result.best)
        except Infeasible as error:
            rows.append(
                ComparisonRow(
                    strategy=strategy.name,
                    feasible=False,
                    tokens_per_s=0.0,
                    step_time_s=float("inf"),
                    num_gpus_used=0,
                    reason=str(error),
                    plan=None,
                )
            )
            continue
        plan = result.best.plan
        label = "" if strategy is PIEBALD else " (as modelled)"
        rows.append(
            ComparisonRow(
                strategy=strategy.name,
                feasible=True,
                tokens_per_s=result.best.estimate.tokens_per_s,
                step_time_s=result.best.estimate.step_time_s,
                num_gpus_used=len(plan.used_ranks),
                reason=describe_plan(plan) + label,
                plan=plan,
            )
        )
    bound = upper_bound_tokens_per_s(cluster, model=model, job=job, curve=curve)
    rows.sort(key=lambda row: row.strategy != PIEBALD.name)  # piebald's row first
    return Comparison(rows=tuple(rows), upper_bound_tokens_per_s=bound)
