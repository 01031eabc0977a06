"""Generators of per-rank action orders: 1F1B, interleaved 1F1B, the zero bubble family.

The fixed schedules are time-unaware, as in Megatron-LM and ``torch.distributed.pipelining``;
on equal stages (F, B, W per stage, p ranks, m micro-batches) they give:

===================  =============================================  ==========================
schedule             step time on equal stages                      peak in flight (rank 0)
===================  =============================================  ==========================
``one_f_one_b``      (m + p - 1)(F + B + W)                         p
``interleaved``      m(F+B+W) + (p - 1)(F+B+W)/v  (per-rank times)  above p (warm-up 2(p-1)+..)
``zb_h1``            m(F + B + W) + (p - 1)(F + B - W)              p
``zb_2p``            ZB-H1's (see below); less on slow first ranks  2p - 1
``zb_v``             V placement, 2p chunks; near zero bubble       2p chunks = p stages' worth
===================  =============================================  ==========================

(Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Table 2 and section 6; the
interleaved order is Megatron-LM's, Narayanan et al. 2021.) The paper's ZB-H2 bubble
(p - 1)(F + B - 2W) is that of back-to-back steps; in one step the last rank cannot start
before (p - 1)F, so a longer warm-up cannot go below m(F + B + W) + (p - 1)F, which is
ZB-H1's when F = B = W. "In flight" counts micro-batch
activations held from F until W (``schedule.replay``).

``heterogeneous`` is time-aware: given unequal per-stage times and per-rank caps on
micro-batches in flight, it runs a greedy list scheduler in the spirit of the zero bubble
paper's heuristic (forwards within the cap while no gradient has arrived, then a B as soon
as one is ready, an F when the cap allows, and a W in the time the rank would otherwise
idle), over a few settings of its knobs, replays every candidate together with the fixed
schedules above that fit the caps, and returns the fastest. It is therefore never slower
than a fixed schedule that fits.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from piebald.schedule.actions import Action, ActionKind, PipelineOrders, Placement
from piebald.schedule.replay import PassTimes, replay

__all__ = [
    "heterogeneous",
    "interleaved",
    "one_f_one_b",
    "zb_2p",
    "zb_h1",
    "zb_v",
]

F, B, W, BW = ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW


def _check(ranks: int, micro_batches: int) -> None:
    if ranks < 1:
        raise ValueError(f"a pipeline needs at least one rank, got {ranks}")
    if micro_batches < 1:
        raise ValueError(f"a step needs at least one micro-batch, got {micro_batches}")


def one_f_one_b(ranks: int, micro_batches: int) -> PipelineOrders:
    """1F1B (PipeDream-flush): rank r runs p - 1 - r warm-up forwards, then F/BW pairs."""
    _check(ranks, micro_batches)
    orders = []
    for rank in range(ranks):
        warmup = min(ranks - 1 - rank, micro_batches)
        order = [Action(kind=F, micro_batch=j) for j in range(warmup)]
        for j in range(micro_batches - warmup):
            order.append(Action(kind=F, micro_batch=warmup + j))
            order.append(Action(kind=BW, micro_batch=j))
        order.extend(
            Action(kind=BW, micro_batch=j) for j in range(micro_batches - warmup, micro_batches)
        )
        orders.append(tuple(order))
    return PipelineOrders(
        placement=Placement.classic(ranks),
        micro_batches=micro_batches,
        orders=tuple(orders),
        name="1F1B",
    )


def interleaved(ranks: int, chunks: int, micro_batches: int) -> PipelineOrders:
    """Megatron's interleaved 1F1B over the looped placement (v = ``chunks``).

    Micro-batches go through in rounds of p: a rank runs the round's forwards on chunk 0,
    then on chunk 1, and so on (backwards from the last chunk down). Rank r warms up with
    2(p - 1 - r) + (v - 1)p forwards, then alternates F and BW. Megatron requires m to be
    a multiple of p; so does this order (``ValueError`` otherwise).
    """
    _check(ranks, micro_batches)
    if chunks < 1:
        raise ValueError(f"interleaving needs at least one chunk per rank, got {chunks}")
    if micro_batches % ranks:
        raise ValueError(
            f"interleaved 1F1B needs micro-batches divisible by the {ranks} ranks,"
            f" got {micro_batches}"
        )
    total = chunks * micro_batches

    def forward(k: int) -> Action:
        group, within = divmod(k, ranks * chunks)
        return Action(kind=F, micro_batch=group * ranks + within % ranks, chunk=within // ranks)

    def backward(k: int) -> Action:
        group, within = divmod(k, ranks * chunks)
        return Action(
            kind=BW,
            micro_batch=group * ranks + within % ranks,
            chunk=chunks - 1 - within // ranks,
        )

    orders = []
    for rank in range(ranks):
        warmup = min(2 * (ranks - 1 - rank) + (chunks - 1) * ranks, total)
        order = [forward(k) for k in range(warmup)]
        for k in range(total - warmup):
            order.append(forward(warmup + k))
            order.append(backward(k))
        order.extend(backward(k) for k in range(total - warmup, total))
        orders.append(tuple(order))
    return PipelineOrders(
        placement=Placement.looped(ranks, chunks),
        micro_batches=micro_batches,
        orders=tuple(orders),
        name=f"interleaved-1F1B(v={chunks})",
    )


def _split_backward_order(micro_batches: int, warmup: int, defer: int) -> tuple[Action, ...]:
    """F x ``warmup``; then F, B pairs with each W held back ``defer`` B's; then B, W pairs.

    In the steady phase a W runs once more than ``defer`` W's are pending; in the cool-down
    every B is followed by the oldest pending W (the rank would wait for the next B anyway);
    the remaining W's close the step.
    """
    warmup = min(warmup, micro_batches)
    order = [Action(kind=F, micro_batch=j) for j in range(warmup)]
    pending: deque[int] = deque()
    for j in range(micro_batches - warmup):
        order.append(Action(kind=F, micro_batch=warmup + j))
        order.append(Action(kind=B, micro_batch=j))
        pending.append(j)
        if len(pending) > defer:
            order.append(Action(kind=W, micro_batch=pending.popleft()))
    for j in range(micro_batches - warmup, micro_batches):
        order.append(Action(kind=B, micro_batch=j))
        pending.append(j)
        order.append(Action(kind=W, micro_batch=pending.popleft()))
    order.extend(Action(kind=W, micro_batch=j) for j in pending)
    return tuple(order)


def zb_h1(ranks: int, micro_batches: int) -> PipelineOrders:
    """ZB-H1: 1F1B's warm-up with B and W split; rank r holds back its first r W's.

    The held-back W's fill the cool-down, where 1F1B idles; no rank holds more than p
    micro-batches (until W), as in 1F1B's rank 0.
    """
    return _split_backward(ranks, micro_batches, warm_up_per_rank=1, name="ZB-H1")


def zb_2p(ranks: int, micro_batches: int) -> PipelineOrders:
    """ZB-2p-style: rank r warms up with 2(p - 1 - r) forwards, W's held back as ZB-H1's.

    Rank 0 holds up to 2p - 1 micro-batches; the longer warm-up covers the time the first
    input gradient takes to come back, which ZB-H1 leaves idle.
    """
    return _split_backward(ranks, micro_batches, warm_up_per_rank=2, name="ZB-2p")


def _split_backward(
    ranks: int, micro_batches: int, *, warm_up_per_rank: int, name: str
) -> PipelineOrders:
    """ZB-H1's and ZB-2p's orders: rank r warms up with ``warm_up_per_rank`` x (p - 1 - r)
    forwards and holds back its first r W's."""
    _check(ranks, micro_batches)
    orders = tuple(
        _split_backward_order(micro_batches, warm_up_per_rank * (ranks - 1 - rank), rank)
        for rank in range(ranks)
    )
    return PipelineOrders(
        placement=Placement.classic(ranks),
        micro_batches=micro_batches,
        orders=orders,
        name=name,
    )


