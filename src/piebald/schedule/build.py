"""Schedules: the ordered operations of every rank for one step of a plan.

One generator feeds the simulator and the runtime's pipeline executor (docs/design.md section 3):
``build_schedule(plan)`` is pure and deterministic, so both see the same lists.

Compute order. Every rank runs its micro-batches' forwards in ascending j and their
backwards in ascending j (the order micro-batches visit it).

- GPipe: all forwards, then all backwards. Deadlock-free: sorting every operation by the
  key (0, j, s) for F(j, s) and (1, j, p - s) for B(j, s) is a topological order of the
  dependencies F(j, s) -> F(j, s+1), F(j, p-1) -> B(j, p-1), B(j, s+1) -> B(j, s), and every
  rank's list is sorted by it.
- 1F1B for asymmetric, routed stages (picotron's warm-up / steady / cool-down, generalised):
  rank r of stage s may hold at most w_r micro-batches whose backward has not run, the
  number the memory estimate assumed (``prices.in_flight_limit``, which is
  ``cost.in_flight.stage_in_flight``: the plan's ``max_in_flight`` where it records one).
  Warm-up: forwards until w_r are in flight; steady state: one forward, one backward (the
  backward of the oldest in-flight micro-batch once its gradient is there, a forward once
  fewer than w_r are in flight and its activation is there); cool-down: the remaining
  backwards. Which of B and F comes next depends on when inputs arrive, so the order is
  found by a dry run of this greedy rule over the cost model's pass times and transfers
  (``one_f_one_b_dry_run``), the transfers waiting for their receives and sharing links
  and NICs as the engine's do (``Network``). (Priced alone, hops on FlashFlex's cluster,
  eight ranks to a 10 GbE NIC, came back ten times later than the dry run expected, and
  ranks waited for gradients with activations ready.) A rank starts whichever it can, and
  when it can start both, the kind it did not run last. (Taking the backward whenever its
  gradient is there empties the pipeline when gradients come back quickly: w_r backwards
  in a row, then w_r forwards, then a whole round trip's wait.) The dry run never stalls:
  let j* be the smallest micro-batch with an operation left and q the rank of its next
  one. If that is F(j*, s), every micro-batch q ran before j* is complete, so q holds none
  in flight and may start it (w_q >= 1); if it is B(j*, s), j* is q's oldest in flight
  and its gradient has arrived. (Either input arrives: q posted its receive when its pass
  of that kind RECEIVES_POSTED earlier ended.) Either way q can start something once
  free, and the rule never leaves a rank idle that can start something. The dry run's
  start order is then one global order that is topological (an operation starts only
  after its inputs finished, and its receive is posted at a point of its rank's list
  that an earlier operation reaches) and sorts every rank's list, so executing the lists
  with asynchronous sends cannot deadlock, whatever the real times.

Around the compute. A rank keeps RECEIVES_POSTED receives posted from each neighbouring
stage (``cost.memory`` counts their buffers): the first ones at the step's start, and the
next of a kind when a pass of that kind ends. A transfer moves only once its receive is
posted, and where a hop takes as long as a pass one pass of notice left inputs late. Before
running compute operation k a rank posts operation k+1's ZeRO traffic: under ZeRO-3 its
parameter gather, and before a backward under ZeRO-2/3 the reduce-scatter of its gradients
(both stream layer by layer alongside their pass, so one pass ahead, no more). After a
forward a rank sends the activation, after a backward the gradient of its input. The
step ends with the stage's collectives and the optimizer step (see ``ops``).

Tensor groups. Routes name a tensor group's leader, so the orders above, the dry run and
every transfer are the leaders'. A follower's list is its leader's without the
point-to-point operations: the same passes in the same order, which it runs in lockstep
with its leader (their tensor all-reduces meet inside every pass; the leader hands the
received input on as part of the pass, ``cost.rank_pass``), and the ZeRO traffic and
step-end collectives of its own data-parallel group (``Stage.data_parallel_group``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from piebald.cost.memory import RECEIVES_POSTED
from piebald.errors import SpecError
from piebald.schedule.network import StepMessages
from piebald.schedule.ops import (
    P2P_OPS,
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
)
from piebald.schedule.prices import Prices
from piebald.specs.plan import Plan, Schedule

__all__ = [
    "DryRun",
    "StepSchedule",
    "build_schedule",
    "check_schedule",
    "compute_orders",
    "one_f_one_b_dry_run",
    "pass_durations_s",
]

ComputeOp = Forward | Backward


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSchedule:
    """Every used rank's operations for one step, in issue order."""

    kind: Schedule
    rank_ops: Mapping[int, tuple[Op, ...]]


