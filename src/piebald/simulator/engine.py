"""Discrete-event execution of a schedule: a heap of timed events, one state per rank.

Each rank walks its operation list (``piebald.schedule.ops`` says what each operation
does): compute operations run on the rank's compute stream once their inputs are there;
data-parallel operations queue on the rank's channel, once-per-step collectives starting
when every rank of the stage has reached them; a point-to-point transfer starts when both
its send and its receive are posted, waits its link's latency, then moves its bytes at the
rate it gets on the resources it shares with concurrent transfers
(``piebald.schedule.network``). Durations come from ``Prices`` (the planner's cost
functions), so differences from the closed-form estimate come from the schedule alone.

A tensor group's members (``Stage.tensor_groups``) run each pass together: a pass starts
once every member has reached it with its inputs there (the leader's received input, each
member's own gathers), on all members at once, since their all-reduces meet inside it. A
pass's price includes the group's communication (``Prices.tensor_forward_s``); the
timeline draws that share as its own segment at the pass's end ("tensor comm").

When no event is left and some rank has operations left, the step cannot finish: the
result carries a :class:`Deadlock` with every stuck rank, the operation it is stuck at, the
ranks it waits for, and a cycle of ranks waiting on each other.

Memory: a rank holds its static bytes (weights, gradients, optimizer state, working
buffers, reserve) all step, plus one micro-batch's activations from the start of its
forward until the end of its backward.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable

from piebald.schedule.build import StepSchedule, build_schedule
from piebald.schedule.network import MessageKey, StepMessages
from piebald.schedule.ops import (
    AllGatherParams,
    AllReduceGrads,
    Backward,
    Forward,
    GatherPassParams,
    Op,
    OptimizerStep,
    Pass,
    RecvActivation,
    RecvGradient,
    ReduceScatterGrads,
    ScatterPassGrads,
    SendActivation,
    SendGradient,
    describe_op,
)
from piebald.schedule.prices import Prices
from piebald.simulator.result import (
    TENSOR_COMM,
    Deadlock,
    Interval,
    Lane,
    RankStats,
    SimulationResult,
    Wait,
)
from piebald.specs.plan import Plan

__all__ = ["simulate"]

# Event kinds, in the heap as (time, sequence, kind, payload...); transfers keep their own.
_COMPUTE_DONE, _CHANNEL_DONE = range(2)
_IDLE, _BLOCKED = 0, 1  # what a compute operation last waited for: a peer, or its channel

_KIND = {
    Forward: "forward",
    Backward: "backward",
    OptimizerStep: "optimizer",
    GatherPassParams: "gather",
    ScatterPassGrads: "reduce-scatter",
    AllReduceGrads: "all-reduce",
    ReduceScatterGrads: "reduce-scatter",
    AllGatherParams: "all-gather",
}
_GROUP = (AllReduceGrads, ReduceScatterGrads, AllGatherParams)


class _RankState:
    __slots__ = (
        "blocked_s",
        "busy_s",
        "channel",
        "channel_busy",
        "computing",
        "data_parallel_group",
        "end_s",
        "free_since",
        "gather_end",
        "have",
        "in_flight",
        "needs",
        "ops",
        "outstanding",
        "passes_s",
        "pc",
        "peak_bytes",
        "rank",
        "stage",
        "tensor_group",
        "wait_reason",
        "waiting",
    )

    def __init__(
        self,
        rank: int,
        stage: int,
        ops: tuple[Op, ...],
        static_bytes: float,
        groups: tuple[tuple[int, ...], tuple[int, ...]],
    ) -> None:
        self.rank, self.stage, self.ops = rank, stage, ops
        self.tensor_group, self.data_parallel_group = groups
        self.pc = 0
        self.waiting = False
        self.computing = False
        self.free_since = 0.0
        self.wait_reason = _IDLE
        self.have: set[Hashable] = set()  # inputs there (or, for gathers, started)
        self.gather_end: dict[Hashable, float] = {}
        self.needs = _needs(ops)
        self.channel: deque[Op] = deque()
        self.channel_busy = False
        self.outstanding = 0  # data-parallel operations issued and not finished
        self.in_flight = 0
        self.peak_bytes = static_bytes
        self.busy_s = self.blocked_s = self.passes_s = self.end_s = 0.0


def _groups_of(plan: Plan) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every used rank's tensor group and data-parallel group (``Stage``'s)."""
    groups: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for stage in plan.stages:
        t = stage.tensor_parallel_degree
        # (Stage.data_parallel_group, one slice per position rather than a search per rank:
        # a stage may hold a thousand ranks.)
        by_position = [stage.ranks[offset::t] for offset in range(t)]
        for tensor_group in stage.tensor_groups:
            for offset, rank in enumerate(tensor_group):
                groups[rank] = (tensor_group, by_position[offset])
    return groups


