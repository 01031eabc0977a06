"""Uneven reduce-scatter and all-gather of a flat buffer over a group (plain SUM only).

Rank i of a group owns ``ranges[i]`` of the flat buffer (ranges tile it in group order,
:mod:`piebald.runtime.distributed.shard_layout`). Neither gloo nor NCCL has an uneven
reduce-scatter/all-gather primitive, so (measured in docs/research/torch_distributed.md s.3 and
again here, 16 MB fp32, 3 ranks at 50/30/20 on 2 cores):

* gloo reduce-scatter: ``all_to_all_single`` with split sizes (each rank sends every owner
  its slice), then a local sum over senders: 15-24 ms against 22-54 ms for the list
  ``reduce_scatter`` (correct on gloo in torch 2.13, kept as an alternative).
* gloo all-gather: one ``broadcast`` per owner, straight into the owner's slice of the
  buffer: 26-33 ms and no extra memory (``all_gather`` refuses uneven sizes on gloo,
  ``all_to_all_single`` as an all-gather measured 46-64 ms).
* NCCL: pad every shard to the largest one and use the ring ``reduce_scatter_single`` /
  ``all_gather_single``. Padding costs ``group_size * max_fraction`` of the ideal traffic
  (1.5x at 50/30/20), still below an all-reduce's 2x for the plans the planner makes. The
  same padded path runs on gloo (equal sizes are fine there), which is how it is tested.

A group of one rank communicates with nobody: the reduce-scatter returns its input slice
and the all-gather does nothing.

Gloo runs each collective on a worker thread, which lets go of the work, and so of its
tensors, a moment after marking it complete: a buffer its caller drops right after the
call could live on into what the caller allocates next (it did in about one call in ten,
measured with ``Tensor._use_count``), which makes a rank's peak memory vary from run to
run. On gloo every collective here therefore returns only once the backend holds none of
its tensors (``_Held``), as on NCCL, where buffers are stream-ordered.

Every reduction is a plain SUM: the 1/num_tokens weight is in the loss (docs/design.md
section 3; gloo has no PREMUL_SUM and AVG would be wrong for uneven batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from enum import StrEnum

import torch
import torch.distributed as dist

from piebald.runtime.distributed.groups import CommGroup
from piebald.runtime.distributed.shard_layout import ShardRange, padded_shard_size

__all__ = [
    "CollectiveMethod",
    "PendingGather",
    "all_gather_uneven",
    "all_reduce",
    "all_reduce_sum",
    "barrier",
    "broadcast",
    "received_share",
    "reduce_scatter_uneven",
]


class CollectiveMethod(StrEnum):
    AUTO = "auto"  # padded on NCCL; all-to-all (RS) and broadcast (AG) on gloo
    PADDED = "padded"  # reduce_scatter_single / all_gather_single on shards padded to the max
    ALL_TO_ALL = "all_to_all"  # all_to_all_single with split sizes
    BROADCAST = "broadcast"  # all-gather only: one broadcast per owner
    LIST = "list"  # reduce-scatter only: list reduce_scatter


# Longer than any worker thread takes to let go (well under a millisecond here), short
# enough that a tensor someone else keeps costs one second, not a hang.
_RELEASE_TIMEOUT_S = 1.0


class _Held:
    """The references a collective's tensors have before it starts; :meth:`released`
    waits until the backend has dropped its own (gloo; NCCL holds none to wait for)."""

    def __init__(self, group: CommGroup, *tensors: torch.Tensor) -> None:
        self._tensors = tensors if group.backend == "gloo" else ()
        self._counts = [_references(t) for t in self._tensors]

    def released(self) -> None:
        deadline = time.monotonic() + _RELEASE_TIMEOUT_S
        while time.monotonic() < deadline and any(
            _references(t) > n for t, n in zip(self._tensors, self._counts, strict=True)
        ):
            time.sleep(0)


def _references(tensor: torch.Tensor) -> int:
    """Owners of the tensor's C++ object (Python's wrapper, a backend's work, ...)."""
    return int(tensor._use_count())  # type: ignore[attr-defined]  # untyped in torch 2.13


