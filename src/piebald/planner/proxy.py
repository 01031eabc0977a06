"""The planner's step-time proxy for a priced structure, and the polish of its layer split.

The proxy is the step model (``cost.step_model``) on the DP's stage prices at given layer
bounds and the structure's aggregate boundary traffic (``planner.structure_traffic``), so
that ranking structures by it ranks them as the exact estimate would.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from piebald.cost.in_flight import little_budget, mean_in_flight, num_round_trips, slack_of
from piebald.cost.step_model import RoundTrip, StageTerms, settle
from piebald.cost.traffic import BoundaryTraffic
from piebald.planner.improvement import improves
from piebald.planner.stage_costs import StageCost
from piebald.specs.plan import Schedule

__all__ = [
    "ShareTrips",
    "pipeline_proxy",
    "polish_bounds",
    "share_round_trips",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareTrips:
    """A stage's 1F1B round trips for a rank of an equal share: how many its Little's
    budget forces, and the share of the stage's busy time one micro-batch of it takes."""

    rounds: int
    busy_share: float


@functools.lru_cache(maxsize=4096)  # structures of equal widths repeat across a search
def share_round_trips(widths: tuple[int, ...], num_micro_batches: int) -> tuple[ShareTrips, ...]:
    """Per stage of a structure with ``widths`` ranks, the round trips of a rank with an
    equal share of the micro-batches under Little's budget with its slack
    (``cost.in_flight``)."""
    trips = []
    for index, width in enumerate(widths):
        share = num_micro_batches / width
        mean = mean_in_flight(
            ranks_to_end=sum(widths[index:]),
            rank_micro_batches=share,
            stage_micro_batches=num_micro_batches,
        )
        slack = slack_of(schedule=Schedule.ONE_F_ONE_B, widths=widths[index:])
        budget = little_budget(mean, slack=slack, most=share)
        trips.append(
            ShareTrips(rounds=num_round_trips(share, budget), busy_share=width / num_micro_batches)
        )
    return tuple(trips)


def pipeline_proxy(
    costs: Sequence[StageCost],
    bounds: tuple[int, ...],
    boundaries: Sequence[BoundaryTraffic],
    trips: Sequence[ShareTrips],
    widths: Sequence[int],
) -> float:
    """The step model on the DP's prices of layers [bounds[i], bounds[i+1]) on each stage:
    its busy time, pass, sync and optimizer step; a rank of an equal share's round trips,
    more where the stage's in-flight budget had to shrink to fit memory."""
    last = len(costs) - 1
    stages = []
    for index, (cost, (a, b)) in enumerate(zip(costs, itertools.pairwise(bounds), strict=True)):
        cost.ensure_at(a, b)
        busy_s = float(cost.busy_s[a, b])
        trip = trips[index]
        # The last stage's round trip is its own passes, which its busy time covers; the
        # equal share's would overshoot it where the share is fractional.
        round_trips = (
            ()
            if index == last
            else (
                RoundTrip(
                    rounds=max(trip.rounds, int(cost.rounds[a, b])),
                    pass_s=busy_s * trip.busy_share,
                ),
            )
        )
        stages.append(
            StageTerms(
                busy_s=busy_s,
                pass_s=float(cost.pass_s[a, b]),
                num_working_ranks=widths[index],
                round_trips=round_trips,
                sync_s=float(cost.sync_s[a, b]),
                optimizer_s=float(cost.optimizer_s[a, b]),
            )
        )
    # The sync hides behind the earlier stages' passes only, not their hops too as in the
    # plan estimate: the proxy ranks structures, and with the hops it ranked a set of
    # fingerprinted plans no better (benchmarks/plan_fingerprints.py; the docs' results).
    return settle(stages, boundaries, drain_hops=False).step_s


def polish_bounds(
    costs: Sequence[StageCost],
    bounds: tuple[int, ...],
    boundaries: Sequence[BoundaryTraffic],
    trips: Sequence[ShareTrips],
    widths: Sequence[int],
    proxy: float,
    *,
    coarse: bool,
) -> tuple[tuple[int, ...], float]:
    """The DP minimises the slowest stage only; when a link is the bottleneck, or stages
    tie, or a stage's sync hides behind the others' drain (the DP counts it whole), moving
    a boundary can still shorten the step. Boundaries move one layer at a time while the
    proxy improves; ``coarse`` (small clusters, where a proxy is cheap) first by halving
    steps from a stage's mean share of the layers: a sync worth several layers moves a
    boundary several layers, past where one-layer moves stall. Two neighbouring boundaries
    also move together: a stage between two others then passes a layer on, which single
    moves cannot reach when each of them alone makes its neighbour the slowest stage."""
    improved = True
    while improved:
        improved = False
        step = max(1, (bounds[-1] - bounds[0]) // (2 * (len(bounds) - 1))) if coarse else 1
        while step >= 1:
            for first in range(1, len(bounds) - 1):
                for last in range(first, min(first + 2, len(bounds) - 1)):
                    for delta in (-step, step):
                        moved = tuple(bound + delta for bound in bounds[first : last + 1])
                        trial = (*bounds[:first], *moved, *bounds[last + 1 :])
                        if not all(a < b for a, b in itertools.pairwise(trial)):
                            continue
                        value = pipeline_proxy(costs, trial, boundaries, trips, widths)
                        if improves(value, proxy):
                            bounds, proxy, improved = trial, value, True
            step //= 2
    return bounds, proxy
