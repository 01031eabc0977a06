"""A tensor group's collectives inside every block pass (Megatron-LM tensor parallelism,
Shoeybi et al. 2019, section 3).

A block split over a tensor group of t ranks (``ModelSpec.layers_at``) meets its group
twice per forward: after the attention's output projection and after the MLP's down
projection, each rank holds a partial sum of the block's output, and an all-reduce of the
micro-batch's activations (``b x s x h`` values in the compute dtype) completes it
(Megatron's "g"). The backward does the same for the gradients of the column-parallel
layers' input ("f"), twice per block; a recomputed block runs its forward's two again. The
runtime waits for each before the next op, so they add to the pass; the embedding and the
head are not split and meet nothing. No sequence parallelism: its reduce-scatter and
all-gather move the same bytes as the all-reduce (Korthikanti et al. 2022, section 4.2.2)
and would lower only activation memory.

The rings run over the group's ranks inside one node (``cost.comm.ring_profile``).
"""

from __future__ import annotations

from dataclasses import dataclass

from piebald.cost.comm import Collective, RingProfile
from piebald.cost.pass_shape import PassShape
from piebald.specs.model import LayerKind, ModelSpec

__all__ = [
    "ALL_REDUCES_PER_BLOCK_PASS",
    "NO_TENSOR_COMM",
    "TensorComm",
    "block_tensor_comm",
    "tensor_comm",
]

ALL_REDUCES_PER_BLOCK_PASS = 2  # attention output and MLP output (forward), or their inputs


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorComm:
    """One micro-batch's tensor-group collectives through a stage's layers."""

    forward_s: float
    backward_s: float  # a recomputed forward's included

    @property
    def pass_s(self) -> float:
        return self.forward_s + self.backward_s


NO_TENSOR_COMM = TensorComm(forward_s=0.0, backward_s=0.0)


def block_tensor_comm(model: ModelSpec, *, shape: PassShape, ring: RingProfile) -> TensorComm:
    """The all-reduces of one micro-batch of ``shape`` through one block on a tensor group
    whose ring is ``ring`` (nothing at degree 1)."""
    if shape.tensor_parallel_degree == 1 or ring.num_ranks <= 1:
        return NO_TENSOR_COMM
    message_bytes = shape.num_tokens * model.arch.hidden_size * shape.dtype.num_bytes
    one_s = ring.time_s(Collective.ALL_REDUCE, num_bytes=message_bytes)
    forward_s = ALL_REDUCES_PER_BLOCK_PASS * one_s
    return TensorComm(forward_s=forward_s, backward_s=forward_s * (2.0 if shape.recompute else 1.0))


def tensor_comm(
    model: ModelSpec, *, start: int, end: int, shape: PassShape, ring: RingProfile
) -> TensorComm:
    """The all-reduces of one micro-batch of ``shape`` through layers [start, end) on a
    tensor group whose ring is ``ring`` (nothing at degree 1)."""
    one = block_tensor_comm(model, shape=shape, ring=ring)
    num_blocks = sum(1 for layer in model.layers[start:end] if layer.kind is LayerKind.BLOCK)
    return TensorComm(forward_s=num_blocks * one.forward_s, backward_s=num_blocks * one.backward_s)
