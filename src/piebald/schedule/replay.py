"""Exact replay of ``PipelineOrders`` under per-stage F, B, W times.

Each rank executes its order one action at a time. An action starts when the rank is
free and its dependency has finished:

- F of stage s needs F of stage s - 1 of the same micro-batch (stage 0: nothing);
- B (or BW) of stage s needs the input gradient of stage s + 1, i.e. its B or BW; the
  last stage's needs its own F;
- W needs the same stage's B.

A dependency that crosses ranks adds ``latency`` (a constant point-to-point time per
stage boundary); one between two stages of the same rank (the turn of a V placement)
adds nothing. BW takes B + W. With every start fixed by its rank's previous action and
its one dependency, the replay is exact: no event order to choose.

Activations in flight are counted per rank in chunk-micro-batches (one micro-batch on one
chunk; on a placement of v chunks per rank that is 1/v of a classic rank's stage): held
from the F until the W (or the BW), and, for the zero bubble paper's M_B accounting, until
the B (or BW). Orders that wait on each other in a cycle raise ``PipelineDeadlockError``
saying what each stuck rank waits for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from piebald.schedule.actions import Action, ActionKind, PipelineOrders, Placement

__all__ = ["PassTimes", "PipelineDeadlockError", "Replay", "replay"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PassTimes:
    """One stage's time for one micro-batch: forward, input-gradient and weight-gradient."""

    forward: float
    backward_input: float
    backward_weight: float

    def __post_init__(self) -> None:
        if min(self.forward, self.backward_input, self.backward_weight) < 0:
            raise ValueError(f"pass times must be >= 0, got {self}")

    def of(self, kind: ActionKind) -> float:
        return {
            ActionKind.F: self.forward,
            ActionKind.B: self.backward_input,
            ActionKind.W: self.backward_weight,
            ActionKind.BW: self.backward_input + self.backward_weight,
        }[kind]


class PipelineDeadlockError(RuntimeError):
    """No rank can start its next action: the orders wait on each other."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    """The timeline of one step: per rank, (action, start, end) in execution order."""

    makespan: float
    busy: tuple[float, ...]
    peak_in_flight: tuple[int, ...]
    """Per rank, the most chunk-micro-batches held from F until W (or BW)."""
    peak_in_flight_freed_at_b: tuple[int, ...]
    """Per rank, the same, with activations freed at B (the zero bubble paper's M_B)."""
    timeline: tuple[tuple[tuple[Action, float, float], ...], ...]

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.makespan - busy for busy in self.busy)


def _dependency(
    placement: Placement, rank: int, action: Action
) -> tuple[ActionKind, int, int] | None:
    """What ``action`` on ``rank`` waits for, as (kind, stage, micro-batch); B means B or BW."""
    stage = placement.stage(rank, action.chunk)
    if action.kind is ActionKind.F:
        return None if stage == 0 else (ActionKind.F, stage - 1, action.micro_batch)
    if action.kind is ActionKind.W:
        return (ActionKind.B, stage, action.micro_batch)
    if stage == placement.stages - 1:
        return (ActionKind.F, stage, action.micro_batch)
    return (ActionKind.B, stage + 1, action.micro_batch)


def _peaks(order: Sequence[Action]) -> tuple[int, int]:
    until_w = until_b = peak_w = peak_b = 0
    for action in order:
        if action.kind is ActionKind.F:
            until_w += 1
            until_b += 1
        if action.kind in (ActionKind.W, ActionKind.BW):
            until_w -= 1
        if action.kind in (ActionKind.B, ActionKind.BW):
            until_b -= 1
        peak_w = max(peak_w, until_w)
        peak_b = max(peak_b, until_b)
    return peak_w, peak_b


def replay(orders: PipelineOrders, times: Sequence[PassTimes], *, latency: float = 0.0) -> Replay:
    """Run ``orders`` with ``times[stage]`` per stage; see the module docstring."""
    placement = orders.placement
    if len(times) != placement.stages:
        raise ValueError(f"{len(times)} stage times for {placement.stages} stages")
    if latency < 0:
        raise ValueError(f"latency must be >= 0, got {latency}")
    # (kind, stage, micro-batch) -> end time; B and BW both record "B" (the input gradient).
    done: dict[tuple[ActionKind, int, int], float] = {}
    ranks = placement.ranks
    position = [0] * ranks
    free = [0.0] * ranks
    busy = [0.0] * ranks
    timeline: list[list[tuple[Action, float, float]]] = [[] for _ in range(ranks)]

    progress = True
    while progress:
        progress = False
        for rank in range(ranks):
            order = orders.orders[rank]
            while position[rank] < len(order):
                action = order[position[rank]]
                needs = _dependency(placement, rank, action)
                ready = 0.0
                if needs is not None:
                    if needs not in done:
                        break
                    ready = done[needs]
                    if placement.holder(needs[1])[0] != rank:
                        ready += latency
                stage = placement.stage(rank, action.chunk)
                start = max(free[rank], ready)
                duration = times[stage].of(action.kind)
                end = start + duration
                kind = ActionKind.B if action.kind is ActionKind.BW else action.kind
                done[(kind, stage, action.micro_batch)] = end
                free[rank] = end
                busy[rank] += duration
                timeline[rank].append((action, start, end))
                position[rank] += 1
                progress = True
    stuck = [rank for rank in range(ranks) if position[rank] < len(orders.orders[rank])]
    if stuck:
        raise PipelineDeadlockError(_deadlock_message(orders, position, stuck))
    peaks = [_peaks(order) for order in orders.orders]
    return Replay(
        makespan=max(free, default=0.0),
        busy=tuple(busy),
        peak_in_flight=tuple(peak for peak, _ in peaks),
        peak_in_flight_freed_at_b=tuple(peak for _, peak in peaks),
        timeline=tuple(tuple(rows) for rows in timeline),
    )


def _deadlock_message(
    orders: PipelineOrders,
    position: list[int],
    stuck: list[int],
) -> str:
    placement = orders.placement
    lines = []
    for rank in stuck:
        action = orders.orders[rank][position[rank]]
        needs = _dependency(placement, rank, action)
        assert needs is not None  # an action without a dependency never waits
        kind, stage, micro_batch = needs
        holder, chunk = placement.holder(stage)
        what = f"{kind.value}{micro_batch} of stage {stage} (rank {holder} chunk {chunk})"
        if kind is ActionKind.B:
            what = f"the input gradient ({what}, B or BW)"
        blocker = orders.orders[holder]
        at = (
            f"rank {holder} is at position {position[holder]} ({blocker[position[holder]]})"
            if position[holder] < len(blocker)
            else f"rank {holder} has finished without it"
        )
        lines.append(
            f"rank {rank} position {position[rank]} ({action}, stage "
            f"{placement.stage(rank, action.chunk)}) waits for {what}; {at}"
        )
    return "pipeline deadlock, no action can start:\n  " + "\n  ".join(lines)