def _needs(ops: tuple[Op, ...]) -> dict[int, tuple[tuple[Hashable, int | None], ...]]:
    """For each compute operation (by position), the inputs posted before it: (key, the
    rank that provides it, or None for the rank's own channel)."""
    pending: dict[tuple[bool, int], list[tuple[Hashable, int | None]]] = {}
    needs: dict[int, tuple[tuple[Hashable, int | None], ...]] = {}
    for index, op in enumerate(ops):
        key: Hashable
        if isinstance(op, RecvActivation):
            key = ("act", op.micro_batch)
            pending.setdefault((True, op.micro_batch), []).append((key, op.peer))
        elif isinstance(op, RecvGradient):
            key = ("grad", op.micro_batch)
            pending.setdefault((False, op.micro_batch), []).append((key, op.peer))
        elif isinstance(op, GatherPassParams):
            forward = op.for_pass is Pass.FORWARD
            key = ("gather", op.micro_batch, forward)
            pending.setdefault((forward, op.micro_batch), []).append((key, None))
        elif isinstance(op, Forward | Backward):
            needs[index] = tuple(pending.pop((isinstance(op, Forward), op.micro_batch), ()))
    return needs


class _Engine:
    def __init__(self, plan: Plan, schedule: StepSchedule, prices: Prices, record: bool) -> None:
        self.plan, self.prices, self.record = plan, prices, record
        groups = _groups_of(plan)
        self.ranks = {
            rank: _RankState(
                rank, plan.stage_of_rank[rank], ops, prices.static_memory_bytes(rank), groups[rank]
            )
            for rank, ops in schedule.rank_ops.items()
        }
        # Per tensor group and pass (leader, forward?, micro-batch): the members that have
        # reached it with their inputs there.
        self.lockstep: dict[tuple[int, bool, int], list[_RankState]] = {}
        self.events: list[tuple[float, int, int, object, object]] = []
        self.sequence = 0
        self.now = 0.0
        self.transfers = StepMessages(prices)
        self.arrivals: dict[tuple[int, type], list[_RankState]] = {}
        self.intervals: list[Interval] = []
        self.last_backward_s = 0.0

    # -- the event loop ------------------------------------------------------------------
    def push(self, time_s: float, kind: int, a: object, b: object = None) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (time_s, self.sequence, kind, a, b))

    def run(self) -> None:
        for state in self.ranks.values():
            self.walk(state)
        transfers = self.transfers
        while self.events or transfers:
            if transfers and (not self.events or transfers.next_s() <= self.events[0][0]):
                self.now = transfers.next_s()
                arrived = transfers.advance()
                if arrived is not None:
                    self.transfer_done(*arrived)
                continue
            self.now, _, kind, a, b = heapq.heappop(self.events)
            assert isinstance(a, _RankState)
            if kind == _COMPUTE_DONE:
                self.compute_done(a, b)
            else:
                self.channel_done(a, b)

    # -- a rank's walk -------------------------------------------------------------------
    def walk(self, state: _RankState) -> None:
        ops = state.ops
        while state.pc < len(ops):
            op = ops[state.pc]
            if isinstance(op, Forward | Backward | OptimizerStep):
                if isinstance(op, OptimizerStep):
                    ready = state.outstanding == 0
                else:
                    ready = all(key in state.have for key, _ in state.needs[state.pc])
                if not ready:
                    state.waiting = True
                    return
                if len(state.tensor_group) > 1 and isinstance(op, Forward | Backward):
                    self.meet(state, op)
                    return
                state.waiting = False
                state.pc += 1
                self.start_compute(state, op)
                return
            state.pc += 1
            if isinstance(op, SendActivation | SendGradient):
                key = (isinstance(op, SendActivation), op.micro_batch, state.rank, op.peer)
                self.transfers.post(key, sending=True, at_s=self.now)
            elif isinstance(op, RecvActivation | RecvGradient):
                key = (isinstance(op, RecvActivation), op.micro_batch, op.peer, state.rank)
                self.transfers.post(key, sending=False, at_s=self.now)
            else:
                state.channel.append(op)
                state.outstanding += 1
                self.pump(state)

    def meet(self, state: _RankState, op: Forward | Backward) -> None:
        """``state`` has reached ``op`` with its inputs there: start it on every member of
        its tensor group once all have."""
        key = (state.tensor_group[0], isinstance(op, Forward), op.micro_batch)
        arrived = self.lockstep.setdefault(key, [])
        if state not in arrived:
            arrived.append(state)
        if len(arrived) < len(state.tensor_group):
            state.waiting = True
            return
        del self.lockstep[key]
        for member in arrived:
            member.waiting = False
            member.pc += 1
            self.start_compute(member, op)

    def wake(self, state: _RankState, reason: int) -> None:
        if state.waiting and not state.computing:
            state.wait_reason = reason
            self.walk(state)

    def start_compute(self, state: _RankState, op: Forward | Backward | OptimizerStep) -> None:
        waited = self.now - state.free_since
        if state.wait_reason == _BLOCKED:
            state.blocked_s += waited
        rank = state.rank
        if isinstance(op, Forward):
            duration = self.prices.forward_s(rank)
            state.in_flight += 1
            held = self.prices.static_memory_bytes(rank) + state.in_flight * (
                self.prices.activation_bytes(rank)
            )
            state.peak_bytes = max(state.peak_bytes, held)
        elif isinstance(op, Backward):
            duration = self.prices.backward_s(rank)
            state.have.add(("backward started", op.micro_batch))
        else:
            duration = self.prices.optimizer_s(rank)
        end_s = self.now + duration
        if not isinstance(op, OptimizerStep):
            state.passes_s += duration
            # A pass streaming its parameters in ends no earlier than their gather.
            for key, provider in state.needs[state.pc - 1]:
                if provider is None:
                    end_s = max(end_s, state.gather_end[key])
        state.busy_s += duration
        state.blocked_s += max(0.0, end_s - self.now - duration)  # rounding aside
        state.computing = True
        self.push(end_s, _COMPUTE_DONE, state, op)
        if self.record:
            self.record_compute(state, op, end_s)
        if isinstance(op, Backward):
            self.pump(state)  # its reduce-scatter may start now

    def record_compute(
        self, state: _RankState, op: Forward | Backward | OptimizerStep, end_s: float
    ) -> None:
        """The compute operation's interval; a pass's tensor-parallel communication as
        its own segment at its end (it runs between the pass's kernels)."""
        rank, label = state.rank, describe_op(op)
        tensor_s = 0.0
        if isinstance(op, Forward):
            tensor_s = self.prices.tensor_forward_s(rank)
        elif isinstance(op, Backward):
            tensor_s = self.prices.tensor_backward_s(rank)
        split_s = max(self.now, end_s - tensor_s)
        self.intervals.append(
            Interval(
                rank=rank,
                lane=Lane.COMPUTE,
                kind=_KIND[type(op)],
                label=label,
                start_s=self.now,
                end_s=split_s if tensor_s > 0 else end_s,
            )
        )
        if tensor_s > 0:
            self.intervals.append(
                Interval(
                    rank=rank,
                    lane=Lane.COMPUTE,
                    kind=TENSOR_COMM,
                    label=f"tp {label}",
                    start_s=split_s,
                    end_s=end_s,
                )
            )

    def compute_done(self, state: _RankState, op: object) -> None:
        state.computing = False
        state.free_since = self.now
        state.wait_reason = _IDLE
        state.end_s = max(state.end_s, self.now)
        if isinstance(op, Backward):
            state.in_flight -= 1
            self.last_backward_s = max(self.last_backward_s, self.now)
        self.walk(state)

    # -- the data-parallel channel -----------------------------------------------------
    def channel_s(self, state: _RankState, op: Op) -> float:
        stage = self.prices.stages[state.stage]
        if isinstance(op, GatherPassParams):
            return stage.gather_pass_s
        if isinstance(op, ScatterPassGrads):
            return stage.scatter_pass_s
        if isinstance(op, AllReduceGrads):
            return stage.all_reduce_s
        if isinstance(op, ReduceScatterGrads):
            return stage.reduce_scatter_s
        return stage.all_gather_s

    def pump(self, state: _RankState) -> None:
        if state.channel_busy or not state.channel:
            return
        op = state.channel[0]
        if (
            isinstance(op, ScatterPassGrads)
            and ("backward started", op.micro_batch) not in state.have
        ):
            return
        if isinstance(op, _GROUP):
            key = (state.data_parallel_group[0], type(op))
            arrived = self.arrivals.setdefault(key, [])
            if state in arrived:
                return
            arrived.append(state)
            if len(arrived) < len(state.data_parallel_group):
                return
            del self.arrivals[key]
            members = arrived
        else:
            members = [state]
        duration = self.channel_s(state, op)
        if isinstance(op, GatherPassParams):
            gathered = ("gather", op.micro_batch, op.for_pass is Pass.FORWARD)
            state.have.add(gathered)
            state.gather_end[gathered] = self.now + duration
        for member in members:
            member.channel.popleft()
            member.channel_busy = True
            self.push(self.now + duration, _CHANNEL_DONE, member, op)
            if self.record:
                self.intervals.append(
                    Interval(
                        rank=member.rank,
                        lane=Lane.DATA_PARALLEL,
                        kind=_KIND[type(op)],
                        label=describe_op(op),
                        start_s=self.now,
                        end_s=self.now + duration,
                    )
                )

    def channel_done(self, state: _RankState, op: object) -> None:
        state.channel_busy = False
        state.outstanding -= 1
        state.end_s = max(state.end_s, self.now)
        self.pump(state)
        self.wake(state, _BLOCKED)

    # -- point to point ------------------------------------------------------------------
    def transfer_done(self, key: MessageKey, started_s: float, arrived_s: float) -> None:
        activation, j, sender, receiver = key
        state = self.ranks[receiver]
        state.have.add(("act" if activation else "grad", j))
        self.ranks[sender].end_s = max(self.ranks[sender].end_s, arrived_s)
        if self.record:
            what = "act" if activation else "grad"
            self.intervals.append(
                Interval(
                    rank=sender,
                    lane=Lane.P2P,
                    kind=f"send {'activation' if activation else 'gradient'}",
                    label=f"{what} {j} -> {receiver}",
                    start_s=started_s,
                    end_s=arrived_s,
                )
            )
        self.wake(state, _IDLE)

    # -- the verdict ---------------------------------------------------------------------
    def deadlock(self) -> Deadlock | None:
        waits: list[Wait] = []
        for state in self.ranks.values():
            finished = state.pc >= len(state.ops) and not state.channel and not state.computing
            if finished:
                continue
            waits.append(self.wait_of(state))
        if not waits:
            return None
        return Deadlock(waits=tuple(waits), cycle=_cycle({w.rank: w.waits_for for w in waits}))

    def wait_of(self, state: _RankState) -> Wait:
        blockers: set[int] = set()
        if state.pc < len(state.ops):
            op = state.ops[state.pc]
            for key, provider in state.needs.get(state.pc, ()):
                if key not in state.have:
                    blockers.add(provider if provider is not None else state.rank)
            if isinstance(op, Forward | Backward) and not blockers:
                meeting = (state.tensor_group[0], isinstance(op, Forward), op.micro_batch)
                met = {s.rank for s in self.lockstep.get(meeting, [])}
                blockers |= set(state.tensor_group) - met
            where = describe_op(op)
        else:
            where = "the end of its step"
        if state.channel and isinstance(state.channel[0], _GROUP):
            head = state.channel[0]
            key = (state.data_parallel_group[0], type(head))
            arrived = {s.rank for s in self.arrivals.get(key, [])}
            blockers |= set(state.data_parallel_group) - arrived
            where += f" (channel: {describe_op(head)})"
        blockers.discard(state.rank)
        return Wait(rank=state.rank, operation=where, waits_for=tuple(sorted(blockers)))

    def result(self) -> SimulationResult:
        deadlock = self.deadlock()
        step_s = max((state.end_s for state in self.ranks.values()), default=0.0)
        step_s = max(step_s, self.now)
        stats = []
        computing = 0
        passes_s = 0.0
        for rank in sorted(self.ranks):
            state = self.ranks[rank]
            if state.passes_s > 0:
                computing += 1
                passes_s += state.passes_s
            stats.append(
                RankStats(
                    rank=rank,
                    stage=state.stage,
                    device=self.plan.cluster.device_of(rank).name,
                    busy_s=state.busy_s,
                    blocked_s=state.blocked_s,
                    idle_s=max(0.0, step_s - state.busy_s - state.blocked_s),
                    peak_memory_bytes=state.peak_bytes,
                )
            )
        pipeline_s = self.last_backward_s
        bubble = 1.0 - passes_s / (computing * pipeline_s) if computing and pipeline_s else 0.0
        return SimulationResult(
            step_time_s=step_s,
            tokens_per_s=0.0 if deadlock or step_s <= 0 else self.plan.job.tokens_per_step / step_s,
            pipeline_s=pipeline_s,
            bubble_fraction=bubble,
            ranks=tuple(stats),
            intervals=tuple(sorted(self.intervals, key=lambda i: (i.rank, i.start_s))),
            deadlock=deadlock,
        )


def _cycle(edges: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """A cycle of the wait-for graph (ranks), first rank repeated last; () if none."""
    color: dict[int, int] = {}  # 1 on the current path, 2 done
    for root in sorted(edges):
        if root in color:
            continue
        path: list[int] = []
        stack: list[tuple[int, int]] = [(root, 0)]
        while stack:
            node, index = stack.pop()
            if index == 0:
                color[node] = 1
                path.append(node)
            nexts = edges.get(node, ())
            if index < len(nexts):
                stack.append((node, index + 1))
                child = nexts[index]
                if color.get(child) == 1:
                    return (*path[path.index(child) :], child)
                if child not in color:
                    stack.append((child, 0))
            else:
                color[node] = 2
                path.pop()
    return ()


def simulate(
    plan: Plan,
    *,
    schedule: StepSchedule | None = None,
    prices: Prices | None = None,
    record: bool = True,
) -> SimulationResult:
    """Execute one step of ``plan`` (by default its own schedule) event by event.

    ``record=False`` skips the timeline (faster, for verifying many plans).
    """
    prices = prices or Prices(plan)
    schedule = schedule or build_schedule(plan, prices=prices)
    engine = _Engine(plan, schedule, prices, record)
    engine.run()
    return engine.result()
