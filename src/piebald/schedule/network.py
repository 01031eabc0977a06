"""Transfers in flight and the bandwidth they share.

Each transfer occupies a few physical resources (a GPU's port, a node's NIC in one
direction, a site link; ``piebald.schedule.prices.Transfer``). Concurrent transfers on a
resource share it equally: a transfer moves at

    rate = min(B_path, min over its resources r of capacity_r / flows_r),

the path's own rate when alone (``link_between``'s bandwidth) capped by its fair share of
every resource it crosses. (Equal split per resource, not max-min water-filling: a flow
held back elsewhere does not lend its unused share; this errs on the slow side.) Whenever
a transfer starts or ends, the transfers sharing a resource with it are settled at their old
rate and re-timed; their earlier completion times become stale (versions tell them apart).

``StepMessages`` puts the messages of a step on that network: a transfer starts once both
its send and its receive are posted (NCCL's send/recv are a rendezvous), waits its link's
latency, then moves its bytes. The engine and the schedule's 1F1B dry run
(``schedule.build``) both move their messages through it, so the dry run foresees
the engine's timeline.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass

from piebald.schedule.prices import Prices

__all__ = ["MessageKey", "Network", "StepMessages"]

# A message: (an activation, not a gradient?, micro-batch, sender, receiver).
MessageKey = tuple[bool, int, int, int]


@dataclass(slots=True)
class _Flow:
    remaining_bytes: float
    path_bytes_per_s: float
    resources: tuple[Hashable, ...]
    rate_bytes_per_s: float = 0.0
    updated_s: float = 0.0
    version: int = 0


class Network:
    """Active transfers; ``start`` and ``finish`` return the re-timed completions as
    (flow id, completion time, version) for the event loop to schedule."""

    def __init__(self) -> None:
        self._flows: dict[int, _Flow] = {}
        self._users: dict[Hashable, set[int]] = {}
        self._capacity: dict[Hashable, float] = {}

    def __len__(self) -> int:
        return len(self._flows)

    def is_current(self, flow_id: int, version: int) -> bool:
        flow = self._flows.get(flow_id)
        return flow is not None and flow.version == version

    def rate_bytes_per_s(self, flow_id: int) -> float:
        return self._flows[flow_id].rate_bytes_per_s

    def start(
        self,
        flow_id: int,
        *,
        now_s: float,
        num_bytes: float,
        path_bytes_per_s: float,
        resources: tuple[tuple[Hashable, float], ...],
    ) -> list[tuple[int, float, int]]:
        keys = tuple(key for key, _ in resources)
        for key, capacity in resources:
            self._capacity[key] = capacity
            self._users.setdefault(key, set()).add(flow_id)
        self._flows[flow_id] = _Flow(
            remaining_bytes=num_bytes,
            path_bytes_per_s=path_bytes_per_s,
            resources=keys,
            updated_s=now_s,
        )
        return self._retime(self._sharing(keys), now_s)

    def finish(self, flow_id: int, *, now_s: float) -> list[tuple[int, float, int]]:
        flow = self._flows.pop(flow_id)
        for key in flow.resources:
            self._users[key].discard(flow_id)
        return self._retime(self._sharing(flow.resources), now_s)

    def _sharing(self, keys: tuple[Hashable, ...]) -> set[int]:
        affected: set[int] = set()
        for key in keys:
            affected |= self._users[key]
        return affected

    def _retime(self, flow_ids: set[int], now_s: float) -> list[tuple[int, float, int]]:
        out = []
        for flow_id in sorted(flow_ids):  # sorted: deterministic event order
            flow = self._flows[flow_id]
            flow.remaining_bytes = max(
                0.0, flow.remaining_bytes - flow.rate_bytes_per_s * (now_s - flow.updated_s)
            )
            flow.updated_s = now_s
            flow.rate_bytes_per_s = min(
                flow.path_bytes_per_s,
                min(self._capacity[key] / len(self._users[key]) for key in flow.resources),
            )
            flow.version += 1
            out.append(
                (flow_id, now_s + flow.remaining_bytes / flow.rate_bytes_per_s, flow.version)
            )
        return out


class StepMessages:
    """The point-to-point messages of one step, in time order: post each end with
    :meth:`post`, then :meth:`advance` through the events while :meth:`next_s` is due."""

    def __init__(self, prices: Prices) -> None:
        self.prices = prices
        self.network = Network()
        self._events: list[tuple[float, int, int]] = []  # (time, flow, version; -1: start)
        self._flows: list[tuple[MessageKey, float]] = []  # key, when both ends were posted
        self._half_posted: dict[MessageKey, tuple[bool, float]] = {}  # (a send?, when)

    def __bool__(self) -> bool:
        return bool(self._events)

    def next_s(self) -> float:
        """When the next event is due (only while there is one)."""
        return self._events[0][0]

    def post(self, key: MessageKey, *, sending: bool, at_s: float) -> None:
        """Post the send (or the receive) of ``key`` at ``at_s``; once the other end is
        posted too, the transfer starts after its link's latency."""
        other = self._half_posted.pop(key, None)
        if other is None:
            self._half_posted[key] = (sending, at_s)
            return
        assert other[0] is not sending, f"{key} posted twice by one end"
        start_s = max(at_s, other[1])
        self._flows.append((key, start_s))
        latency_s = self.prices.transfer(key[2], key[3]).link.latency_s
        heapq.heappush(self._events, (start_s + latency_s, len(self._flows) - 1, -1))

    def advance(self) -> tuple[MessageKey, float, float] | None:
        """Process the next event: (key, when both ends were posted, when it arrived) if a
        message arrived."""
        now_s, flow, version = heapq.heappop(self._events)
        key, posted_s = self._flows[flow]
        if version >= 0:
            if not self.network.is_current(flow, version):
                return None  # re-timed since this completion was scheduled
            self._retime(self.network.finish(flow, now_s=now_s))
            return key, posted_s, now_s
        transfer = self.prices.transfer(key[2], key[3])
        bandwidth = transfer.link.bandwidth_bytes_per_s
        if transfer.num_bytes <= 0 or math.isinf(bandwidth):
            return key, posted_s, now_s
        self._retime(
            self.network.start(
                flow,
                now_s=now_s,
                num_bytes=transfer.num_bytes,
                path_bytes_per_s=bandwidth,
                resources=transfer.resources,
            )
        )
        return None

    def _retime(self, completions: list[tuple[int, float, int]]) -> None:
        for flow, time_s, version in completions:
            heapq.heappush(self._events, (time_s, flow, version))