def _micro_batches_of(plan: Plan) -> dict[int, list[int]]:
    """The micro-batches each rank that routes name (a tensor group's leader) runs,
    ascending."""
    visits: dict[int, list[int]] = {rank: [] for stage in plan.stages for rank in stage.leaders}
    for j, route in enumerate(plan.routes):
        for rank in route:
            visits[rank].append(j)
    return visits


def _leader_of(plan: Plan) -> dict[int, int]:
    """Every used rank's tensor-group leader (itself at degree 1 and for leaders)."""
    return {
        rank: group[0] for stage in plan.stages for group in stage.tensor_groups for rank in group
    }


def _gpipe_orders(plan: Plan) -> dict[int, list[ComputeOp]]:
    orders: dict[int, list[ComputeOp]] = {}
    for rank, micro_batches in _micro_batches_of(plan).items():
        s = plan.stage_of_rank[rank]
        orders[rank] = [Forward(micro_batch=j, stage=s) for j in micro_batches] + [
            Backward(micro_batch=j, stage=s) for j in micro_batches
        ]
    return orders


def pass_durations_s(prices: Prices, rank: int, stage: int) -> tuple[float, float]:
    """Forward and backward as the estimate prices them: ZeRO-3 passes last at least as
    long as their gathers (and the backward's reduce-scatter)."""
    comm = prices.stages[stage]
    forward_s = max(prices.forward_s(rank), comm.gather_pass_s)
    backward_s = max(prices.backward_s(rank), comm.gather_pass_s + comm.scatter_pass_s)
    return forward_s, backward_s


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRun:
    """The 1F1B dry run's outcome: every rank's passes in order, and when each started."""

    orders: Mapping[int, tuple[ComputeOp, ...]]
    start_s: Mapping[int, tuple[float, ...]]


