"""Estimating and simulating a plan (``piebald simulate``), priced from a profile DB, from
the measurements the plan records, or analytically; the trace and Gantt chart of a
simulated step; and, given a failure rate, the price of a failure and the checkpoint
interval (``cost.failure``) at the simulated step time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from piebald.api.arguments import check_bool, check_instance
from piebald.api.inputs import Profiles, as_plan, check_profiles, warn_unmatched
from piebald.cost.failure import FailureModel, FailurePrice, price_failures
from piebald.cost.plan_estimate import PlanEstimate, estimate_plan
from piebald.profiler.pricing import PlanPrices, PriceBasis, plan_prices
from piebald.schedule.prices import Prices
from piebald.simulator.engine import simulate as simulate_step
from piebald.simulator.gantt import plot_gantt
from piebald.simulator.result import SimulationResult
from piebald.simulator.trace import write_trace
from piebald.specs.plan import Plan

__all__ = [
    "PriceBasis",
    "SimulationReport",
    "SimulationResult",
    "estimate",
    "plot_gantt",
    "simulate",
    "simulate_report",
    "write_trace",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationReport:
    """One simulated step beside the planner's estimate, priced alike (:func:`simulate_report`).

    ``plan``: the plan as priced (with a profile DB, its cluster's links measured);
    ``result``: the simulated step; ``estimate``: the cost model's estimate of it;
    ``basis``: where the prices come from (a profile DB given now, the measurements the
    plan records, or the analytic model); ``other_db``: the DB given is not the one the
    plan was made with; ``warnings``: what the DB holds that the cluster cannot use (each
    also a ``ProfileWarning``); ``failures``: with a failure model, the price of a failure
    and the checkpoint interval at the simulated step time (None without one, or where
    the step deadlocked)."""

    plan: Plan
    result: SimulationResult
    estimate: PlanEstimate
    basis: PriceBasis
    other_db: bool
    warnings: tuple[str, ...]
    failures: FailurePrice | None = None


def _prices(
    plan: Plan | str | Path, profiles: Profiles | None, *, timeline: bool = False
) -> tuple[PlanPrices, tuple[str, ...]]:
    check_profiles(profiles)
    check_bool("timeline", timeline)
    chosen = as_plan(plan)
    source = str(plan) if isinstance(plan, (str, Path)) else "plan"
    prices = plan_prices(chosen, profiles=profiles, source=source)
    warnings: tuple[str, ...] = ()
    if prices.inputs is not None and profiles is not None:
        warnings = warn_unmatched(profiles, prices.inputs, cluster=chosen.cluster)
    return prices, warnings


def estimate(plan: Plan | str | Path, *, profiles: Profiles | None = None) -> PlanEstimate:
    """The cost model's estimate of one step of ``plan`` (or of the plan file at that
    path): ``step_time_s``, ``tokens_per_s``, per-stage times and per-rank peak memory.
    Priced from ``profiles`` if given, else from the measurements the plan records (a plan
    made with a profile DB), else analytically -- as ``simulate`` prices it, so the two
    compare like for like.

    >>> from piebald.api import build_job, plan
    >>> from piebald.examples import example_path
    >>> job = build_job(global_batch=8, seq_len=64)
    >>> best = plan(example_path(), "tiny", job, strategy="megatron")  # a quick one
    >>> estimate(best).step_time_s == best.predicted.step_time_s
    True
    """
    prices, _ = _prices(plan, profiles)
    return estimate_plan(prices.plan, curve=prices.curve)


def simulate_report(
    plan: Plan | str | Path,
    *,
    profiles: Profiles | None = None,
    timeline: bool = False,
    failures: FailureModel | None = None,
) -> SimulationReport:
    """:func:`simulate`, and the estimate it is compared with, priced alike, and where the
    prices come from: what ``piebald simulate`` shows. With ``failures`` (a
    ``piebald.cost.failure.FailureModel``: the mean time between failures, and what
    recovering costs), also what one failure costs and Young's and Daly's checkpoint
    intervals at the simulated step time, priced at the interval the plan records
    (``checkpoint_every_steps``) or else at Daly's (``cost.failure.price_failures``).

    >>> from piebald.api import build_job, plan
    >>> from piebald.examples import example_path
    >>> job = build_job(global_batch=8, seq_len=64)
    >>> best = plan(example_path(), "tiny", job, strategy="megatron")  # a quick one
    >>> report = simulate_report(best)
    >>> report.basis.value, report.estimate.step_time_s == best.predicted.step_time_s
    ('analytic', True)
    """
    if failures is not None:
        check_instance(
            "failures", failures, FailureModel, expected="a FailureModel (piebald.cost.failure)"
        )
    prices, warnings = _prices(plan, profiles, timeline=timeline)
    result = simulate_step(
        prices.plan, prices=Prices(prices.plan, curve=prices.curve), record=timeline
    )
    price = None
    if failures is not None and result.deadlock is None:
        price = price_failures(
            prices.plan,
            model=failures,
            step_time_s=result.step_time_s,
            checkpoint_every=prices.plan.checkpoint_every_steps,
        )
    return SimulationReport(
        plan=prices.plan,
        result=result,
        estimate=estimate_plan(prices.plan, curve=prices.curve),
        basis=prices.basis,
        other_db=prices.other_db,
        warnings=warnings,
        failures=price,
    )


def simulate(
    plan: Plan | str | Path, *, profiles: Profiles | None = None, timeline: bool = False
) -> SimulationResult:
    """Execute one step of ``plan`` (or of the plan file at that path) event by event
    (``piebald simulate``): ``step_time_s``, ``tokens_per_s``, ``bubble_fraction``, per-rank
    busy/blocked/idle time and peak memory, and ``deadlock`` (None when the step
    completes). Priced as :func:`estimate` prices it.
    ``timeline=True`` also keeps every operation's interval (``intervals``, for traces:
    :func:`write_trace`, :func:`plot_gantt`).

    >>> from piebald.api import build_job, plan
    >>> from piebald.examples import example_path
    >>> job = build_job(global_batch=8, seq_len=64)
    >>> best = plan(example_path(), "tiny", job, strategy="megatron")  # a quick one
    >>> result = simulate(best)
    >>> result.deadlock is None and abs(result.step_time_s / estimate(best).step_time_s - 1) < 0.1
    True
    """
    prices, _ = _prices(plan, profiles, timeline=timeline)
    return simulate_step(
        prices.plan, prices=Prices(prices.plan, curve=prices.curve), record=timeline
    )
