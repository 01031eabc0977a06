"""Little's law for 1F1B: how many micro-batches a rank holds in flight, and what that costs.

Under 1F1B a micro-batch's activations live from its forward until its backward, one round
trip through its stage and the later ones. By Little's law a rank holds (its rate) x (round
trip) micro-batches: with every working rank of this and the later stages (``ranks_to_end``
of them) taking an equal part of the step, L = ranks_to_end x n / N for a rank running n of
its stage's N micro-batches. With one rank per stage that is ``num_stages - stage_index``
(Narayanan et al. 2021, PipeDream-Flush).

A rank holding at most w micro-batches finishes at most w per round trip, so it needs
ceil(n / w) round trips a step (``num_round_trips``), and a budget lowered to fit memory
costs round trips (``in_flight_for_rounds``).

Every caller -- the memory check, the step-time estimate, the planner's proxy, its stage
cost matrices and its exact stage build, the simulator's schedule -- takes the budget, the
slack, the chain predicate and the round trips from here. The functions take floats or
numpy arrays (the planner prices every layer range at once) as well as ints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from piebald.specs.plan import Plan, Schedule

__all__ = [
    "IN_FLIGHT_SLACK",
    "chains_from",
    "in_flight_for_rounds",
    "in_flight_micro_batches",
    "is_chain",
    "little_budget",
    "mean_in_flight",
    "num_round_trips",
    "ranks_to_end",
    "slack_of",
    "stage_in_flight",
    "stage_round_trips",
]

# Micro-batches a 1F1B rank with later stages holds beyond Little's law: the mean round
# trip leaves out the waits behind other micro-batches at busy ranks and NICs, so a budget
# of exactly the mean starves the rank (by 5-20% on the scenarios in the simulator).
IN_FLIGHT_SLACK = 1


def is_chain(widths: Sequence[int]) -> bool:
    """Whether stages of these working-rank counts are a chain of one rank per stage: each
    micro-batch then arrives at a rank as its predecessor leaves and waits for no one (the
    textbook 1F1B)."""
    return not widths or chains_from(widths)[0]


def chains_from(widths: Sequence[int]) -> list[bool]:
    """Per stage, whether it and the stages after it are a chain (:func:`is_chain`)."""
    chains = [True] * len(widths)
    chain = True
    for index in range(len(widths) - 1, -1, -1):
        chain = chain and widths[index] <= 1
        chains[index] = chain
    return chains


def mean_in_flight(*, ranks_to_end: Any, rank_micro_batches: Any, stage_micro_batches: Any) -> Any:
    """Little's L = ranks_to_end x n / N: the micro-batches a rank running n of its stage's N
    has in flight on average (pass a share with ``stage_micro_batches=1.0``)."""
    return ranks_to_end * rank_micro_batches / stage_micro_batches


def little_budget(mean: Any, *, slack: int, most: Any) -> Any:
    """The in-flight budget for Little's ``mean`` (:func:`mean_in_flight`): ceil(L) plus
    ``slack``, no more than ``most`` (the rank's micro-batches), at least 1. Elementwise on
    numpy arrays."""
    if isinstance(mean, np.ndarray) or isinstance(most, np.ndarray):
        return np.maximum(1.0, np.minimum(most, np.ceil(mean) + slack))
    return max(1, min(most, math.ceil(mean) + slack))


def in_flight_micro_batches(
    *,
    schedule: Schedule,
    ranks_to_end: int,
    rank_micro_batches: int,
    stage_micro_batches: int,
    slack: int,
    last_stage: bool,
) -> int:
    """Micro-batches whose activations a rank holds at its peak: all of them under GPipe;
    under 1F1B Little's budget (:func:`little_budget`) with ``slack`` more (:func:`slack_of`),
    fewer would starve a data-parallel stage, which waits for a gradient before every
    forward. On the ``last_stage`` one: its round trip is its own pass (the backward
    follows the forward), so Little's L is at most 1 there; ranks_to_end x n / N exceeds
    it only where n is rounded up from an equal share, and the 2 its ceiling would give
    doubles the rank's activations for nothing."""
    if rank_micro_batches <= 0:
        return 0
    if schedule is Schedule.GPIPE:
        return rank_micro_batches
    if last_stage:
        return 1
    mean = mean_in_flight(
        ranks_to_end=ranks_to_end,
        rank_micro_batches=rank_micro_batches,
        stage_micro_batches=stage_micro_batches,
    )
    budget: int = little_budget(mean, slack=slack, most=rank_micro_batches)
    return budget


def slack_of(*, schedule: Schedule, widths: Sequence[int]) -> int:
    """The in-flight slack a 1F1B rank holds where memory allows, given the working ranks
    of its stage and of each later one (``widths``): ``IN_FLIGHT_SLACK``, or none on the
    last stage and in a chain (:func:`is_chain`), where Little's budget runs exactly."""
    if schedule is Schedule.GPIPE or len(widths) <= 1 or is_chain(widths):
        return 0
    return IN_FLIGHT_SLACK


def ranks_to_end(counts_per_stage: Sequence[Sequence[int]], stage_index: int) -> int:
    """Ranks with micro-batches in stage ``stage_index`` and the stages after it."""
    return sum(1 for counts in counts_per_stage[stage_index:] for count in counts if count > 0)


def num_round_trips(micro_batches: Any, budget: Any) -> Any:
    """Round trips a rank running ``micro_batches`` with ``budget`` in flight takes a step:
    1F1B finishes at most w per round trip, ceil(n / w). Elementwise on numpy arrays."""
    if isinstance(micro_batches, np.ndarray) or isinstance(budget, np.ndarray):
        return np.ceil(micro_batches / budget)
    return math.ceil(micro_batches / budget)


def stage_round_trips(micro_batches: Sequence[Any], budgets: Sequence[Any]) -> Any:
    """Round trips a step takes a stage: its slowest rank's (:func:`num_round_trips`;
    a rank without micro-batches takes none), at least 1. ``micro_batches`` and
    ``budgets``: per rank (or per GPU type); elementwise where they are numpy arrays, one
    entry per layer range."""
    rounds: Any = 1
    for n, w in zip(micro_batches, budgets, strict=True):
        if not isinstance(n, np.ndarray) and n <= 0:
            continue  # no work: no round trips (and no budget to divide by)
        trips = num_round_trips(n, w)
        if isinstance(trips, np.ndarray) or isinstance(rounds, np.ndarray):
            rounds = np.maximum(rounds, trips)
        elif trips > rounds:
            rounds = trips
    return rounds


def in_flight_for_rounds(*, budget: Any, rank_micro_batches: Any, num_rounds: Any) -> Any:
    """The smallest in-flight budget, at most ``budget``, that lets a rank run its
    micro-batches in ``num_rounds`` round trips: ceil(n / rounds), at least 1 for a rank
    with work (0 without). Elementwise on numpy arrays (whose ranks all have work)."""
    if isinstance(rank_micro_batches, np.ndarray) or isinstance(num_rounds, np.ndarray):
        return np.maximum(1.0, np.minimum(budget, np.ceil(rank_micro_batches / num_rounds)))
    if rank_micro_batches <= 0:
        return 0
    return max(1, min(budget, math.ceil(rank_micro_batches / num_rounds)))


def stage_in_flight(plan: Plan, stage_index: int) -> tuple[int, ...]:
    """Each rank's in-flight budget in stage ``stage_index`` (a tensor group's members all
    hold their leader's): the plan's ``max_in_flight`` where the planner recorded one (a
    budget lowered to fit memory, or Little's without its slack), else Little's law with
    its slack (:func:`in_flight_micro_batches`). The memory estimate, the step-time
    estimate and the 1F1B schedule all hold a rank to this."""
    stage = plan.stages[stage_index]
    if stage.max_in_flight is not None:
        return stage.max_in_flight
    # A tensor group runs as one rank of the pipeline (its members share its micro-batches):
    # widths, ranks to the end and the stage's micro-batches count groups, by their leaders.
    counts = [s.group_micro_batches for s in plan.stages]
    downstream = ranks_to_end(counts, stage_index)
    total = sum(counts[stage_index])
    widths = [sum(1 for n in c if n) for c in counts[stage_index:]]
    slack = slack_of(schedule=plan.schedule, widths=widths)
    return tuple(
        in_flight_micro_batches(
            schedule=plan.schedule,
            ranks_to_end=downstream,
            rank_micro_batches=count,
            stage_micro_batches=total,
            slack=slack,
            last_stage=stage_index == plan.num_stages - 1,
        )
        for count in stage.num_micro_batches
    )
