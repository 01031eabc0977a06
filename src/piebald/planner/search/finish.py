"""The end of a search: the winner with its notes and runners-up, or why nothing fits."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from piebald.planner.bounds import diagnose_infeasible
from piebald.planner.search.records import ScoredPlan
from piebald.planner.search.state import SearchState
from piebald.specs.plan import Plan

__all__ = ["distinct_runners_up", "finished_plan", "why_infeasible"]


def distinct_runners_up(ranked: Sequence[ScoredPlan], *, most: int) -> tuple[ScoredPlan, ...]:
    """Up to ``most`` plans after the first of ``ranked``, each of a shape (stages, layers,
    ranks, micro-batch size) no earlier one has."""
    return tuple(_distinct(ranked[1:], ranked[0]))[:most]


def finished_plan(
    best: ScoredPlan,
    *,
    ranked: Sequence[ScoredPlan],
    runners_up: Sequence[ScoredPlan],
    bound: float,
) -> ScoredPlan:
    """The winner with its prediction, bound, runners-up and notes (idle GPUs say why:
    against the best plan of ``ranked`` that uses every GPU)."""
    plan = best.plan
    notes = [f"strategy {best.strategy} (piebald {_version()})"]
    idle = plan.idle_ranks
    if idle:
        with_all = [s for s in ranked if not s.plan.idle_ranks]
        if with_all:
            notes.append(
                f"ranks {list(idle)} idle on purpose: the best plan using every GPU "
                f"predicts {with_all[0].estimate.tokens_per_s:,.0f} tokens/s, fewer "
                f"than {best.estimate.tokens_per_s:,.0f}"
            )
        else:
            notes.append(f"ranks {list(idle)} idle: no plan using every GPU fits memory")
    runners = tuple(s.as_runner_up() for s in runners_up)
    final = Plan(
        cluster=plan.cluster,
        model=plan.model,
        job=plan.job,
        stages=plan.stages,
        routes=plan.routes,
        schedule=plan.schedule,
        predicted=best.estimate.prediction(),
        upper_bound_tokens_per_s=bound,
        notes=tuple(notes),
        runners_up=runners,
    )
    return ScoredPlan(plan=final, estimate=best.estimate, strategy=best.strategy)


def why_infeasible(state: SearchState) -> str:
    """Why no plan fits: the strategy's equal micro-batches where structures fit but none
    divides the batch, else what the cluster lacks (``bounds.diagnose_infeasible``)."""
    if state.strategy.stage_rules.equal_micro_batches and any(
        math.isfinite(c.proxy_s) for c in state.candidates.values()
    ):
        return (
            f"{state.strategy.name} gives every GPU of a stage the same number of "
            "micro-batches, and no structure that fits memory has stages whose size "
            f"divides the micro-batches of a global batch of {state.job.global_batch_size}"
        )
    diagnosis = diagnose_infeasible(state.cluster, model=state.model, job=state.job)
    # Every stage at a degree above 1: the one the user asked for (--tensor-parallel).
    degree = min(state.strategy.stage_rules.tensor_parallel_degrees)
    if degree > 1:
        uneven = sorted(
            {g.gpus_per_node for g in state.cluster.node_groups if g.gpus_per_node % degree}
        )
        if uneven:
            diagnosis += (
                f"; or the tensor-parallel degree: every stage runs tensor groups of "
                f"{degree} GPUs inside one node, which nodes of "
                f"{' or '.join(map(str, uneven))} GPUs do not divide into"
            )
    return diagnosis


def _distinct(scored: Iterable[ScoredPlan], best: ScoredPlan) -> Iterable[ScoredPlan]:
    seen = {_shape(best.plan)}
    for candidate in scored:
        shape = _shape(candidate.plan)
        if shape not in seen:
            seen.add(shape)
            yield candidate


def _shape(plan: Plan) -> tuple[tuple[int, int, tuple[int, ...], int], ...]:
    return tuple((s.layer_start, s.layer_end, s.ranks, s.micro_batch_size[0]) for s in plan.stages)


def _version() -> str:
    from piebald import __version__

    return __version__
