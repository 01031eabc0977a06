"""A group's parameters as one flat buffer: compute-dtype views, the fp32 gradient
accumulator, and this rank's fp32 master shard (uneven ZeRO after Zorse's pipeline-efficient
ZeRO and Cephalo's uneven training-state shares).

Memory per rank, n elements, shard of s elements, compute dtype of b bytes:

* ``params_flat`` (n x b): the module's parameters become views into it (``param.data``
  is replaced, so the module keeps its Parameter objects). Under ZeRO FULL its storage is
  freed at rest (:meth:`FlatBucket.release_params`) and re-filled by an uneven all-gather
  before passes (:meth:`FlatBucket.gather_params`); the views stay valid because they
  share the storage object.
* ``main_grad`` (n x 4): the fp32 gradient accumulator (Megatron-LM's ``main_grad``), so
  summing many micro-batches loses nothing to a 16-bit accumulator. With fp32 compute
  every ``param.grad`` is a view into it and autograd sums in place; with 16-bit compute
  a post-accumulate hook adds each parameter's fresh 16-bit gradient into it and drops
  it, so only one parameter's 16-bit gradient exists at a time. If a caller replaced or
  cleared a ``.grad``, it is folded back before reduction.
* ``master`` (s x 4): the fp32 weights this rank steps (``stepped``): its shard, or the
  whole buffer under ZeRO none, whose optimizer is replicated (every rank steps all of it;
  ``shard`` then only says which elements it counts in the norm and checkpoints). With
  fp32 compute, outside ZeRO-3, it is a view of ``params_flat`` (the weights are the
  master). The sum of every rank's gradient for them, filled once per step by an uneven
  reduce-scatter (an all-reduce when replicated), is written into the accumulator's
  stepped range (``grad_shard``, a view), so it costs no memory of its own. The step's
  collectives run in rounds of at most ``chunk_numel`` elements (``FlatBucket._rounds``).

Collectives move the bucket's wire dtype (``piebald.cost.precision``): the group's common
compute dtype, or fp32 where its ranks compute in different dtypes. Each rank casts its
fp32 accumulator down to it for the reduce-scatter and writes the sum it receives, in fp32,
into the owned range; the all-gather moves updated weights in it and each rank casts them
to its own compute dtype. The initial values travel in fp32.

**Streamed** buckets (``streamed=True``, one per layer of a ZeRO-2/3 stage, built by
:mod:`piebald.runtime.distributed.buckets`) hold no ``main_grad``: autograd leaves each
parameter's gradient of one backward pass in ``param.grad`` (compute dtype), and
:meth:`FlatBucket.reduce_pass_gradients`, called by the executor right after the layer's
backward, copies them into one wire-dtype buffer (dropping each as it goes),
reduce-scatters it and adds the owned sum into ``grad_shard``, an fp32 tensor of the shard's
size: no full gradient outlives its layer's backward. Under ZeRO-3 the executor gathers a
layer's parameters right before each pass through it (the next layer's gather runs in
the background, :meth:`FlatBucket.start_gather`) and releases them after. Every rank of
the group must make these calls in the same order, which equal micro-batch counts and one
pass pattern per stage guarantee (``piebald.specs.plan``).

The optimizer (:mod:`piebald.runtime.distributed.optimizer`) steps ``master`` and
all-gathers the result back into ``params_flat``.

Every rank of the group must build the bucket with the same names, shapes and wire dtype
(checked, since gloo aborts the process on a message longer than its receive buffer); the
initial values are broadcast from ``init_src_rank`` so the replicas start identical. A
rank the placement names a replica (a tensor-group member holding a copy of a weight its
leader holds too, ``group_layout``) adds zeros to every gradient sum.

**Routed** buckets (``owners`` and ``mirror`` given: a streamed layer of the weights a
tensor-parallel stage replicates, ``buckets``) keep that ownership but skip the replicas
in their collectives: the owners (the tensor groups' leaders) reduce-scatter and gather
over their own group (the leaders' data-parallel group), and after every gather a leader
broadcasts the whole layer over its tensor group, whose replicas drop their gradients
instead of sending zeros. Why: over the stage group every owner would receive each
rank's part (t x the layer at an even split, and NCCL pads every part to the largest, so
a gather would hold t x the layer too), where ``cost.memory`` prices one data-parallel
group's reduce-scatter and gather of the rank's slice; the leaders' group is that.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from piebald.runtime.distributed.collectives import (
    CollectiveMethod,
    PendingGather,
    all_gather_uneven,
    broadcast,
    reduce_scatter_uneven,
)
from piebald.runtime.distributed.flat_layout import (
    FlatLayout,
    ParamSlot,
    Piece,
    build_flat_layout,
    pieces_in_range,
)
from piebald.runtime.distributed.group_layout import BucketPlacement
from piebald.runtime.distributed.groups import CommGroup
from piebald.runtime.distributed.shard_layout import ShardRange, back_to_back, shard_ranges

__all__ = ["FlatBucket"]

logger = logging.getLogger(__name__)


def _unique_params(
    named_params: Sequence[tuple[str, nn.Parameter]],
) -> list[tuple[str, nn.Parameter]]:
    """Drop repeats of one Parameter object (an embedding tied to a head in one module)."""
    seen: set[int] = set()
    unique: list[tuple[str, nn.Parameter]] = []
    for name, param in named_params:
        if id(param) not in seen:
            seen.add(id(param))
            unique.append((name, param))
    return unique


@dataclass(frozen=True, slots=True, kw_only=True)
class _Route:
    """A streamed bucket of the weights a tensor group replicates, whose collectives skip
    the replicas (module docstring): ``owners`` is the owners' group on an owner (None on
    a replica), ``mirror`` this rank's tensor group and ``leader`` the owner in it."""

    owners: CommGroup | None
    mirror: CommGroup
    leader: int

    @classmethod
    def of(
        cls,
        name: str,
        *,
        placement: BucketPlacement,
        rank: int,
        owners: CommGroup | None,
        mirror: CommGroup | None,
        streamed: bool,
    ) -> _Route | None:
        if mirror is None:
            if owners is not None:
                raise ValueError(f"bucket {name!r}: owners without a tensor group to mirror to")
            return None
        leaders = [r for r in mirror.ranks if r not in placement.replicas]
        expected = tuple(r for r in placement.ranks if r not in placement.replicas)
        holds = (owners is not None) == (rank not in placement.replicas)
        if (
            not streamed
            or len(leaders) != 1
            or not holds
            or (owners is not None and owners.ranks != expected)
        ):
            raise ValueError(
                f"bucket {name!r}: routing needs a streamed bucket, one owner in the tensor "
                f"group {list(mirror.ranks)} (got {leaders}) and, on an owner only, the "
                f"owners' group {list(expected)} (got "
                f"{None if owners is None else list(owners.ranks)})"
            )
        return cls(owners=owners, mirror=mirror, leader=leaders[0])


