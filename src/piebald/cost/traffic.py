"""The traffic over a pipeline's stage boundaries, and the price of one hop across one.

A hop is one micro-batch's activation from a stage to the next and its gradient back. Each
way moves at min(path rate, the share it gets of each resource it crosses): a GPU port, a
node's NIC in one direction, a site link (``link_resources``). The simulator's network splits a
resource equally among the transfers on it (processor sharing). The ranks of a stage run
their micro-batches in step, so every rank that sends one way over a resource sends at
once, and every rank that receives that way receives one transfer at a time (it posts one
receive ahead): n = min(senders, receivers) streams, each taking n S / capacity. The
resource's other traffic (the other way, other boundaries) is not in step with these: it
arrives at its own times and, under processor sharing, stretches a transfer by 1 / (1 -
rho), rho the share of the step (``horizon_s``, the pipeline) that traffic keeps the
resource busy (Kleinrock 1967, M/G/1-PS). Without a horizon it is not counted. So a way
takes

    latency + bytes x max(1 / bandwidth, streams x stretch / capacity over its crossings)

(:meth:`Way.seconds`), and a boundary's hop is its slowest pair's way there plus way back
(:meth:`BoundaryTraffic.hop_s`). A boundary is as busy over the step as its busiest
resource.

Two constructions feed this one price: :func:`plan_traffic` follows a plan's routes pair
by pair (the plan estimate), and the planner builds a structure's aggregate traffic from
its stages' node signatures (``planner.structure_traffic``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from piebald.cost.link_resources import Resource, transfer_resources
from piebald.cost.precision import activation_message_bytes
from piebald.specs.cluster import Link
from piebald.specs.devices import DeviceType
from piebald.specs.plan import Plan

__all__ = [
    "MAX_BACKGROUND",
    "BoundaryTraffic",
    "Crossing",
    "PairHop",
    "Way",
    "background_stretch",
    "plan_traffic",
]

# A resource busier than this with other traffic is priced as if at this load: the
# 1 / (1 - rho) of processor sharing has no steady state at rho = 1.
MAX_BACKGROUND = 0.8


def background_stretch(background_s: float, *, horizon_s: float | None) -> float:
    """How much slower a transfer moves over a resource that other traffic keeps busy
    ``background_s`` of ``horizon_s``: 1 / (1 - rho) under processor sharing (M/G/1-PS),
    rho capped at MAX_BACKGROUND; 1 without a horizon."""
    if not horizon_s:
        return 1.0
    return 1.0 / (1.0 - min(background_s / horizon_s, MAX_BACKGROUND))


@dataclass(frozen=True, slots=True, kw_only=True)
class Crossing:
    """One way of a transfer over one resource it crosses."""

    streams: int  # transfers of this way that run over the resource at once
    capacity_bytes_per_s: float
    background_s: float  # how long the resource's other traffic keeps it busy in a step


@dataclass(frozen=True, slots=True, kw_only=True)
class Way:
    """One direction of a (sender, receiver) pair: its path and the resources it crosses."""

    latency_s: float
    bandwidth_bytes_per_s: float
    crossings: tuple[Crossing, ...]

    def seconds(self, num_bytes: float, *, horizon_s: float | None) -> float:
        """A message of ``num_bytes`` this way, at its share of each resource."""
        seconds_per_byte = 1.0 / self.bandwidth_bytes_per_s
        for crossing in self.crossings:  # (a loop, not max(): the planner runs this a lot)
            stretch = background_stretch(crossing.background_s, horizon_s=horizon_s)
            shared = crossing.streams * stretch / crossing.capacity_bytes_per_s
            if shared > seconds_per_byte:
                seconds_per_byte = shared
        return self.latency_s + num_bytes * seconds_per_byte


@dataclass(frozen=True, slots=True, kw_only=True)
class PairHop:
    """A (sender, receiver) pair's hop: one activation there, its gradient back."""

    num_bytes: float
    there: Way
    back: Way

    def seconds(self, *, horizon_s: float | None) -> float:
        return self.there.seconds(self.num_bytes, horizon_s=horizon_s) + self.back.seconds(
            self.num_bytes, horizon_s=horizon_s
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundaryTraffic:
    """The traffic over one stage boundary: its distinct pairs' hops, and the busy time of
    its busiest resource over the step."""

    busy_s: float
    pairs: tuple[PairHop, ...]

    def hop_s(self, *, horizon_s: float | None) -> float:
        """One micro-batch's hop across the boundary: its slowest pair's."""
        slowest_s = 0.0
        for pair in self.pairs:
            slowest_s = max(slowest_s, pair.seconds(horizon_s=horizon_s))
        return slowest_s


_WayKey = tuple[float, float, tuple[Crossing, ...]]
# Per way of a pair: the link's latency and bandwidth, its resources, and (boundary, forward?).
_PairWays = tuple[tuple[float, float, tuple[Resource, ...], tuple[int, bool]], ...]


def plan_traffic(plan: Plan) -> tuple[BoundaryTraffic, ...]:
    """The traffic over every stage boundary of ``plan``, pair by pair of its routes (what
    does not depend on the pipeline's length, so built once per estimate).

    A resource is busy for the bytes / capacity of every transfer that uses it, over all
    boundaries: a node's NIC in carries its stage's activations from the previous stage
    and its gradients from the next one. A way's streams over a resource are min(its
    senders, its receivers) there; its background is the resource's busy time less the
    way's own.
    """
    size_of = {
        rank: size
        for stage in plan.stages
        for rank, size in zip(stage.ranks, stage.micro_batch_size, strict=True)
    }
    # Thousands of ranks make hundreds of thousands of pairs: what repeats across pairs
    # (message sizes, a resource's crossing of one way) is computed once.
    message_bytes: dict[tuple[DeviceType, int], float] = {}
    busy: dict[Hashable, float] = {}
    # Per resource and way (boundary, forward?): the ranks sending and receiving that way
    # over it, and the seconds that way keeps it busy.
    ends: dict[Hashable, dict[tuple[int, bool], tuple[set[int], set[int]]]] = {}
    way_busy: dict[Hashable, dict[tuple[int, bool], float]] = {}
    # Per boundary, per (sender, receiver) pair: its bytes and both ways' links and resources.
    pairs_of: list[list[tuple[float, _PairWays]]] = []
    keys_of: list[set[Hashable]] = []  # per boundary, every resource its pairs cross
    gpus = plan.cluster.gpus
    # Between two nodes, every pair of their GPUs takes the same link and resources.
    between_nodes: dict[tuple[int, int], tuple[Link, tuple[Resource, ...]]] = {}
    for index in range(plan.num_stages - 1):
        pairs: dict[tuple[int, int], int] = {}
        for route in plan.routes:
            pair = (route[index], route[index + 1])
            pairs[pair] = pairs.get(pair, 0) + 1
        priced: list[tuple[float, _PairWays]] = []
        touched: set[Hashable] = set()
        for (sender, receiver), count in pairs.items():
            device = plan.cluster.device_of(sender)
            kind = (device, size_of[sender])
            num_bytes = message_bytes.get(kind)
            if num_bytes is None:
                num_bytes = message_bytes[kind] = activation_message_bytes(
                    device,
                    precision=plan.job.precision,
                    micro_batch_size=size_of[sender],
                    seq_len=plan.job.seq_len,
                    hidden_size=plan.model.arch.hidden_size,
                )
            ways = []
            for a, b, forward in ((sender, receiver, True), (receiver, sender, False)):
                nodes = (gpus[a].node_index, gpus[b].node_index)
                found = between_nodes.get(nodes) if nodes[0] != nodes[1] else None
                if found is None:
                    found = (
                        plan.cluster.link_between(a, b),
                        transfer_resources(plan.cluster, a, b),
                    )
                    if nodes[0] != nodes[1]:
                        between_nodes[nodes] = found
                link, resources = found
                way = (index, forward)
                ways.append((link.latency_s, link.bandwidth_bytes_per_s, resources, way))
                for key, capacity in resources:
                    seconds = count * num_bytes / capacity
                    busy[key] = busy.get(key, 0.0) + seconds
                    per_way = way_busy.get(key)
                    if per_way is None:
                        per_way = way_busy[key] = {}
                        ends[key] = {}
                    per_way[way] = per_way.get(way, 0.0) + seconds
                    both = ends[key].get(way)
                    if both is None:
                        both = ends[key][way] = (set(), set())
                    both[0].add(a)
                    both[1].add(b)
                    touched.add(key)
            priced.append((num_bytes, tuple(ways)))
        pairs_of.append(priced)
        keys_of.append(touched)
    crossings: dict[tuple[Hashable, tuple[int, bool], float], Crossing] = {}

    def crossing(key: Hashable, way: tuple[int, bool], capacity: float) -> Crossing:
        found = crossings.get((key, way, capacity))
        if found is None:
            senders, receivers = ends[key][way]
            found = crossings[key, way, capacity] = Crossing(
                streams=min(len(senders), len(receivers)),
                capacity_bytes_per_s=capacity,
                background_s=busy[key] - way_busy[key][way],
            )
        return found

    boundaries = []
    for priced, touched in zip(pairs_of, keys_of, strict=True):
        # Pairs that cross alike price alike: keep one of each (plain tuples as keys, the
        # records built once per distinct pair).
        distinct: dict[tuple[float, _WayKey, _WayKey], None] = {}
        for pair_bytes, pair_ways in priced:
            there, back = (
                (
                    latency_s,
                    bandwidth,
                    tuple(crossing(key, way, capacity) for key, capacity in resources),
                )
                for latency_s, bandwidth, resources, way in pair_ways
            )
            distinct[pair_bytes, there, back] = None
        boundaries.append(
            BoundaryTraffic(
                busy_s=max((busy[key] for key in touched), default=0.0),
                pairs=tuple(
                    PairHop(num_bytes=pair_bytes, there=_way(there), back=_way(back))
                    for pair_bytes, there, back in distinct
                ),
            )
        )
    return tuple(boundaries)


def _way(key: _WayKey) -> Way:
    latency_s, bandwidth, crossings = key
    return Way(latency_s=latency_s, bandwidth_bytes_per_s=bandwidth, crossings=crossings)
