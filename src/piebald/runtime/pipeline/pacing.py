"""Emulation pacing: each operation does its real work, then waits until the time the cost
model gives the emulated GPU has passed (times ``time_scale``).

The durations are the simulator's (``piebald.schedule.prices``): forward and backward of
the rank's stage part on its GPU type (a ZeRO-3 pass lasting at least its gather), the
activation hop alone on its link, and at the step's end the stage's collectives plus the
optimizer step on the owned shard. Times are read from ``time.monotonic``, one clock for
every process of the machine, so a message can carry the time its emulated link delivers
it. An operation whose real work takes longer than its emulated time is an overrun: the
step then reflects this machine, not the emulated cluster, and the run reports how often.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from piebald.runtime.distributed.collectives import all_reduce
from piebald.runtime.distributed.groups import CommGroup
from piebald.schedule.build import pass_durations_s
from piebald.schedule.prices import Prices
from piebald.specs.plan import Plan

__all__ = ["MAX_TIME_SCALE", "Pacer", "PacingReport"]

# Wall seconds per emulated second, at most: beyond it a step of a small model waits for
# days, and a deadline of inf or 1e300 s is past what a sleep accepts (`--time-scale`'s max).
MAX_TIME_SCALE = 1e6


@dataclass(frozen=True, slots=True, kw_only=True)
class PacingReport:
    operations: int  # paced operations so far
    overruns: int  # of them, those whose real work outlasted the emulated time
    overrun_s: float  # total real time beyond the emulated deadlines (unscaled wall seconds)


class Pacer:
    """Emulated durations of one rank's operations, and the waits that enforce them."""

    def __init__(self, *, plan: Plan, rank: int, prices: Prices, time_scale: float) -> None:
        if not (math.isfinite(time_scale) and 0 < time_scale <= MAX_TIME_SCALE):
            raise ValueError(
                f"time_scale = {time_scale}; expected a number in (0, {MAX_TIME_SCALE:g}]"
            )
        self.rank = rank
        self.prices = prices
        self.time_scale = time_scale
        stage_index = plan.stage_of_rank[rank]
        self.forward_s, self.backward_s = pass_durations_s(prices, rank, stage_index)
        comm = prices.stages[stage_index]
        self.step_end_s = (
            comm.all_reduce_s + comm.reduce_scatter_s + comm.all_gather_s + prices.optimizer_s(rank)
        )
        self._operations = 0
        self._overruns = 0
        self._overrun_s = 0.0

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def wait_until(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    def latest_arrival(self, group: CommGroup) -> float:
        """The latest ``now()`` over ``group`` (collective): when a synchronised operation
        can start."""
        now = torch.tensor([time.monotonic()], dtype=torch.float64)
        all_reduce(now, group=group, op=dist.ReduceOp.MAX)
        return float(now.item())

    def pace(self, *, started: float, emulated_s: float) -> None:
        """Wait until ``started + emulated_s * time_scale``; count an overrun if past it."""
        deadline = started + emulated_s * self.time_scale
        now = time.monotonic()
        self._operations += 1
        if now > deadline:
            self._overruns += 1
            self._overrun_s += now - deadline
        else:
            time.sleep(deadline - now)

    def arrival(self, peer: int) -> float:
        """When a message sent now to ``peer`` arrives over the emulated link."""
        return time.monotonic() + self.prices.transfer(self.rank, peer).alone_s * self.time_scale

    def report(self) -> PacingReport:
        return PacingReport(
            operations=self._operations, overruns=self._overruns, overrun_s=self._overrun_s
        )
