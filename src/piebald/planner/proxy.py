"""The planner's step-time proxy for a priced structure, and the polish of its layer split.

The proxy mirrors the closed-form plan estimate (``cost.plan_estimate``) on the DP's stage
prices, so that ranking structures by it ranks them as the exact estimate would.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from piebald.planner.stage_costs import StageCost

__all__ = ["Hop", "Way", "pipeline_proxy", "polish_bounds", "uniform_bounds"]


@dataclass(frozen=True, slots=True)
class Way:
    """A resource (a node's NIC or a GPU's port, one direction) that one way of a hop
    crosses: the streams running this way over it, those running the other way (a stage's
    activations out and its gradients out share its NIC), and the stage where the two
    meet, whose pass separates them."""

    streams: int
    other_streams: int
    stage: int


@dataclass(frozen=True, slots=True)
class Hop:
    """One micro-batch's activation there and gradient back over a stage boundary, priced
    as the plan estimate does (``cost.plan_estimate._boundaries``): each way takes its
    latency plus its bytes at capacity / streams on its busiest resource, where the n
    streams of the busier way run at once and the m of the other way overlap them by
    (T - pass / 2) / T, T = n x one transfer alone."""

    latency_s: float
    alone_s: float  # one activation's bytes over the path's bandwidth
    there: tuple[Way, ...]
    back: tuple[Way, ...]

    def seconds(self, passes: Sequence[float]) -> float:
        total = 0.0
        for resources in (self.there, self.back):
            streams = 1.0
            for way in resources:
                most = max(way.streams, way.other_streams)
                least = min(way.streams, way.other_streams)
                together_s = most * self.alone_s
                overlap = (together_s - 0.5 * passes[way.stage]) / together_s
                streams = max(streams, most + min(1.0, max(0.0, overlap)) * least)
            total += self.latency_s + streams * self.alone_s
        return total


def pipeline_proxy(
    costs: Sequence[StageCost],
    bounds: tuple[int, ...],
    boundaries: list[Hop],
    link_busy: list[float],
    round_trips: list[tuple[int, float]],
) -> float:
    """The plan estimate's form on DP prices: the busiest stage or link, plus one
    micro-batch through every stage and hop except the bottleneck stage, at least the round
    trips each stage's in-flight budget forces, plus the sync the drain does not hide, plus
    the slowest optimizer step."""
    ranges = list(itertools.pairwise(bounds))
    sync = [float(c.sync_s[a, b]) for c, (a, b) in zip(costs, ranges, strict=True)]
    busy = [float(c.busy_s[a, b]) for c, (a, b) in zip(costs, ranges, strict=True)]
    passes = [float(c.pass_s[a, b]) for c, (a, b) in zip(costs, ranges, strict=True)]
    hops = [hop.seconds(passes) for hop in boundaries]
    optimizer = max(float(c.optimizer_s[a, b]) for c, (a, b) in zip(costs, ranges, strict=True))
    slowest_stage = int(np.argmax(busy))
    if max(link_busy, default=0.0) > busy[slowest_stage]:
        pipeline = max(link_busy) + sum(passes) + sum(hops)
    else:
        pipeline = busy[slowest_stage] + sum(passes) + sum(hops) - passes[slowest_stage]
    # Little's law (cost.plan_estimate): the stage's rounds of one micro-batch of an equal
    # share plus the trip through the later stages; more rounds where the stage's in-flight
    # budget had to shrink to fit memory.
    for i, (a, b) in enumerate(ranges[:-1]):
        rounds, share = round_trips[i]
        rounds = max(rounds, int(costs[i].rounds[a, b]))
        later = sum(hops[i:]) + sum(passes[i + 1 :])
        before = sum(passes[:i]) + sum(hops[:i])
        pipeline = max(pipeline, rounds * (busy[i] * share + later) + before)
    exposed = max(max(0.0, s - sum(passes[:i])) for i, s in enumerate(sync))
    return pipeline + exposed + optimizer


def polish_bounds(
    costs: Sequence[StageCost],
    bounds: tuple[int, ...],
    hops: list[Hop],
    link_busy: list[float],
    round_trips: list[tuple[int, float]],
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