def zb_v(ranks: int, micro_batches: int) -> PipelineOrders:
    """ZB-V over the V placement (rank r holds stages r and 2p - 1 - r).

    Rank r: 2(p - r) - 1 forwards on chunk 0; r pairs of (F chunk 1, F chunk 0); p - r
    rounds of (F, B, W) on chunk 1; then the steady rounds (F, B, W on chunk 0, then on
    chunk 1) until every forward is issued; then r pairs of B (chunk 0, chunk 1) and p - r
    of (B, W) on chunk 0; the W's left close the step. Needs m >= 2p - 1.
    """
    _check(ranks, micro_batches)
    if micro_batches < 2 * ranks - 1:
        raise ValueError(f"ZB-V needs at least 2p - 1 = {2 * ranks - 1} micro-batches")
    orders = tuple(_zb_v_rank(ranks, rank, micro_batches) for rank in range(ranks))
    return PipelineOrders(
        placement=Placement.v_shape(ranks),
        micro_batches=micro_batches,
        orders=orders,
        name="ZB-V",
    )


def _zb_v_rank(ranks: int, rank: int, micro_batches: int) -> tuple[Action, ...]:
    order: list[Action] = []
    issued = {(kind, chunk): 0 for kind in (F, B, W) for chunk in (0, 1)}

    def emit(kind: ActionKind, chunk: int) -> None:
        order.append(Action(kind=kind, micro_batch=issued[kind, chunk], chunk=chunk))
        issued[kind, chunk] += 1

    for _ in range(2 * (ranks - rank) - 1):
        emit(F, 0)
    for _ in range(rank):
        emit(F, 1)
        emit(F, 0)
    for _ in range(ranks - rank):
        emit(F, 1)
        emit(B, 1)
        emit(W, 1)
    while issued[F, 1] < issued[F, 0] or issued[F, 0] < micro_batches:
        if issued[F, 0] < micro_batches:
            emit(F, 0)
        emit(B, 0)
        emit(W, 0)
        emit(F, 1)
        emit(B, 1)
        emit(W, 1)
    for _ in range(rank):
        emit(B, 0)
        emit(B, 1)
    for _ in range(ranks - rank):
        emit(B, 0)
        emit(W, 0)
    while issued[W, 1] < issued[B, 1]:
        emit(W, 1)
    while issued[W, 0] < issued[B, 0]:
        emit(W, 0)
    return tuple(order)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Knobs:
    """One setting of the greedy: per-rank forward limits, and how W fills gaps.

    ``fill``: "idle" runs a pending W whenever the rank would idle, "fits" only if it ends
    before the next known arrival, "late" only when the limit blocks the next F or nothing
    else is left (ZB-H1's deferral, time-aware).
    """

    limits: tuple[int, ...]
    fill: str
    backward_first: bool