def one_f_one_b_dry_run(plan: Plan, prices: Prices) -> DryRun:
    """The greedy 1F1B dry run described in the module docstring."""
    last = plan.num_stages - 1
    routes = plan.routes
    queue = _micro_batches_of(plan)
    next_forward = dict.fromkeys(queue, 0)
    in_flight: dict[int, deque[int]] = {rank: deque() for rank in queue}
    limit = {rank: prices.in_flight_limit(rank) for rank in queue}
    free_at = dict.fromkeys(queue, 0.0)
    after_backward = dict.fromkeys(queue, False)  # the last pass the rank ran
    times = {rank: pass_durations_s(prices, rank, plan.stage_of_rank[rank]) for rank in queue}
    # When the input of F(j, s) / B(j, s) reaches its rank; absent until it has arrived.
    forward_ready: dict[tuple[int, int], float] = {(j, 0): 0.0 for j in range(len(routes))}
    backward_ready: dict[tuple[int, int], float] = {}
    orders: dict[int, list[ComputeOp]] = {rank: [] for rank in queue}
    starts: dict[int, list[float]] = {rank: [] for rank in queue}
    backwards_run = dict.fromkeys(queue, 0)
    transfers = StepMessages(prices)

    def receive(rank: int, j: int, *, activation: bool, at_s: float) -> None:
        s = plan.stage_of_rank[rank]
        sender = routes[j][s - 1 if activation else s + 1]
        transfers.post((activation, j, sender, rank), sending=False, at_s=at_s)

    for rank, micro_batches in queue.items():  # the receives posted at the step's start
        s = plan.stage_of_rank[rank]
        for j in micro_batches[:RECEIVES_POSTED] if s > 0 else ():
            receive(rank, j, activation=True, at_s=0.0)
        for j in micro_batches[:RECEIVES_POSTED] if s < last else ():
            receive(rank, j, activation=False, at_s=0.0)
    wakeups: list[tuple[float, int]] = [(0.0, rank) for rank in queue]
    heapq.heapify(wakeups)
    while wakeups or transfers:
        if transfers and (not wakeups or transfers.next_s() <= wakeups[0][0]):
            arrived = transfers.advance()
            if arrived is not None:
                (activation, j, _, receiver), _, now = arrived
                ready = forward_ready if activation else backward_ready
                ready[j, plan.stage_of_rank[receiver]] = now
                heapq.heappush(wakeups, (now, receiver))
            continue
        now, rank = heapq.heappop(wakeups)
        if free_at[rank] > now:
            continue
        s = plan.stage_of_rank[rank]
        forward_s, backward_s = times[rank]
        held = in_flight[rank]
        oldest = held[0] if held else -1
        backward = bool(held) and (oldest, s) in backward_ready
        if backward and after_backward[rank]:  # 1F1B alternates: a forward first, if any
            j = queue[rank][next_forward[rank]] if next_forward[rank] < len(queue[rank]) else -1
            forward = j >= 0 and len(held) < limit[rank]
            backward = not (forward and (j, s) in forward_ready)
        if backward:
            after_backward[rank] = True
            held.popleft()
            orders[rank].append(Backward(micro_batch=oldest, stage=s))
            end = now + backward_s
            if s > 0:
                key = (False, oldest, rank, routes[oldest][s - 1])
                transfers.post(key, sending=True, at_s=end)
            later = backwards_run[rank] + RECEIVES_POSTED
            backwards_run[rank] += 1
            if s < last and later < len(queue[rank]):
                receive(rank, queue[rank][later], activation=False, at_s=end)
        elif next_forward[rank] < len(queue[rank]) and len(held) < limit[rank]:
            j = queue[rank][next_forward[rank]]
            if (j, s) not in forward_ready:
                continue  # woken again when the activation arrives
            next_forward[rank] += 1
            after_backward[rank] = False
            held.append(j)
            orders[rank].append(Forward(micro_batch=j, stage=s))
            end = now + forward_s
            if s < last:
                transfers.post((True, j, rank, routes[j][s + 1]), sending=True, at_s=end)
            else:
                backward_ready[j, s] = end
            later = next_forward[rank] - 1 + RECEIVES_POSTED
            if s > 0 and later < len(queue[rank]):
                receive(rank, queue[rank][later], activation=True, at_s=end)
        else:
            continue
        starts[rank].append(now)
        free_at[rank] = end
        heapq.heappush(wakeups, (end, rank))
    for rank, order in orders.items():
        assert len(order) == 2 * len(queue[rank]), f"1F1B dry run stalled on rank {rank}"
    return DryRun(
        orders={rank: tuple(order) for rank, order in orders.items()},
        start_s={rank: tuple(times) for rank, times in starts.items()},
    )


def compute_orders(plan: Plan, prices: Prices) -> dict[int, list[ComputeOp]]:
    """Forward and backward passes of every used rank, in the order it runs them (a tensor
    group's members in its leader's)."""
    if plan.schedule is Schedule.GPIPE:
        leaders = _gpipe_orders(plan)
    else:
        dry_run = one_f_one_b_dry_run(plan, prices)
        leaders = {rank: list(order) for rank, order in dry_run.orders.items()}
    return {rank: list(leaders[leader]) for rank, leader in _leader_of(plan).items()}


def _receive(plan: Plan, op: ComputeOp) -> list[Op]:
    """The transfer a pass needs from a neighbouring stage, if any."""
    j, s = op.micro_batch, op.stage
    if isinstance(op, Forward):
        return [RecvActivation(micro_batch=j, peer=plan.routes[j][s - 1])] if s > 0 else []
    if s < plan.num_stages - 1:
        return [RecvGradient(micro_batch=j, peer=plan.routes[j][s + 1])]
    return []


