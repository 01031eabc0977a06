"""Data-parallel traffic of a stage by ZeRO mode: what each pass waits for, and the sync.

Gradients are accumulated over the step's micro-batches (Zorse's pipeline-efficient ZeRO):
replicated stages all-reduce once per step, ZeRO-1 reduce-scatters gradients and
all-gathers updated parameters once per step, ZeRO-2 reduce-scatters after every backward
pass, ZeRO-3 also gathers the parameters for every forward and backward pass. Which mode
runs which collective is ``ZeroMode``'s (``gathers_per_pass``, ``step_end_all_reduce``, ...).
Parameters and gradients travel in the compute dtype's width (2 bytes, 4 in fp32).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from piebald.cost import elementwise
from piebald.cost.comm import Collective, RingProfile
from piebald.specs.plan import ZeroMode

__all__ = ["StageComm", "overlapped_passes_s", "stage_comm"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageComm:
    """A stage's data-parallel collectives, each 0 where its mode does not run it: the
    estimate reads the sums (what a pass waits for, the step-end sync), the simulator each
    collective on its own."""

    gather_pass_s: float  # ZeRO-3: parameter gather before each pass
    scatter_pass_s: float  # ZeRO-2/3: gradient reduce-scatter alongside each backward
    all_reduce_s: float  # replicated: gradient all-reduce once per step
    reduce_scatter_s: float  # ZeRO-1: gradient reduce-scatter once per step
    all_gather_s: float  # ZeRO-1/2: parameter all-gather once per step, after the optimizer

    @property
    def before_forward_s(self) -> float:
        """Each forward pass waits for this (ZeRO-3 gather)."""
        return self.gather_pass_s

    @property
    def during_backward_s(self) -> float:
        """Each backward pass takes at least this: its gather and its reduce-scatter."""
        return self.gather_pass_s + self.scatter_pass_s

    @property
    def sync_s(self) -> float:
        """Once per step, after the last backward."""
        return self.all_reduce_s + self.reduce_scatter_s + self.all_gather_s


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

    # Each collective is priced only where the mode runs it (the planner calls this often).
    gathers = zero.gathers_per_pass or zero.step_end_all_gather
    scatters = zero.reduces_per_pass or zero.step_end_reduce_scatter
    gather_s = collective(Collective.ALL_GATHER, uneven=True) if gathers else 0.0
    scatter_s = collective(Collective.REDUCE_SCATTER, uneven=True) if scatters else 0.0
    return StageComm(
        gather_pass_s=gather_s if zero.gathers_per_pass else 0.0,
        scatter_pass_s=scatter_s if zero.reduces_per_pass else 0.0,
        all_reduce_s=(
            collective(Collective.ALL_REDUCE, uneven=False) if zero.step_end_all_reduce else 0.0
        ),
        reduce_scatter_s=scatter_s if zero.step_end_reduce_scatter else 0.0,
        all_gather_s=gather_s if zero.step_end_all_gather else 0.0,
    )


def overlapped_passes_s(
    *, forward_s: Any, backward_s: Any, before_forward_s: Any, during_backward_s: Any
) -> tuple[Any, Any]:
    """(forward, backward) of a rank's passes beside its stage's per-pass ZeRO traffic
    (:class:`StageComm`): a forward no shorter than the gather it waits for, a backward no
    shorter than the reduce-scatter it runs alongside. Elementwise over arrays of layer
    ranges (the planner's matrices) as over one range (the exact build, the estimate)."""
    return (
        elementwise.maximum(forward_s, before_forward_s),
        elementwise.maximum(backward_s, during_backward_s),
    )