def _greedy(
    times: Sequence[PassTimes], micro_batches: int, knobs: _Knobs, latency: float
) -> PipelineOrders:
    """Time-aware list scheduling of F, B, W on one chunk per rank (see the module doc).

    Ranks decide in time order. A free rank runs, in this order of preference: a B whose
    gradient has arrived (or an F first, when ``backward_first`` is off and the rank's last
    action was a B); an F whose input has arrived, while fewer than ``limits[rank]``
    micro-batches are held; a pending W, when ``knobs.fill`` allows (``_Knobs``) or the
    limit blocks the next F. Otherwise it waits for the next arrival.
    """
    ranks = len(times)
    # arrival[kind][rank][j]: when rank may start F (B) of micro-batch j, once known.
    arrival_f: list[dict[int, float]] = [{} for _ in range(ranks)]
    arrival_b: list[dict[int, float]] = [{} for _ in range(ranks)]
    for j in range(micro_batches):
        arrival_f[0][j] = 0.0
    next_f = [0] * ranks
    next_b = [0] * ranks
    pending_w: list[deque[int]] = [deque() for _ in range(ranks)]
    held = [0] * ranks
    last_kind: list[ActionKind | None] = [None] * ranks
    orders: list[list[Action]] = [[] for _ in range(ranks)]
    remaining = 3 * micro_batches * ranks
    # (time the rank is free or next worth a look, rank)
    wake: list[tuple[float, int]] = [(0.0, rank) for rank in range(ranks)]
    heapq.heapify(wake)
    free = [0.0] * ranks
    while remaining:
        if not wake:
            raise AssertionError("greedy schedule stalled")  # cannot happen: caps >= 1
        now, rank = heapq.heappop(wake)
        if now < free[rank]:
            continue
        j_f, j_b = next_f[rank], next_b[rank]
        f_at = arrival_f[rank].get(j_f) if j_f < micro_batches else None
        b_at = arrival_b[rank].get(j_b) if j_b < next_f[rank] else None
        f_ok = f_at is not None and held[rank] < knobs.limits[rank]
        f_ready = f_ok and f_at is not None and f_at <= now
        b_ready = b_at is not None and b_at <= now
        choice: ActionKind | None = None
        if b_ready and f_ready:
            prefer_f = not knobs.backward_first and last_kind[rank] is B
            choice = F if prefer_f else B
        elif b_ready:
            choice = B
        elif f_ready:
            choice = F
        elif pending_w[rank]:
            known = [at for at in (b_at, f_at if f_ok else None) if at is not None]
            fits = not known or min(known) >= now + times[rank].backward_weight
            last = next_f[rank] == next_b[rank] == micro_batches
            allowed = {"idle": True, "fits": fits, "late": last}[knobs.fill]
            if allowed or held[rank] >= knobs.limits[rank]:
                choice = W
        if choice is None:
            soon = [at for at in (b_at, f_at if f_ok else None) if at is not None and at > now]
            if soon:
                heapq.heappush(wake, (min(soon), rank))
            # else: woken when an arrival for this rank becomes known
            continue
        if choice is F:
            j = j_f
            next_f[rank] += 1
            held[rank] += 1
        elif choice is B:
            j = j_b
            next_b[rank] += 1
            pending_w[rank].append(j)
        else:
            j = pending_w[rank].popleft()
            held[rank] -= 1
        end = now + times[rank].of(choice)
        orders[rank].append(Action(kind=choice, micro_batch=j))
        last_kind[rank] = choice
        free[rank] = end
        remaining -= 1
        heapq.heappush(wake, (end, rank))
        # tell the neighbour what it may now start
        if choice is F:
            if rank + 1 < ranks:
                arrival_f[rank + 1][j] = end + latency
                heapq.heappush(wake, (max(end + latency, free[rank + 1]), rank + 1))
            else:
                arrival_b[rank][j] = end
        elif choice is B and rank > 0:
            arrival_b[rank - 1][j] = end + latency
            heapq.heappush(wake, (max(end + latency, free[rank - 1]), rank - 1))
    return PipelineOrders(
        placement=Placement.classic(ranks),
        micro_batches=micro_batches,
        orders=tuple(tuple(order) for order in orders),
        name="heterogeneous",
    )


