"""What a simulation reports: step time, per-rank time and memory, the timeline, and a
deadlock verdict naming the ranks and operations that wait on each other."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["TENSOR_COMM", "Deadlock", "Interval", "Lane", "RankStats", "SimulationResult", "Wait"]

# The kind of a pass's tensor-parallel share on the compute lane: its tensor group's
# all-reduces and input broadcast, drawn at the pass's end.
TENSOR_COMM = "tensor comm"


class Lane(StrEnum):
    """Where an interval ran: the compute stream, the data-parallel channel, the wire."""

    COMPUTE = "compute"
    DATA_PARALLEL = "data-parallel"
    P2P = "p2p"


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    rank: int
    lane: Lane
    kind: str  # forward, backward, tensor comm, send activation, gather, all-reduce, ...
    label: str  # F3, B3, act 3 -> 5, ...
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStats:
    rank: int
    stage: int
    device: str
    busy_s: float  # compute stream running (forward, backward, optimizer)
    blocked_s: float  # waiting for its own data-parallel traffic (gathers, collectives)
    idle_s: float  # the rest of the step: waiting for peers (pipeline bubble), done early
    peak_memory_bytes: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """A rank that cannot go on: the operation it is stuck at and the ranks it waits for."""

    rank: int
    operation: str
    waits_for: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadlock:
    waits: tuple[Wait, ...]
    cycle: tuple[int, ...]  # ranks that wait on each other in a ring, first repeated last

    def describe(self) -> str:
        ring = " -> ".join(str(rank) for rank in self.cycle)
        stuck = "; ".join(
            f"rank {w.rank} at {w.operation} waits for {list(w.waits_for)}" for w in self.waits
        )
        return f"deadlock: ranks {ring} wait on each other ({stuck})"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationResult:
    step_time_s: float  # when the last operation ended (or where the step stalled)
    tokens_per_s: float  # 0 when the step deadlocks
    pipeline_s: float  # when the last backward pass ended
    bubble_fraction: float  # 1 - compute of passes / (computing ranks x pipeline_s)
    ranks: tuple[RankStats, ...]
    intervals: tuple[Interval, ...]
    deadlock: Deadlock | None

    @property
    def peak_memory_bytes(self) -> dict[int, float]:
        return {stats.rank: stats.peak_memory_bytes for stats in self.ranks}
