"""Choosing among the search's top plans by simulating them (``piebald plan --simulate``,
``piebald.plan(verify_by_simulation=True)``).

The search ranks plans by the analytic estimate; the simulator executes each candidate's
step event by event, priced with the same curve. The candidate with the shortest simulated
step wins; a deadlocked candidate never does. When the winner is not the search's first
choice, its plan file says so in its notes and lists the other candidates as runner-ups.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.plan_estimate import estimate_plan
from piebald.planner.search import ScoredPlan, SearchResult
from piebald.schedule.prices import Prices
from piebald.simulator.engine import simulate
from piebald.simulator.result import SimulationResult

__all__ = ["Verification", "VerifiedCandidate", "verify_by_simulation"]


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifiedCandidate:
    scored: ScoredPlan  # as the search returned it
    simulated: SimulationResult  # without a timeline (record=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verification:
    candidates: tuple[VerifiedCandidate, ...]  # the search's best first, then its runner-ups
    chosen_index: int  # into candidates; 0 when the search's first choice stands
    chosen: ScoredPlan  # the winner, its notes and runner-ups rewritten if it is not the first


def verify_by_simulation(
    result: SearchResult, *, curve: EfficiencyCurve = DEFAULT_CURVE
) -> Verification:
    """Simulate the search's best plan and runner-ups, priced with the ``curve`` the search
    used, and choose the one whose simulated step is shortest (deadlocked candidates never
    win; if every candidate deadlocks, the search's first choice stands)."""
    scored = [result.best, *result.runners_up]
    candidates = tuple(
        VerifiedCandidate(
            scored=c, simulated=simulate(c.plan, prices=Prices(c.plan, curve=curve), record=False)
        )
        for c in scored
    )
    finishing = [
        (c.simulated.step_time_s, index)
        for index, c in enumerate(candidates)
        if c.simulated.deadlock is None
    ]
    chosen = min(finishing)[1] if finishing else 0
    if chosen == 0:
        return Verification(candidates=candidates, chosen_index=0, chosen=result.best)
    winner = scored[chosen]
    others = [c for i, c in enumerate(scored) if i != chosen]
    plan = dataclasses.replace(
        winner.plan,
        predicted=winner.estimate.prediction(),
        upper_bound_tokens_per_s=result.upper_bound_tokens_per_s,
        notes=(
            f"strategy {winner.strategy}; chosen by simulation over the planner's first "
            f"choice (simulated {candidates[chosen].simulated.step_time_s:.3f} s against "
            f"{candidates[0].simulated.step_time_s:.3f} s)",
        ),
        runners_up=tuple(c.as_runner_up() for c in others),
    )
    return Verification(
        candidates=candidates,
        chosen_index=chosen,
        chosen=ScoredPlan(
            plan=plan, estimate=estimate_plan(plan, curve=curve), strategy=winner.strategy
        ),
    )