def _channel_inputs(plan: Plan, op: ComputeOp) -> list[Op]:
    """A pass's per-pass ZeRO traffic: the parameter gather it streams (ZeRO-3) and the
    reduce-scatter that runs alongside a backward (ZeRO-2/3)."""
    stage = plan.stages[op.stage]
    if _data_parallel_size(plan, op.stage) == 1:
        return []
    ops: list[Op] = []
    if stage.zero.gathers_per_pass:
        for_pass = Pass.FORWARD if isinstance(op, Forward) else Pass.BACKWARD
        ops.append(GatherPassParams(micro_batch=op.micro_batch, for_pass=for_pass))
    if isinstance(op, Backward) and stage.zero.reduces_per_pass:
        ops.append(ScatterPassGrads(micro_batch=op.micro_batch))
    return ops


def _outputs(plan: Plan, rank: int, op: ComputeOp) -> list[Op]:
    j, s = op.micro_batch, op.stage
    if isinstance(op, Forward):
        if s < plan.num_stages - 1:
            return [SendActivation(micro_batch=j, peer=plan.routes[j][s + 1])]
        return []
    if s > 0:
        return [SendGradient(micro_batch=j, peer=plan.routes[j][s - 1])]
    return []


def _data_parallel_size(plan: Plan, s: int) -> int:
    """Ranks in each data-parallel group of stage ``s`` (its tensor groups)."""
    stage = plan.stages[s]
    return len(stage.ranks) // stage.tensor_parallel_degree


def _step_end(plan: Plan, s: int) -> list[Op]:
    stage = plan.stages[s]
    shared = _data_parallel_size(plan, s) > 1  # a one-rank group has nothing to exchange
    ops: list[Op] = []
    if shared and stage.zero.step_end_all_reduce:
        ops.append(AllReduceGrads(stage=s))
    if shared and stage.zero.step_end_reduce_scatter:
        ops.append(ReduceScatterGrads(stage=s))
    ops.append(OptimizerStep(stage=s))
    if shared and stage.zero.step_end_all_gather:
        ops.append(AllGatherParams(stage=s))
    return ops


def build_schedule(plan: Plan, *, prices: Prices | None = None) -> StepSchedule:
    """The operations of every used rank for one step of ``plan`` (deterministic)."""
    prices = prices or Prices(plan)
    rank_ops: dict[int, tuple[Op, ...]] = {}
    orders = compute_orders(plan, prices)
    leader_of = _leader_of(plan)
    for rank, order in orders.items():
        if leader_of[rank] != rank:
            continue  # a follower: its leader's list, below
        # Passes by kind, in order: the k-th forward reads the receive posted when
        # forward k - RECEIVES_POSTED ended (at the step's start for the first ones).
        by_kind = {
            kind: [op for op in order if isinstance(op, kind)] for kind in (Forward, Backward)
        }
        ops: list[Op] = []
        for passes in by_kind.values():
            for later in passes[:RECEIVES_POSTED]:
                ops += _receive(plan, later)
        ops += _channel_inputs(plan, order[0]) if order else []
        run = dict.fromkeys(by_kind, 0)
        for k, op in enumerate(order):
            if k + 1 < len(order):  # ZeRO traffic streams alongside its pass: one ahead
                ops += _channel_inputs(plan, order[k + 1])
            ops.append(op)
            ops += _outputs(plan, rank, op)
            passes = by_kind[type(op)]
            run[type(op)] += 1
            if run[type(op)] - 1 + RECEIVES_POSTED < len(passes):
                ops += _receive(plan, passes[run[type(op)] - 1 + RECEIVES_POSTED])
        ops += _step_end(plan, plan.stage_of_rank[rank])
        rank_ops[rank] = tuple(ops)
    # A follower runs its leader's passes in lockstep (their collectives meet inside every
    # pass) and its own data-parallel group's traffic, but talks to no other stage.
    rank_ops = {
        rank: rank_ops[rank]
        if leader == rank
        else tuple(op for op in rank_ops[leader] if not isinstance(op, P2P_OPS))
        for rank, leader in leader_of.items()
    }
    schedule = StepSchedule(kind=plan.schedule, rank_ops=rank_ops)
    check_schedule(plan, schedule)
    return schedule


