"""A plan for the nodes still live: what elastic training runs after a node is lost, leaves
or joins (docs/guides/elastic.md).

The new plan is the search's answer for the live sub-cluster (``Membership.sub_cluster``),
with the model, job (the same global batch: per-GPU micro-batches are re-solved) and prices
of the plan it replaces: its recorded measurements, where it was made from profiles, and
its cluster's links. The search is deterministic, so every process that re-plans the same
membership gets the same plan.
"""

from __future__ import annotations

from dataclasses import replace

from piebald.cost.recorded_curve import recorded_curve
from piebald.planner.search import search
from piebald.planner.search.records import Infeasible
from piebald.specs.membership import Membership
from piebald.specs.plan import Plan

__all__ = ["Infeasible", "replan"]


def replan(plan: Plan, membership: Membership, *, workers: int | None = None) -> Plan:
    """The plan for ``membership``'s live nodes of ``plan.cluster`` (``plan`` itself when
    every node is live). Raises :class:`Infeasible` when the live nodes cannot hold the
    model, and ValueError when ``membership`` is of another cluster or names no node."""
    if membership.cluster != plan.cluster:
        raise ValueError(
            f"membership of cluster {membership.cluster.name}, plan of {plan.cluster.name}"
        )
    if membership.is_everyone:
        return plan
    result = search(
        membership.sub_cluster(),
        model=plan.model,
        job=plan.job,
        curve=recorded_curve(plan),
        workers=workers,
    )
    return replace(result.best.plan, cost_inputs=plan.cost_inputs)