def _check(full: torch.Tensor, ranges: Sequence[ShardRange], group: CommGroup) -> None:
    if len(ranges) != group.size:
        raise ValueError(f"{len(ranges)} shard ranges for a group of {group.size} ranks")
    if full.dim() != 1 or not full.is_contiguous() or ranges[-1].end != full.numel():
        raise ValueError(
            f"flat buffer of shape {tuple(full.shape)}: expected contiguous 1-D with "
            f"{ranges[-1].end} elements"
        )


def _resolve(method: CollectiveMethod, group: CommGroup, *, gloo: CollectiveMethod) -> str:
    if method is not CollectiveMethod.AUTO:
        return method.value
    return CollectiveMethod.PADDED.value if group.backend == "nccl" else gloo.value


def received_share(shares: Sequence[float], *, index: int, backend: str) -> float:
    """The share of the buffer that :func:`reduce_scatter_uneven` (method AUTO) takes from
    each rank of the group, for the rank at ``index``: every part padded to the largest
    on NCCL, the rank's own part on gloo (``cost.memory`` prices group size x this)."""
    return max(shares) if backend == "nccl" else shares[index]


def reduce_scatter_uneven(
    full: torch.Tensor,
    ranges: Sequence[ShardRange],
    *,
    group: CommGroup,
    rank: int,
    method: CollectiveMethod = CollectiveMethod.AUTO,
) -> torch.Tensor:
    """The sum over the group of every rank's ``full[ranges[me]]``; may alias ``full``."""
    _check(full, ranges, group)
    index = group.index_of(rank)
    mine = ranges[index]
    if group.size == 1:
        return full[mine.start : mine.end]
    pg = group.process_group
    chosen = _resolve(method, group, gloo=CollectiveMethod.ALL_TO_ALL)
    if chosen == CollectiveMethod.ALL_TO_ALL:
        received = full.new_empty(group.size * mine.numel)
        held = _Held(group, received, full)
        dist.all_to_all_single(
            received,
            full,
            output_split_sizes=[mine.numel] * group.size,
            input_split_sizes=[r.numel for r in ranges],
            group=pg,
        )
        held.released()
        return received.view(group.size, mine.numel).sum(dim=0)
    if chosen == CollectiveMethod.LIST:
        out = full.new_empty(mine.numel)
        parts = [full[r.start : r.end] for r in ranges]
        held = _Held(group, out, *parts)
        dist.reduce_scatter(out, parts, group=pg)
        held.released()
        return out
    if chosen == CollectiveMethod.PADDED:
        width = padded_shard_size(ranges)
        padded = full.new_zeros(group.size, width)
        for i, r in enumerate(ranges):
            padded[i, : r.numel].copy_(full[r.start : r.end])
        out = full.new_empty(width)
        flat = padded.view(-1)
        held = _Held(group, out, flat)
        dist.reduce_scatter_single(out, flat, group=pg)
        held.released()
        return out[: mine.numel]
    raise ValueError(
        f"reduce-scatter method {method.value!r}: expected auto, padded, all_to_all, list"
    )


class PendingGather:
    """An all-gather under way (``all_gather_uneven(..., async_op=True)``): :meth:`wait`
    blocks until every shard has landed in the buffer. Waiting twice is harmless."""

    def __init__(
        self,
        works: Sequence[dist.Work] = (),
        finish: Callable[[], None] | None = None,
        held: _Held | None = None,
    ) -> None:
        self._works = list(works)
        self._finish = finish
        self._held = held

    def wait(self) -> None:
        while self._works:
            self._works.pop(0).wait()  # and dropped: a work holds its tensors
        if self._held is not None:
            held, self._held = self._held, None
            held.released()
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()