def _fits(peaks: Sequence[int], caps: Sequence[int]) -> bool:
    return all(peak <= cap for peak, cap in zip(peaks, caps, strict=True))


def heterogeneous(
    times: Sequence[PassTimes],
    memory_caps: Sequence[int],
    micro_batches: int,
    *,
    latency: float = 0.0,
) -> PipelineOrders:
    """The fastest order found for one chunk per rank with ``times[rank]`` and caps.

    ``memory_caps[rank]`` bounds the micro-batches rank holds from F until W. Candidates:
    the greedy (module docstring) with forward limits from 1F1B's p - r up to the cap,
    W filling every gap or only gaps it fits, B before F or alternating; and 1F1B, ZB-H1
    and ZB-2p where they fit the caps. Ties go to the earlier candidate (fixed schedules
    first). ``ValueError`` if a cap is below 1 (nothing can run).
    """
    ranks = len(times)
    _check(ranks, micro_batches)
    if len(memory_caps) != ranks:
        raise ValueError(f"{len(memory_caps)} memory caps for {ranks} stages")
    if min(memory_caps) < 1:
        raise ValueError(f"every rank must hold at least one micro-batch, got {memory_caps}")
    candidates = [one_f_one_b(ranks, micro_batches), zb_h1(ranks, micro_batches)]
    candidates.append(zb_2p(ranks, micro_batches))
    best: tuple[float, PipelineOrders] | None = None
    for orders in candidates:
        result = replay(orders, times, latency=latency)
        if _fits(result.peak_in_flight, memory_caps) and (
            best is None or result.makespan < best[0]
        ):
            best = (result.makespan, orders)
    families = [
        tuple(min(cap, ranks - rank + extra) for rank, cap in enumerate(memory_caps))
        for extra in range(ranks)
    ]
    families.append(tuple(min(cap, ranks) for cap in memory_caps))
    families.append(tuple(memory_caps))
    tried: set[_Knobs] = set()
    for limits in families:
        for fill in ("idle", "fits", "late"):
            for backward_first in (True, False):
                knobs = _Knobs(limits=limits, fill=fill, backward_first=backward_first)
                if knobs in tried:
                    continue
                tried.add(knobs)
                orders = _greedy(times, micro_batches, knobs, latency)
                result = replay(orders, times, latency=latency)
                if best is None or result.makespan < best[0]:
                    best = (result.makespan, orders)
    assert best is not None
    return best[1]
