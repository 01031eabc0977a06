"""Which elements of a whole parameter a tensor-parallel member holds: the one rule that
splitting a block (``models.tensor_parallel``), joining the slices whole for export, and
checkpoints (which store and find slices in whole-tensor coordinates) all follow.

Every Megatron-LM split of piebald has one shape: along one dimension ``dim`` the whole
is ``chunks`` equal runs (3 for GPT-2's fused [q | k | v], else 1), each run is cut in
``degree`` equal parts, and member ``position`` holds its part of every run, in run order.
Column-parallel layers split dim 0 of the weight and the bias, row-parallel ones dim 1 of
the weight. A slice is therefore generally not one range of the whole's flattened layout
(a row-parallel slice is one run per row), but its elements keep the whole's order.

Pure torch, no process groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["TensorSlice", "join_slices"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSlice:
    """Member ``position`` of ``degree``'s slice of a parameter split along ``dim`` in
    ``chunks`` runs (module docstring)."""

    dim: int
    chunks: int
    degree: int
    position: int

    def __post_init__(self) -> None:
        if self.dim < 0 or self.chunks < 1 or not 0 <= self.position < self.degree:
            raise ValueError(
                f"TensorSlice(dim={self.dim}, chunks={self.chunks}, degree={self.degree}, "
                f"position={self.position}): expected dim >= 0, chunks >= 1 and "
                "0 <= position < degree"
            )

    def of(self, whole: torch.Tensor) -> torch.Tensor:
        """This member's slice of ``whole`` (a copy unless nothing is cut)."""
        runs = whole.chunk(self.chunks, dim=self.dim)
        parts = [run.chunk(self.degree, dim=self.dim)[self.position] for run in runs]
        return torch.cat(parts, dim=self.dim)

    def whole_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The whole parameter's shape, from the shape of this slice."""
        whole = list(shape)
        whole[self.dim] *= self.degree
        return tuple(whole)

    def flat_indices(self, whole_shape: Sequence[int]) -> torch.Tensor:
        """For each element of the slice, flattened, its index in the flattened whole
        (int64, increasing): the slice of the whole's indices, so it is :meth:`of` itself
        that says where every element lies."""
        indices = torch.arange(math.prod(whole_shape), dtype=torch.int64)
        return self.of(indices.view(tuple(whole_shape))).reshape(-1)

    def disjoint_from(self, other: TensorSlice) -> bool:
        """True when the two slices certainly share no element: other members of one split."""
        same_split = (self.dim, self.chunks, self.degree) == (other.dim, other.chunks, other.degree)
        return same_split and self.position != other.position


def join_slices(slices: Sequence[torch.Tensor], *, dim: int, chunks: int) -> torch.Tensor:
    """The whole parameter from every member's slice, ``slices[p]`` being position p's
    (the inverse of :meth:`TensorSlice.of` over all positions)."""
    runs = [piece.chunk(chunks, dim=dim) for piece in slices]
    return torch.cat([torch.cat([run[c] for run in runs], dim=dim) for c in range(chunks)], dim=dim)