def all_gather_uneven(
    full: torch.Tensor,
    ranges: Sequence[ShardRange],
    *,
    group: CommGroup,
    rank: int,
    method: CollectiveMethod = CollectiveMethod.AUTO,
    async_op: bool = False,
) -> PendingGather:
    """In place: on entry ``full[ranges[me]]`` holds this rank's shard; on exit (of this
    call, or of ``wait()`` on what it returns with ``async_op``) every rank's ``full``
    holds every owner's shard. With ``async_op`` the communication runs in the
    background (the ZeRO-3 prefetch of the next layer while this one computes)."""
    _check(full, ranges, group)
    pending = _start_all_gather(full, ranges, group=group, rank=rank, method=method)
    if not async_op:
        pending.wait()
    return pending


def _start_all_gather(
    full: torch.Tensor,
    ranges: Sequence[ShardRange],
    *,
    group: CommGroup,
    rank: int,
    method: CollectiveMethod,
) -> PendingGather:
    if group.size == 1:
        return PendingGather()
    pg = group.process_group
    mine = ranges[group.index_of(rank)]
    chosen = _resolve(method, group, gloo=CollectiveMethod.BROADCAST)
    if chosen == CollectiveMethod.BROADCAST:
        # every rank sees the same ranges, so all skip the same empty owners
        owners = [(owner, r) for owner, r in zip(group.ranks, ranges, strict=True) if r.numel]
        slices = [full[r.start : r.end] for _, r in owners]
        held = _Held(group, *slices)
        works = [
            dist.broadcast(piece, src=owner, group=pg, async_op=True)
            for piece, (owner, _) in zip(slices, owners, strict=True)
        ]
        return PendingGather([w for w in works if w is not None], held=held)
    if chosen == CollectiveMethod.ALL_TO_ALL:
        sizes = [r.numel for r in ranges]
        gathered = full.new_empty(full.numel())
        repeated = full[mine.start : mine.end].repeat(group.size)
        held = _Held(group, gathered, repeated)
        work = dist.all_to_all_single(
            gathered,
            repeated,
            output_split_sizes=sizes,
            input_split_sizes=[mine.numel] * group.size,
            group=pg,
            async_op=True,
        )
        del repeated  # the work holds it until done

        def copy_back() -> None:
            full.copy_(gathered)

        return PendingGather([work] if work is not None else [], copy_back, held)
    if chosen == CollectiveMethod.PADDED:
        width = padded_shard_size(ranges)
        send = full.new_zeros(width)
        send[: mine.numel].copy_(full[mine.start : mine.end])
        gathered = full.new_empty(group.size, width)
        flat = gathered.view(-1)
        held = _Held(group, flat, send)
        work = dist.all_gather_single(flat, send, group=pg, async_op=True)

        def unpad() -> None:
            for i, r in enumerate(ranges):
                full[r.start : r.end].copy_(gathered[i, : r.numel])

        return PendingGather([work] if work is not None else [], unpad, held)
    raise ValueError(
        f"all-gather method {method.value!r}: expected auto, padded, all_to_all, broadcast"
    )


def all_reduce(
    tensor: torch.Tensor, *, group: CommGroup, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
) -> None:
    """In-place reduction over the group (a group of one rank: nothing to do). The tensor
    must live where the group's backend works: on the GPU for NCCL."""
    if group.size > 1:
        dist.all_reduce(tensor, op=op, group=group.process_group)


def all_reduce_sum(tensor: torch.Tensor, *, group: CommGroup) -> None:
    """In-place SUM over the group (a group of one rank: nothing to do)."""
    all_reduce(tensor, group=group)


def broadcast(tensor: torch.Tensor, *, src: int, group: CommGroup) -> None:
    """In place: ``src``'s values into every rank's ``tensor`` (a group of one rank:
    nothing to do)."""
    if group.size > 1:
        dist.broadcast(tensor, src=src, group=group.process_group)


def barrier(group: CommGroup) -> None:
    """Every rank of the group waits for the others (a group of one rank: no wait)."""
    if group.size > 1:
        dist.barrier(group=group.process_group)
