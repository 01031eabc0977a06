"""The pipeline step model: stage and boundary terms in, step seconds and bottleneck out.

The one place the step time of a 1F1B pipeline is computed: the plan estimate
(``cost.plan_estimate``) feeds it a plan's exact per-rank terms, the planner's proxy
(``planner.proxy``) the DP's stage prices at given layer bounds.

Bottleneck form of the 1F1B/GPipe makespan: the busiest stage (or stage boundary) runs for
its whole busy time, and every other stage and every boundary adds one micro-batch's
forward plus backward for the fill and drain. For p equal stages of t per micro-batch and
m micro-batches this is (m + p - 1) t, bubble (p - 1) / (m + p - 1) (Huang et al. 2019;
Narayanan et al. 2021). Under 1F1B a rank holding at most w micro-batches in flight
finishes at most w per round trip through the later stages, which bounds the pipeline too
(Little's law, ``cost.in_flight``); a round trip waits at each later stage for the pass it
finds running (:func:`residual_wait_s`), except in a chain of one rank per stage. Hops are
priced with the other traffic of their resources spread over the pipeline
(``cost.traffic``), which the hops lengthen: :func:`settle` iterates to the fixed point.
The part of each stage's gradient sync not hidden behind the drain of the earlier stages
is exposed, then the slowest optimizer step follows. Under GPipe, where every rank runs
all its forwards before its backwards, each phase is also a pipeline of its own, whose
busiest stages may differ (:func:`_gpipe_phases_s`).

What the closed form leaves out: round trips are sums of service times and the waits are
means, and a Little's budget that exactly covers the mean round trip starves a little (one
more micro-batch in flight closes most of the gap in the simulator).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from piebald.cost.in_flight import chains_from
from piebald.cost.traffic import BoundaryTraffic

__all__ = [
    "HORIZON_ITERATIONS",
    "HORIZON_TOLERANCE",
    "Bottleneck",
    "RoundTrip",
    "StageTerms",
    "Step",
    "residual_wait_s",
    "settle",
    "step_at",
]

HORIZON_ITERATIONS = 8
HORIZON_TOLERANCE = 1e-4  # relative change of the pipeline at which the horizon is settled
RESIDUAL_OF_PASS = 5 / 18  # a pass's mean residual when B = 2F (``residual_wait_s``)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundTrip:
    """A rank's 1F1B round trips: how many a step takes it (its micro-batches over its
    in-flight budget), and its own forward + backward of one micro-batch."""

    rounds: float
    pass_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTerms:
    """What one stage adds to a step."""

    busy_s: float  # the busiest rank's compute over the step
    pass_s: float  # one micro-batch through the stage on its slowest working rank
    num_working_ranks: int  # ranks with micro-batches (a chain has one per stage)
    round_trips: tuple[RoundTrip, ...]  # those its ranks' in-flight budgets force
    sync_s: float  # data-parallel collectives at the end of the step
    optimizer_s: float
    # Under GPipe, each phase on its own (None: a 1F1B pipeline, or not known): the
    # busiest rank's forwards over the step and the slowest working rank's forward.
    forward_busy_s: float | None = None
    forward_pass_s: float | None = None
    backward_busy_s: float | None = None  # and its backwards


@dataclass(frozen=True, slots=True, kw_only=True)
class Bottleneck:
    """What bounds the pipeline: a stage, or the link from a stage to the next."""

    stage_index: int
    link: bool

    def __str__(self) -> str:
        if self.link:
            return f"link {self.stage_index}->{self.stage_index + 1}"
        return f"stage {self.stage_index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """The step of a pipeline at one horizon (:func:`step_at`) or at its fixed point
    (:func:`settle`)."""

    pipeline_s: float
    # Per stage: one micro-batch's hop over its boundary to the next (0 for the last), and
    # its pass plus that hop.
    hop_s: tuple[float, ...]
    micro_batch_s: tuple[float, ...]
    bottleneck: Bottleneck
    exposed_sync_s: float
    optimizer_s: float
    step_s: float


def residual_wait_s(*, busy_s: float, horizon_s: float, pass_s: float, last: bool) -> float:
    """How long a micro-batch passing through a stage waits there for the rank to finish
    what it is running. A rank busy ``busy_s`` of ``horizon_s`` (a share rho) is found
    mid-operation with probability rho, with on average the mean residual of an operation
    left: E[S^2] / 2E[S] over forwards and backwards, RESIDUAL_OF_PASS of a pass when the
    backward takes twice the forward. A micro-batch visits a stage twice (forward,
    backward), the last stage once (its backward follows its forward)."""
    visits = 1 if last else 2
    return visits * min(1.0, busy_s / horizon_s) * RESIDUAL_OF_PASS * pass_s


def step_at(
    stages: Sequence[StageTerms],
    boundaries: Sequence[BoundaryTraffic],
    *,
    horizon_s: float | None,
    drain_hops: bool = True,
) -> Step:
    """The step with the hops' background traffic spread over ``horizon_s`` (not counted
    without one): the bottleneck's busy time plus the fill and drain, at least what
    Little's law allows, then the exposed sync and the optimizer step. ``drain_hops``:
    whether the drain that hides a stage's sync includes the earlier stages' hops (the
    plan estimate) or only their passes (the planner's proxy, ``planner.proxy``)."""
    if len(boundaries) != len(stages) - 1:
        raise ValueError(f"{len(stages)} stages need {len(stages) - 1} boundaries")
    last = len(stages) - 1
    hop_s = (*[boundary.hop_s(horizon_s=horizon_s) for boundary in boundaries], 0.0)
    micro_batch_s = tuple([stage.pass_s + hop for stage, hop in zip(stages, hop_s, strict=True)])
    # The busiest stage, the last of equals; a link only where it is busier still.
    stage_index, bottleneck_s = 0, stages[0].busy_s
    for index in range(1, len(stages)):
        if stages[index].busy_s >= bottleneck_s:
            stage_index, bottleneck_s = index, stages[index].busy_s
    link_index = -1
    for index, boundary in enumerate(boundaries):
        if boundary.busy_s > bottleneck_s:
            link_index, bottleneck_s = index, boundary.busy_s
        elif link_index >= 0 and boundary.busy_s == bottleneck_s:
            link_index = index  # the last of equal links
    if link_index >= 0:
        bottleneck = Bottleneck(stage_index=link_index, link=True)
    else:
        bottleneck = Bottleneck(stage_index=stage_index, link=False)
    # Fill and drain: one micro-batch through every stage but the bottleneck stage, and
    # over every boundary (the bottleneck stage's own hop too: its last micro-batch still
    # has to cross it before the later stages can drain).
    fill_s = sum(
        hop_s[index] if index == bottleneck.stage_index and not bottleneck.link else mb_s
        for index, mb_s in enumerate(micro_batch_s)
    )
    pipeline_s = bottleneck_s + fill_s
    # Little's law: a rank holding at most w micro-batches in flight finishes at most w per
    # round trip of a micro-batch through its stage and the later ones (1F1B), waiting at
    # each later stage unless they form a chain, where each micro-batch arrives as the
    # last one leaves.
    chains = chains_from([stage.num_working_ranks for stage in stages])
    with_waits = micro_batch_s
    if horizon_s is not None and not chains[0]:  # in a chain throughout, no one waits
        with_waits = tuple(
            [
                mb_s
                + residual_wait_s(
                    busy_s=stage.busy_s,
                    horizon_s=horizon_s,
                    pass_s=stage.pass_s,
                    last=index == last,
                )
                for index, (stage, mb_s) in enumerate(zip(stages, micro_batch_s, strict=True))
            ]
        )
    # before_s[s]: one micro-batch through stages 0..s-1, summed left to right.
    before_s = (0.0, *itertools.accumulate(micro_batch_s))
    for index, stage in enumerate(stages):
        if not stage.round_trips:
            continue
        later = micro_batch_s if chains[index] else with_waits
        later_s = hop_s[index] + sum(later[index + 1 :])
        for trip in stage.round_trips:
            pipeline_s = max(pipeline_s, trip.rounds * (trip.pass_s + later_s) + before_s[index])
    if all(stage.forward_busy_s is not None for stage in stages):
        pipeline_s = max(pipeline_s, _gpipe_phases_s(stages, hop_s))
    # Stage s finishes its last backward before stages 0..s-1 drain theirs.
    drain_s = before_s if drain_hops else (0.0, *itertools.accumulate(s.pass_s for s in stages))
    exposed_sync_s = max(
        max(0.0, stage.sync_s - drain_s[index]) for index, stage in enumerate(stages)
    )
    optimizer_s = max(stage.optimizer_s for stage in stages)
    return Step(
        pipeline_s=pipeline_s,
        hop_s=hop_s,
        micro_batch_s=micro_batch_s,
        bottleneck=bottleneck,
        exposed_sync_s=exposed_sync_s,
        optimizer_s=optimizer_s,
        step_s=pipeline_s + exposed_sync_s + optimizer_s,
    )


def _gpipe_phases_s(stages: Sequence[StageTerms], hop_s: Sequence[float]) -> float:
    """GPipe's step: every rank runs all its forwards, then all its backwards, so the
    forwards form a pipeline of their own, and then the backwards: each phase its busiest
    stage's time plus one micro-batch through the others and over every boundary. Where
    the two phases' busiest stages differ this exceeds the bottleneck form, which takes
    one stage busiest for both; for p equal stages it is the same (m + p - 1)(F + B)."""
    hops_s = sum(hop_s)

    def phase_s(busy: Sequence[float], one: Sequence[float]) -> float:
        slowest = max(range(len(busy)), key=lambda index: (busy[index], index))
        return busy[slowest] + sum(one) - one[slowest] + hops_s

    forward_busy = [stage.forward_busy_s or 0.0 for stage in stages]
    forward_one = [stage.forward_pass_s or 0.0 for stage in stages]
    backward_busy = [stage.backward_busy_s or 0.0 for stage in stages]
    backward_one = [stage.pass_s - one for stage, one in zip(stages, forward_one, strict=True)]
    return phase_s(forward_busy, forward_one) + phase_s(backward_busy, backward_one)


def settle(
    stages: Sequence[StageTerms], boundaries: Sequence[BoundaryTraffic], *, drain_hops: bool = True
) -> Step:
    """The step at the fixed point of its horizon: the hops' background traffic is spread
    over the pipeline, which the hops lengthen (a longer pipeline lowers the load, so it
    settles in a few iterations). ``drain_hops``: as in :func:`step_at`."""
    step = step_at(stages, boundaries, horizon_s=None, drain_hops=drain_hops)
    for _ in range(HORIZON_ITERATIONS):
        horizon_s = step.pipeline_s
        step = step_at(stages, boundaries, horizon_s=horizon_s, drain_hops=drain_hops)
        if abs(step.pipeline_s - horizon_s) <= HORIZON_TOLERANCE * horizon_s:
            break
    return step
