"""Per-rank action orders of the 1F1B and zero-bubble family of pipeline schedules.

One step of a pipeline schedule is, per rank, an ordered list of compute actions on the
rank's chunks (virtual stages). An action is one of:

====  =========================================================================
F     forward pass of one micro-batch through one chunk
B     backward pass for the chunk's input gradient only (zero bubble's "B")
W     backward pass for the chunk's weight gradient only (zero bubble's "W")
BW    the full backward, B and W fused (1F1B, interleaved 1F1B)
====  =========================================================================

A ``Placement`` says which pipeline stage chunk c of rank r holds: one chunk per rank
(``classic``, stage = rank), ``looped`` (Megatron's interleaving, v chunks, stage =
chunk * p + rank) or ``v_shape`` (zero bubble's ZB-V, 2 chunks, stages r and 2p - 1 - r).
``PipelineOrders`` holds the per-rank lists and validates them: every micro-batch passes
every stage forward once and backward once (B and W, or BW), and on its rank a stage's B
follows its F and its W follows its B. Whether the ranks' orders can all run together
(no cyclic wait across ranks) is what ``schedule.replay`` finds out.

Pure data; no torch, no time (``schedule.replay`` prices the orders).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "Action",
    "ActionKind",
    "PipelineOrders",
    "Placement",
    "PlacementStyle",
]


class ActionKind(StrEnum):
    """What an action computes (see the module's table)."""

    F = "F"
    B = "B"
    W = "W"
    BW = "BW"


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One compute action of a rank: ``kind`` of ``micro_batch`` on the rank's ``chunk``."""

    kind: ActionKind
    micro_batch: int
    chunk: int = 0

    def __str__(self) -> str:
        chunk = f"@{self.chunk}" if self.chunk else ""
        return f"{self.kind.value}{self.micro_batch}{chunk}"


class PlacementStyle(StrEnum):
    """How a rank's chunks map to pipeline stages."""

    CLASSIC = "classic"
    LOOPED = "looped"
    V_SHAPE = "v_shape"


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Which pipeline stage each (rank, chunk) holds; ``stages`` = ``ranks * chunks``."""

    ranks: int
    chunks: int = 1
    style: PlacementStyle = PlacementStyle.CLASSIC

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.chunks < 1:
            raise ValueError(f"a placement needs ranks, chunks >= 1, got {self}")
        if self.style is PlacementStyle.CLASSIC and self.chunks != 1:
            raise ValueError("the classic placement has one chunk per rank")
        if self.style is PlacementStyle.V_SHAPE and self.chunks != 2:
            raise ValueError("the V placement has exactly two chunks per rank")

    @classmethod
    def classic(cls, ranks: int) -> Placement:
        return cls(ranks=ranks)

    @classmethod
    def looped(cls, ranks: int, chunks: int) -> Placement:
        return cls(ranks=ranks, chunks=chunks, style=PlacementStyle.LOOPED)

    @classmethod
    def v_shape(cls, ranks: int) -> Placement:
        return cls(ranks=ranks, chunks=2, style=PlacementStyle.V_SHAPE)

    @property
    def stages(self) -> int:
        return self.ranks * self.chunks

    def stage(self, rank: int, chunk: int) -> int:
        """The pipeline stage that ``chunk`` of ``rank`` holds."""
        if not (0 <= rank < self.ranks and 0 <= chunk < self.chunks):
            raise ValueError(f"no chunk {chunk} on rank {rank} in {self}")
        if self.style is PlacementStyle.V_SHAPE and chunk == 1:
            return 2 * self.ranks - 1 - rank
        return chunk * self.ranks + rank

    def holder(self, stage: int) -> tuple[int, int]:
        """The (rank, chunk) that holds ``stage``."""
        if not 0 <= stage < self.stages:
            raise ValueError(f"no stage {stage} in {self}")
        chunk, rank = divmod(stage, self.ranks)
        if self.style is PlacementStyle.V_SHAPE and chunk == 1:
            rank = self.ranks - 1 - rank
        return rank, chunk


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineOrders:
    """Per rank, the actions of one step in execution order (``orders[rank]``)."""

    placement: Placement
    micro_batches: int
    orders: tuple[tuple[Action, ...], ...]
    name: str = ""

    def __post_init__(self) -> None:
        if len(self.orders) != self.placement.ranks:
            raise ValueError(
                f"{len(self.orders)} rank orders for a placement of {self.placement.ranks} ranks"
            )
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {self.micro_batches}")

    def actions(self) -> Iterator[tuple[int, int, Action]]:
        """Every (rank, position, action), rank by rank."""
        for rank, order in enumerate(self.orders):
            for position, action in enumerate(order):
                yield rank, position, action

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first rule a rank's order breaks.

        Every (stage, micro-batch) has exactly one F and either one BW or one B and one W;
        on the stage's rank its B (or BW) comes after its F and its W after its B.
        """
        seen: dict[tuple[ActionKind, int, int], tuple[int, int]] = {}
        for rank, position, action in self.actions():
            where = f"rank {rank} position {position} ({action})"
            if not 0 <= action.chunk < self.placement.chunks:
                raise ValueError(f"{where}: no chunk {action.chunk} on a rank")
            if not 0 <= action.micro_batch < self.micro_batches:
                raise ValueError(f"{where}: micro-batch outside 0..{self.micro_batches - 1}")
            stage = self.placement.stage(rank, action.chunk)
            key = (action.kind, stage, action.micro_batch)
            if key in seen:
                rank0, position0 = seen[key]
                raise ValueError(f"{where}: repeats rank {rank0} position {position0}")
            needs = {
                ActionKind.F: None,
                ActionKind.B: ActionKind.F,
                ActionKind.BW: ActionKind.F,
                ActionKind.W: ActionKind.B,
            }[action.kind]
            if needs is not None and (needs, stage, action.micro_batch) not in seen:
                raise ValueError(f"{where}: comes before its {needs.value} on stage {stage}")
            fused = (ActionKind.BW, stage, action.micro_batch) in seen
            split = (ActionKind.B, stage, action.micro_batch) in seen
            if (action.kind is ActionKind.BW and split) or (action.kind is ActionKind.B and fused):
                raise ValueError(f"{where}: mixes BW with B/W for one stage and micro-batch")
            seen[key] = (rank, position)
        for stage in range(self.placement.stages):
            for micro_batch in range(self.micro_batches):
                has = {kind for kind in ActionKind if (kind, stage, micro_batch) in seen}
                if has not in ({ActionKind.F, ActionKind.BW}, set(ActionKind) - {ActionKind.BW}):
                    found = ", ".join(sorted(kind.value for kind in has)) or "nothing"
                    raise ValueError(
                        f"stage {stage} micro-batch {micro_batch}: has {found},"
                        " wants F with BW, or F, B and W"
                    )
