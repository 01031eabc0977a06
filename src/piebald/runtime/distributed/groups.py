"""Build a plan's process groups on ``torch.distributed``, once each, in an order that cannot
hang (what the groups are and why: :mod:`piebald.runtime.distributed.group_layout`).

``torch.distributed.new_group`` is collective over the whole world: every rank, idle or
not, must call it for every group in the same order. :func:`build_process_groups` walks
the plan's distinct rank tuples in one sorted order and creates each exactly once (a
second group over the same ranks is never needed, and with local synchronisation it can
hang, docs/research/torch_distributed.md section 6). A group of one rank is never created: it
has nobody to talk to, so :class:`CommGroup` carries no process group and the collectives
short-circuit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from piebald.runtime.distributed.group_layout import GroupLayout, build_group_layout
from piebald.specs.plan import Plan

__all__ = ["CommGroup", "ProcessGroups", "build_process_groups", "single_rank_group"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CommGroup:
    """Sorted global ranks and their process group (None for a group of one rank)."""

    ranks: tuple[int, ...]
    process_group: dist.ProcessGroup | None = field(default=None, compare=False)
    backend: str = "none"  # "gloo", "nccl", or "none" for a group of one rank

    def __post_init__(self) -> None:
        if list(self.ranks) != sorted(set(self.ranks)) or not self.ranks:
            raise ValueError(f"CommGroup ranks {list(self.ranks)}: expected sorted, unique")
        if (self.process_group is None) != (len(self.ranks) == 1):
            raise ValueError(
                f"CommGroup {list(self.ranks)}: a process group exactly when there are "
                "several ranks"
            )

    @property
    def size(self) -> int:
        return len(self.ranks)

    def index_of(self, rank: int) -> int:
        return self.ranks.index(rank)


def single_rank_group(rank: int) -> CommGroup:
    """The group of one rank: no communication at all (single-process training, tests)."""
    return CommGroup(ranks=(rank,))


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessGroups:
    """This rank's groups under a plan; ``stage`` is None on a rank the plan leaves idle,
    ``tied`` is None unless this rank holds a replica of a weight tied across stages,
    ``tensor`` and ``data_parallel`` are None unless its stage is tensor-parallel."""

    layout: GroupLayout
    rank: int
    used: CommGroup
    stage: CommGroup | None
    tied: CommGroup | None
    by_ranks: Mapping[tuple[int, ...], CommGroup]  # this rank's groups of several ranks
    tensor: CommGroup | None = None
    data_parallel: CommGroup | None = None

    @property
    def stage_index(self) -> int | None:
        return self.layout.stage_index_of(self.rank)


def _make_group(
    ranks: tuple[int, ...], *, world_size: int, rank: int, timeout_s: float | None
) -> CommGroup | None:
    """The group over ``ranks`` (collective: every rank calls it); None on non-members."""
    if ranks == tuple(range(world_size)):
        process_group = dist.group.WORLD  # already exists on every rank
    else:
        timeout = timedelta(seconds=timeout_s) if timeout_s is not None else None
        process_group = dist.new_group(list(ranks), timeout=timeout)
    if rank not in ranks:
        return None
    assert process_group is not None
    return CommGroup(
        ranks=ranks, process_group=process_group, backend=str(dist.get_backend(process_group))
    )


def build_process_groups(plan: Plan, *, timeout_s: float | None = None) -> ProcessGroups:
    """Create every group the plan needs; collective: call it on every rank of the world."""
    if not dist.is_initialized():
        raise RuntimeError("build_process_groups: torch.distributed is not initialised")
    layout = build_group_layout(plan)
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size != layout.world_size:
        raise ValueError(
            f"the plan's cluster {plan.cluster.name!r} has {layout.world_size} GPUs but "
            f"torch.distributed has {world_size} processes; expected one process per GPU"
        )
    by_ranks: dict[tuple[int, ...], CommGroup] = {}
    for ranks in layout.rank_tuples():  # the one global order, on every rank
        group = _make_group(ranks, world_size=world_size, rank=rank, timeout_s=timeout_s)
        if group is not None:
            by_ranks[ranks] = group

    def member_group(ranks: tuple[int, ...] | None) -> CommGroup | None:
        if ranks is None or rank not in ranks:
            return None
        return by_ranks[ranks] if len(ranks) > 1 else single_rank_group(rank)

    stage_index = layout.stage_index_of(rank)
    stage = None if stage_index is None else member_group(layout.stages[stage_index].ranks)
    used = member_group(layout.used_ranks) or single_rank_group(rank)
    tied = member_group(layout.tied.ranks if layout.tied is not None else None)
    data_parallel = layout.data_parallel_of(rank)
    return ProcessGroups(
        layout=layout,
        rank=rank,
        used=used,
        stage=stage,
        tied=tied,
        by_ranks=by_ranks,
        tensor=member_group(layout.tensor_group_of(rank)),
        data_parallel=member_group(data_parallel.ranks if data_parallel is not None else None),
    )