class FlatBucket:
    """One flat buffer of parameters shared by a group; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        named_params: Sequence[tuple[str, nn.Parameter]],
        placement: BucketPlacement,
        group: CommGroup,
        rank: int,
        compute_dtype: torch.dtype = torch.float32,
        wire_dtype: torch.dtype | None = None,
        init_src_rank: int | None = None,
        reduce_scatter_method: CollectiveMethod = CollectiveMethod.AUTO,
        all_gather_method: CollectiveMethod = CollectiveMethod.AUTO,
        streamed: bool = False,
        chunk_numel: int | None = None,
        owners: CommGroup | None = None,
        mirror: CommGroup | None = None,
    ) -> None:
        params = _unique_params(named_params)
        if not params:
            raise ValueError(f"bucket {name!r}: expected at least one parameter")
        if group.ranks != placement.ranks:
            raise ValueError(
                f"bucket {name!r}: group ranks {list(group.ranks)} differ from the "
                f"placement's {list(placement.ranks)}"
            )
        devices = {p.device for _, p in params}
        if len(devices) != 1:
            raise ValueError(
                f"bucket {name!r}: parameters on one device, got {sorted(map(str, devices))}"
            )
        self.name = name
        self.placement = placement
        self.group = group
        self.rank = rank
        self.compute_dtype = compute_dtype
        self.wire_dtype = wire_dtype or compute_dtype
        self.reduce_scatter_method = reduce_scatter_method
        self.all_gather_method = all_gather_method
        self.streamed = streamed
        if chunk_numel is not None and chunk_numel < 1:
            raise ValueError(f"bucket {name!r}: chunk_numel = {chunk_numel}; expected >= 1")
        self.chunk_numel = chunk_numel
        self.params = [p for _, p in params]
        self._route = _Route.of(
            name, placement=placement, rank=rank, owners=owners, mirror=mirror, streamed=streamed
        )
        self.layout: FlatLayout = build_flat_layout([(n, tuple(p.shape)) for n, p in params])
        self._check_same_layout_across_group()

        device = devices.pop()
        numel = self.layout.numel
        # The initial values in fp32 on every rank, whatever it computes in.
        initial = torch.empty(numel, dtype=torch.float32, device=device)
        with torch.no_grad():
            for slot, param in zip(self.layout.slots, self.params, strict=True):
                initial[slot.offset : slot.end].copy_(param.detach().reshape(-1))
        if group.size > 1:
            src = group.ranks[0] if init_src_rank is None else init_src_rank
            dist.broadcast(initial, src=src, group=group.process_group)
        self.ranges: tuple[ShardRange, ...] = shard_ranges(placement.fractions, num_elements=numel)
        self.shard = self.ranges[group.index_of(rank)]
        # Routed (``_Route``): the owners' ranges, which tile the buffer as ``ranges`` do.
        self._owner_ranges = tuple(
            r
            for member, r in zip(group.ranks, self.ranges, strict=True)
            if member not in placement.replicas
        )
        self.pieces: tuple[Piece, ...] = pieces_in_range(self.layout, self.shard)
        # ZeRO none: every rank steps the whole buffer (a replicated optimizer); ``shard``
        # still says which elements it counts in the global norm and checkpoints.
        self.replicated = not placement.zero.shards_optimizer
        self.stepped = ShardRange(start=0, end=numel) if self.replicated else self.shard
        self.stepped_pieces: tuple[Piece, ...] = pieces_in_range(self.layout, self.stepped)
        self.params_flat = initial if compute_dtype == torch.float32 else initial.to(compute_dtype)
        stepped = initial[self.stepped.start : self.stepped.end]
        # fp32 compute: the weights are the master (a view), unless released at rest.
        fp32_view = compute_dtype == torch.float32 and not placement.zero.shards_weights
        self.master = stepped if fp32_view else stepped.clone()
        del initial, stepped
        with torch.no_grad():
            for slot, param in zip(self.layout.slots, self.params, strict=True):
                param.data = self._param_view(slot.offset, slot.end, slot.shape)
        self.main_grad: torch.Tensor | None = None
        if streamed:  # gradients live per pass in param.grad, sums in the owned shard only
            self._grad_shard = torch.zeros(self.shard.numel, dtype=torch.float32, device=device)
            for param in self.params:
                param.grad = None
        else:
            self.main_grad = torch.zeros(numel, dtype=torch.float32, device=device)
            self._grad_shard = self.main_grad[self.stepped.start : self.stepped.end]
            if self._grads_are_views:
                self._adopt_grads()
            else:
                for slot, param in zip(self.layout.slots, self.params, strict=True):
                    param.grad = None
                    hook = self._accumulate_hook(slot)
                    param.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]
        self._storage_bytes = self.params_flat.untyped_storage().nbytes()
        self._released = False
        self._pending: PendingGather | None = None
        self._gather_buffer: torch.Tensor | None = None
        if self.sharded_at_rest:
            self.release_params()

    # --- views ----------------------------------------------------------------------------

    def _param_view(self, start: int, end: int, shape: tuple[int, ...]) -> torch.Tensor:
        return self.params_flat[start:end].view(shape)

    def _grad_view(self, start: int, end: int, shape: tuple[int, ...]) -> torch.Tensor:
        assert self.main_grad is not None
        return self.main_grad[start:end].view(shape)

    @property
    def _grads_are_views(self) -> bool:
        """fp32 compute: ``param.grad`` is the accumulator itself (no copy)."""
        return self.compute_dtype == torch.float32

    def _accumulate_hook(self, slot: ParamSlot) -> Callable[[torch.Tensor], None]:
        """16-bit compute: add a parameter's fresh gradient into the fp32 accumulator."""

        def hook(param: torch.Tensor) -> None:
            assert param.grad is not None
            with torch.no_grad():
                self._grad_view(slot.offset, slot.end, slot.shape).add_(param.grad)
            param.grad = None

        return hook

    def _adopt_grads(self) -> None:
        """Fold every ``param.grad`` into the accumulator: with fp32 compute make it the
        view again (keeping its value), with 16-bit compute add it and drop it."""
        if self.streamed:
            return
        with torch.no_grad():
            for slot, param in zip(self.layout.slots, self.params, strict=True):
                view = self._grad_view(slot.offset, slot.end, slot.shape)
                grad = param.grad
                if not self._grads_are_views:
                    if grad is not None:
                        view.add_(grad)
                        param.grad = None
                    continue
                if grad is None:
                    # Cleared (set_to_none): no gradient since, so the accumulator is zero.
                    view.zero_()
                elif grad.data_ptr() != view.data_ptr() or grad.shape != view.shape:
                    view.copy_(grad)
                else:
                    continue
                param.grad = view

    def _check_same_layout_across_group(self) -> None:
        if self.group.size == 1:
            return
        mine = [(slot.name, slot.shape) for slot in self.layout.slots]
        wire = str(self.wire_dtype)
        everyone: list[object] = [None] * self.group.size
        dist.all_gather_object(everyone, (mine, wire), group=self.group.process_group)
        for other_rank, other in zip(self.group.ranks, everyone, strict=True):
            if other != (mine, wire):
                raise ValueError(
                    f"bucket {self.name!r}: rank {self.rank} holds {len(mine)} parameters "
                    f"{mine[:3]}... (wire dtype {wire}) but rank {other_rank} holds a "
                    "different list; every rank of a group must build the same parameters"
                )

    # --- ZeRO -------------------------------------------------------------------------------

    @property
    def sharded_at_rest(self) -> bool:
        return self.placement.zero.shards_weights

    @property
    def numel(self) -> int:
        return self.layout.numel

    @property
    def grad_shard(self) -> torch.Tensor:
        """The sum of every rank's gradient for the elements this rank steps (``stepped``:
        its shard, or everything when replicated), fp32: after :meth:`reduce_gradients` (a
        view of the accumulator), or, streamed, accumulated pass by pass by
        :meth:`reduce_pass_gradients`."""
        return self._grad_shard

    @property
    def shard_in_stepped(self) -> slice:
        """Where this rank's shard lies in ``master`` and ``grad_shard``."""
        return slice(self.shard.start - self.stepped.start, self.shard.end - self.stepped.start)

    @property
    def norm_grad(self) -> torch.Tensor:
        """The reduced gradient of the elements this rank counts in the global norm: its
        shard, so that every element is counted once however the state is held."""
        return self._grad_shard[self.shard_in_stepped]

    def zero_grad(self) -> None:
        if self.main_grad is None:
            self._grad_shard.zero_()
            for param in self.params:
                param.grad = None
            return
        self.main_grad.zero_()
        self._adopt_grads()

    def reduce_gradients(self) -> None:
        """Replace the owned range of the accumulator with the group's sum of it and clear
        the rest (sent to its owners). Collective over the group; the optimizer calls it
        once per step, an executor may call it more often, as long as every rank of the
        group calls it the same number of times: later sums add to the owned range, which
        holds the earlier ones. A streamed bucket has reduced pass by pass: nothing to do."""
        if self.main_grad is None:
            return
        self._adopt_grads()
        if self.rank in self.placement.replicas:  # a tensor-group leader's copy: add nothing
            self.main_grad.zero_()
        if self.replicated:
            self._all_reduce_gradients()
            return
        index = self.group.index_of(self.rank)
        for parts in self._rounds:
            _, _, reduced = self._reduce_round(parts)
            mine = parts[index]
            owned = self.main_grad[mine.start : mine.end]
            if reduced.data_ptr() != owned.data_ptr():  # a group of one rank sums in place
                owned.copy_(reduced)
            del reduced  # before the next round allocates its own (cost.memory prices one)
        self.main_grad[: self.shard.start].zero_()
        self.main_grad[self.shard.end :].zero_()

    def _all_reduce_gradients(self) -> None:
        """ZeRO none: every rank gets the whole sum, round by round, as a ring all-reduce
        makes it (a reduce-scatter onto the even shards, then an all-gather of the sums,
        in the wire dtype), so every rank holds the owner's sum bit for bit."""
        assert self.main_grad is not None
        index = self.group.index_of(self.rank)
        for parts in self._rounds:
            wire, ranges, reduced = self._reduce_round(parts)
            mine = ranges[index]
            wire[mine.start : mine.end].copy_(reduced)
            all_gather_uneven(
                wire, ranges, group=self.group, rank=self.rank, method=self.all_gather_method
            )
            self._unpack(wire, parts, ranges, into=self.main_grad)
            del wire, reduced  # before the next round allocates its own

    def _reduce_round(
        self, parts: tuple[ShardRange, ...]
    ) -> tuple[torch.Tensor, tuple[ShardRange, ...], torch.Tensor]:
        """One round's reduce-scatter of the accumulator: the packed wire buffer, where
        each owner's part lies in it, and this rank's sum of its part."""
        assert self.main_grad is not None
        wire, ranges = self._pack(self.main_grad, parts)
        reduced = reduce_scatter_uneven(
            wire, ranges, group=self.group, rank=self.rank, method=self.reduce_scatter_method
        )
        return wire, ranges, reduced

    @functools.cached_property
    def _rounds(self) -> list[tuple[ShardRange, ...]]:
        """The step's collectives in rounds: round k moves the k-th ``chunk_numel / g``
        elements of every owner's range, so each round's wire buffer and receive buffer
        hold about ``chunk_numel`` elements whatever the shares (``cost.memory`` prices a
        round's buffers). One round of the whole buffer without a chunk size."""
        widest = max(r.numel for r in self.ranges)
        if self.chunk_numel is None or widest == 0:
            return [self.ranges]
        per_owner = max(1, -(-self.chunk_numel // self.group.size))
        return [
            tuple(
                ShardRange(start=min(r.start + lo, r.end), end=min(r.start + lo + per_owner, r.end))
                for r in self.ranges
            )
            for lo in range(0, widest, per_owner)
        ]

    def _pack(
        self, source: torch.Tensor, parts: tuple[ShardRange, ...]
    ) -> tuple[torch.Tensor, tuple[ShardRange, ...]]:
        """Every owner's part of ``source`` back to back in one wire-dtype buffer, and where
        each lies in it (the buffer is ``source`` itself where nothing needs copying)."""
        if parts == self.ranges and source.dtype == self.wire_dtype:
            return source, self.ranges
        packed = back_to_back([p.numel for p in parts])
        buffer = torch.empty(packed[-1].end, dtype=self.wire_dtype, device=source.device)
        for part, at in zip(parts, packed, strict=True):
            buffer[at.start : at.end].copy_(source[part.start : part.end])
        return buffer, packed

    @staticmethod
    def _unpack(
        buffer: torch.Tensor,
        parts: tuple[ShardRange, ...],
        packed: tuple[ShardRange, ...],
        *,
        into: torch.Tensor,
    ) -> None:
        """The inverse of :meth:`_pack`: each owner's part, at ``packed`` in ``buffer``,
        back to its place in ``into``."""
        if buffer.data_ptr() == into.data_ptr():
            return
        for part, at in zip(parts, packed, strict=True):
            into[part.start : part.end].copy_(buffer[at.start : at.end])

    def reduce_pass_gradients(self) -> None:
        """Streamed: reduce-scatter the gradients one backward pass left in ``param.grad``
        (dropping each once copied to the wire buffer) and add the owned sum into
        ``grad_shard``. Collective over the group (routed: over the owners, a replica
        only dropping its copy), once per backward pass."""
        assert self.streamed, f"bucket {self.name!r}: not streamed"
        if self._routed_replica:
            for param in self.params:
                param.grad = None
            return
        flat = torch.empty(self.numel, dtype=self.wire_dtype, device=self._grad_shard.device)
        with torch.no_grad():
            for slot, param in zip(self.layout.slots, self.params, strict=True):
                target = flat[slot.offset : slot.end]
                if param.grad is None:  # unused in this pass (no gradient reached it)
                    target.zero_()
                else:
                    target.copy_(param.grad.reshape(-1))
                    param.grad = None
            if self.rank in self.placement.replicas:  # a tensor-group leader's copy
                flat.zero_()
            group, ranges = self._collective_group
            reduced = reduce_scatter_uneven(
                flat, ranges, group=group, rank=self.rank, method=self.reduce_scatter_method
            )
            self._grad_shard.add_(reduced)

    @property
    def _routed_replica(self) -> bool:
        """A replica of a routed bucket: it meets nobody but its leader's broadcast."""
        return self._route is not None and self._route.owners is None

    @property
    def _collective_group(self) -> tuple[CommGroup, tuple[ShardRange, ...]]:
        """Where the gradient sums and the gathers of the owners' shards run: the group, or
        (routed) the owners alone, and every one's range."""
        if self._route is None:
            return self.group, self.ranges
        assert self._route.owners is not None, f"bucket {self.name!r}: a replica owns nothing"
        return self._route.owners, self._owner_ranges

    def publish_params(self) -> None:
        """All-gather every owner's master shard, in the wire dtype, into the compute-dtype
        buffer (collective over the group), chunk by chunk; replicated: a local cast."""
        if self.replicated:
            if self.master.data_ptr() != self.params_flat.data_ptr():  # fp32: the same
                with torch.no_grad():
                    self.params_flat.copy_(self.master)
            return
        rounds = self._rounds
        if len(rounds) == 1:
            self.start_gather()
            self.finish_gather()
            return
        if self._released:
            self.params_flat.untyped_storage().resize_(self._storage_bytes)
            self._released = False
        index = self.group.index_of(self.rank)
        with torch.no_grad():
            for parts in rounds:
                ranges = back_to_back([p.numel for p in parts])
                wire = self.master.new_empty(ranges[-1].end, dtype=self.wire_dtype)
                mine, at = parts[index], ranges[index]
                offset = mine.start - self.shard.start
                wire[at.start : at.end].copy_(self.master[offset : offset + mine.numel])
                all_gather_uneven(
                    wire, ranges, group=self.group, rank=self.rank, method=self.all_gather_method
                )
                self._unpack(wire, parts, ranges, into=self.params_flat)
                del wire  # before the next round allocates its own

    def start_gather(self) -> None:
        """Begin :meth:`publish_params` in the background (collective over the group);
        :meth:`finish_gather` waits for it. The buffer is re-allocated now if released.
        A routed replica has nothing to start: its leader's values come in the finish."""
        assert self._pending is None, f"bucket {self.name!r}: a gather is already under way"
        if self._released:
            self.params_flat.untyped_storage().resize_(self._storage_bytes)
            self._released = False
        if self._routed_replica:
            self._pending = PendingGather()
            return
        # Gather in place where the wire is the compute dtype, else through a wire buffer.
        same = self.wire_dtype == self.compute_dtype
        target = (
            self.params_flat
            if same
            else self.params_flat.new_empty(self.numel, dtype=self.wire_dtype)
        )
        with torch.no_grad():
            target[self.shard.start : self.shard.end].copy_(self.master)
        self._gather_buffer = None if same else target
        group, ranges = self._collective_group
        self._pending = all_gather_uneven(
            target,
            ranges,
            group=group,
            rank=self.rank,
            method=self.all_gather_method,
            async_op=True,
        )

    def finish_gather(self) -> None:
        """Wait for the gather :meth:`start_gather` began (nothing to do if none is);
        routed, the leader then hands the whole layer to its tensor group's replicas."""
        if self._pending is None:
            return
        self._pending.wait()
        self._pending = None
        if self._gather_buffer is not None:
            with torch.no_grad():
                self.params_flat.copy_(self._gather_buffer)
            self._gather_buffer = None
        if self._route is not None:
            broadcast(self.params_flat, src=self._route.leader, group=self._route.mirror)

    @property
    def gather_pending(self) -> bool:
        return self._pending is not None

    def gather_params(self) -> None:
        """ZeRO FULL: materialise the parameters before a pass (collective, always, so every
        rank of the group calls it equally often); other modes keep them resident."""
        if self.sharded_at_rest:
            self.publish_params()

    def release_params(self) -> None:
        """ZeRO FULL: free the parameters after a pass (local; no communication)."""
        if self.sharded_at_rest and not self._released:
            assert self._pending is None, f"bucket {self.name!r}: released mid-gather"
            self.params_flat.untyped_storage().resize_(0)
            self._released = True

    @property
    def params_resident(self) -> bool:
        return not self._released
