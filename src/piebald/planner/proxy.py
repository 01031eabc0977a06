"""The planner's step-time proxy for a priced structure, and the polish of its layer split.

The proxy mirrors the closed-form plan estimate (``cost.plan_estimate``) on the DP's stage
prices, so that ranking structures by it ranks them as the exact estimate would.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from piebald.cost.plan_estimate import HORIZON_ITERATIONS, background_stretch, residual_wait_s
from piebald.planner.stage_costs import StageCost

__all__ = ["Hop", "Way", "pipeline_proxy", "polish_bounds", "uniform_bounds"]


@dataclass(frozen=True, slots=True)
class Way:
    """A resource (a node's NIC or a GPU's port, one direction) that one way of a hop
    crosses: the streams running this way over it at once, and the seconds the rest of its
    traffic (a stage's activations out and its gradients out share its NIC) keeps it busy
    over the step."""

    streams: int
    other_busy_s: float


@dataclass(frozen=True, slots=True)
class Hop:
    """One micro-batch's activation there and gradient back over a stage boundary, priced
    as the plan estimate does (``cost.plan_estimate._traffic``): each way takes its
    latency plus its bytes at capacity / streams on its busiest resource, stretched by
    1 / (1 - rho) where the resource's other traffic keeps it busy a share rho of the
    pipeline (``horizon_s``; not counted without one)."""

    latency_s: float
    alone_s: float  # one activation's bytes over the path's bandwidth
    there: tuple[Way, ...]
    back: tuple[Way, ...]

    def seconds(self, horizon_s: float | None) -> float:
        total = 0.0
        for resources in (self.there, self.back):
            streams = 1.0
            for way in resources:
                stretch = background_stretch(way.other_busy_s, horizon_s=horizon_s)
                streams = max(streams, way.streams * stretch)
            total += self.latency_s + streams * self.alone_s
        return total


def pipeline_proxy(
    costs: Sequence[StageCost],
    bounds: tuple[int, ...],
    boundaries: list[Hop],
    link_busy: list[float],
    round_trips: list[tuple[int, float, bool]],
) -> float:
    """The plan estimate's form on DP prices: the busiest stage or link, plus one
    micro-batch through every stage and hop except the bottleneck stage, at least the round
    trips each stage's in-flight budget forces (with the waits at the later stages), plus
    the sync the drain does not hide, plus the slowest optimizer step. Hops and waits
    depend on the pipeline's length; like the estimate, it iterates to the fixed point."""
    ranges = list(itertools.pairwise(bounds))
    sync = [float(c.sync_s[a, b]) for c, (a, b) in zip(costs, ranges, strict=True)]
    busy = [float(c.busy_s[a, b]) for c, (a, b) in zip(costs, ranges, strict=True)]
    passes = [float(c.pass_s[a, b]) for c, (a, b) in zip(costs, ranges, strict=True)]
    rounds = [
        max(trips, int(c.rounds[a, b]))
        for c, (a, b), (trips, _, _) in zip(costs, ranges, round_trips, strict=True)
    ]
    optimizer = max(float(c.optimizer_s[a, b]) for c, (a, b) in zip(costs, ranges, strict=True))
    pipeline = _pipeline(busy, passes, boundaries, link_busy, round_trips, rounds, None)
    for _ in range(HORIZON_ITERATIONS):
        horizon = pipeline
        pipeline = _pipeline(busy, passes, boundaries, link_busy, round_trips, rounds, horizon)
        if abs(pipeline - horizon) <= 1e-4 * horizon:
            break
    exposed = max(max(0.0, s - sum(passes[:i])) for i, s in enumerate(sync))
    return pipeline + exposed + optimizer


def _pipeline(
    busy: list[float],
    passes: list[float],
    boundaries: list[Hop],
    link_busy: list[float],
    round_trips: list[tuple[int, float, bool]],
    rounds: list[int],
    horizon: float | None,
) -> float:
    hops = [hop.seconds(horizon) for hop in boundaries]
    slowest_stage = int(np.argmax(busy))
    if max(link_busy, default=0.0) > busy[slowest_stage]:
        pipeline = max(link_busy) + sum(passes) + sum(hops)
    else:
        pipeline = busy[slowest_stage] + sum(passes) + sum(hops) - passes[slowest_stage]
    # Little's law (cost.plan_estimate): the stage's rounds of one micro-batch of an equal
    # share plus the trip through the later stages, with the waits there; more rounds
    # where the stage's in-flight budget had to shrink to fit memory.
    last = len(busy) - 1
    waits = [
        residual_wait_s(busy_s=busy[k], horizon_s=horizon, pass_s=passes[k], last=k == last)
        if horizon
        else 0.0
        for k in range(len(busy))
    ]
    for i in range(last):
        met = round_trips[i][2]  # not a chain of one rank per stage from here on
        later = sum(hops[i:]) + sum(passes[i + 1 :]) + (sum(waits[i + 1 :]) if met else 0.0)
        before = sum(passes[:i]) + sum(hops[:i])
        pipeline = max(pipeline, rounds[i] * (busy[i] * round_trips[i][1] + later) + before)
    return pipeline


def polish_bounds(
    costs: Sequence[StageCost],
    bounds: tuple[int, ...],
    hops: list[Hop],
    link_busy: list[float],
    round_trips: list[tuple[int, float, bool]],
    proxy: float,
) -> tuple[tuple[int, ...], float]:
    """The DP minimises the slowest stage only; when a link is the bottleneck, or stages
    tie, moving a boundary by one layer can still shorten the fill and drain."""
    improved = True
    while improved:
        improved = False
        for index in range(1, len(bounds) - 1):
            for moved in (bounds[index] - 1, bounds[index] + 1):
                if not bounds[index - 1] < moved < bounds[index + 1]:
                    continue
                trial = (*bounds[:index], moved, *bounds[index + 1 :])
                value = pipeline_proxy(costs, trial, hops, link_busy, round_trips)
                if value < proxy * (1 - 1e-9):
                    bounds, proxy, improved = trial, value, True
    return bounds, proxy


def uniform_bounds(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers split as evenly as possible, earlier stages taking the remainder."""
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for index in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if index < extra else 0))
    return tuple(bounds)