def _fail(field: str, value: object, expected: str) -> SpecError:
    return SpecError(source="schedule", field=field, value=value, expected=expected)


def _check_lockstep(plan: Plan, schedule: StepSchedule) -> None:
    """The ranks of a ZeRO-2/3 stage meet in collectives inside every pass, so each must
    run the same sequence of pass kinds (``specs.plan`` makes it so)."""
    for index, stage in enumerate(plan.stages):
        if not stage.zero.per_pass or len(stage.ranks) == 1:
            continue
        patterns = {
            rank: "".join(
                "F" if isinstance(op, Forward) else "B"
                for op in schedule.rank_ops.get(rank, ())
                if isinstance(op, Forward | Backward)
            )
            for rank in stage.ranks
        }
        if len(set(patterns.values())) > 1:
            raise _fail(
                f"stage {index}",
                {rank: pattern[:16] for rank, pattern in patterns.items()},
                f"one pass pattern on every rank of a {stage.zero.value!r} stage (its ranks "
                "gather and reduce-scatter together inside every pass)",
            )


def _check_followers(plan: Plan, schedule: StepSchedule) -> None:
    """A tensor group's members run its leader's passes in its order and send and receive
    nothing (its leader talks to the other stages for it)."""
    for rank, leader in _leader_of(plan).items():
        if rank == leader:
            continue
        ops = schedule.rank_ops.get(rank, ())
        passes = [op for op in ops if isinstance(op, Forward | Backward)]
        led = [op for op in schedule.rank_ops.get(leader, ()) if isinstance(op, Forward | Backward)]
        talks = [op for op in ops if isinstance(op, P2P_OPS)]
        if passes != led or talks:
            raise _fail(
                f"rank {rank}",
                {"passes": passes[:4], "leader's": led[:4], "transfers": talks[:4]},
                f"the passes of its tensor-group leader {leader}, in its order, and no transfers",
            )


def check_schedule(plan: Plan, schedule: StepSchedule) -> None:
    """Every send has one matching receive, every rank runs the forward and backward of
    exactly the micro-batches routed through it (through its tensor-group leader), a
    follower in its leader's order and without transfers, and the ranks of a ZeRO-2/3
    stage run their passes in one pattern (a deadlock is the engine's to find)."""
    sends: dict[tuple[str, int, int, int], int] = {}
    recvs: dict[tuple[str, int, int, int], int] = {}
    for rank, ops in schedule.rank_ops.items():
        for op in ops:
            if isinstance(op, SendActivation | SendGradient):
                kind = "activation" if isinstance(op, SendActivation) else "gradient"
                key = (kind, op.micro_batch, rank, op.peer)
                sends[key] = sends.get(key, 0) + 1
            elif isinstance(op, RecvActivation | RecvGradient):
                kind = "activation" if isinstance(op, RecvActivation) else "gradient"
                key = (kind, op.micro_batch, op.peer, rank)
                recvs[key] = recvs.get(key, 0) + 1
    if sends != recvs or any(count != 1 for count in sends.values()):
        unmatched = sorted(set(sends.items()) ^ set(recvs.items()))[:3]
        raise _fail(
            "sends/receives",
            unmatched,
            "each (kind, micro-batch, sender, receiver) sent once and received once",
        )
    _check_lockstep(plan, schedule)
    _check_followers(plan, schedule)
    routed = _micro_batches_of(plan)
    expected = {rank: routed[leader] for rank, leader in _leader_of(plan).items()}
    for rank, micro_batches in expected.items():
        ops = schedule.rank_ops.get(rank, ())
        forwards = sorted(op.micro_batch for op in ops if isinstance(op, Forward))
        backwards = sorted(op.micro_batch for op in ops if isinstance(op, Backward))
        if forwards != micro_batches or backwards != micro_batches:
            raise _fail(
                f"rank {rank}",
                {"forwards": forwards[:8], "backwards": backwards[:8]},
                f"one forward and one backward of each routed micro-batch {micro_batches[:8]}",
            )
