"""Data-parallel traffic of a stage by ZeRO mode: what each pass waits for, and the sync.

Gradients are accumulated over the step's micro-batches (Zorse's pipeline-efficient ZeRO):
replicated stages all-reduce once per step, ZeRO-1 reduce-scatters gradients and
all-gathers updated parameters once per step, ZeRO-2 reduce-scatters after every backward
pass, ZeRO-3 also gathers the parameters for every forward and backward pass.
Parameters and gradients travel in the compute dtype's width (2 bytes, 4 in fp32).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from piebald.cost.comm import Collective, RingProfile
from piebald.specs.plan import ZeroMode

__all__ = ["StageComm", "stage_comm"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageComm:
    before_forward_s: float  # each forward pass waits for this (ZeRO-3 gather)
    during_backward_s: float  # each backward pass takes at least this
    sync_s: float  # once per step, after the last backward


def stage_comm(
    profile: RingProfile,
    *,
    shard_fractions: Sequence[float],
    zero: ZeroMode,
    state_bytes: float,
) -> StageComm:
    """Traffic of a stage whose parameters (and gradients) take ``state_bytes`` on the wire,
    over the group described by ``profile`` (``comm.ring_profile`` of the stage's ranks)."""

    def collective(kind: Collective, uneven: bool) -> float:
        return profile.time_s(
            kind, num_bytes=state_bytes, shard_fractions=shard_fractions if uneven else None
        )

    if zero is ZeroMode.NONE:
        return StageComm(
            before_forward_s=0.0,
            during_backward_s=0.0,
            sync_s=collective(Collective.ALL_REDUCE, uneven=False),
        )
    gather_s = collective(Collective.ALL_GATHER, uneven=True)
    scatter_s = collective(Collective.REDUCE_SCATTER, uneven=True)
    if zero is ZeroMode.OPTIMIZER:
        return StageComm(before_forward_s=0.0, during_backward_s=0.0, sync_s=scatter_s + gather_s)
    if zero is ZeroMode.GRADIENTS:
        return StageComm(before_forward_s=0.0, during_backward_s=scatter_s, sync_s=gather_s)
    return StageComm(before_forward_s=gather_s, during_backward_s=gather_s + scatter_s, sync_s=0.0)
