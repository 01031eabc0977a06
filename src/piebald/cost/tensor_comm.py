"""A tensor group's collectives inside every block pass (Megatron-LM tensor parallelism,
Shoeybi et al. 2019, section 3).

A block split over a tensor group of t ranks (``ModelSpec.layers_at``) meets its group
twice per forward: after the attention's output projection and after the MLP's down
projection, each rank holds a partial sum of the block's output, and an all-reduce of the
micro-batch's activations (``b x s x h`` values in the compute dtype) completes it
(Megatron's "g"). The backward does the same for the gradients of the column-parallel
layers' input ("f"), twice per block. A recomputed block (full or selective,
``specs.recompute``) runs its forward's collectives again but the last: torch stops the
rerun before the block's last matmul (``specs.layer_ops.block_reruns``), so the collective
that completes it does not run again -- one of the two all-reduces runs again, or three
of the four all-gathers and reduce-scatters under ``sequence``
(``tests/distributed/test_sequence_parallel.py`` counts them). The runtime waits for each
before the next op, so they add to the pass (no overlap with the GEMMs, as piebald's
runtime and torchtitan's vanilla TP run them; Megatron-Core's ``--tp-comm-overlap`` hides
part of them, which is not modelled).

What a stage adds at its edges depends on its layout (``specs.tensor_layout``). Under
``blocks`` nothing: the embedding and head are not split and meet nothing. Under
``vocabulary`` the embedding's output is a partial sum (each member looks up its rows of
the vocabulary only): one all-reduce in the forward; so is the head's input gradient (each
member holds its columns of the head only): one in the backward. Under ``sequence`` each
block all-reduce is a reduce-scatter and an all-gather that move the same bytes on a ring
(Korthikanti et al. 2022, section 4.2.2), priced as the all-reduce; a stage of blocks
takes its input whole and keeps each member's shard (its backward all-gathers the input
gradient back, whole on every member, as the previous stage or the replicated embedding
needs it), and all-gathers its output in the forward (for the next stage, or the whole
head; the backward keeps each member's shard of the gradient, identical on every member).
Under ``vocabulary-sequence`` the embedding reduce-scatters its partial output straight to
the shards and the head all-gathers its input, reduce-scattering that gradient back: one
all-gather's or reduce-scatter's worth more at each end. Left out: the loss's own
reductions (a few floats per token for the parallel cross-entropy), the all-gather
Megatron-LM repeats in the backward to rebuild a column-parallel layer's input from the
sequence shard it kept, which it overlaps with the input-gradient GEMM (Korthikanti
section 4.2.2; piebald's runtime does the same, ``runtime.models.tensor_ops``;
torchtitan keeps the gathered input instead), and the all-reduce of the gradients of the
norm weights and row-parallel biases a sequence-parallel member applies to its chunk
only (h values per norm, not per token).

:func:`tensor_comm_s` is the one formula: the plan estimate and the simulator price a
stage through :func:`tensor_comm` (one layer range), the planner's stage matrices through
it directly (every range at once, ``planner.stage_costs``).

The rings run over the group's ranks inside one node (``cost.comm.ring_profile``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from piebald.cost.comm import Collective, RingProfile
from piebald.cost.pass_shape import PassShape
from piebald.specs.model import LayerKind, ModelSpec

__all__ = [
    "ALL_REDUCES_PER_BLOCK_PASS",
    "NO_TENSOR_COMM",
    "TensorComm",
    "block_tensor_comm",
    "rerun_share",
    "tensor_comm",
    "tensor_comm_s",
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


def _message_bytes(model: ModelSpec, *, shape: PassShape, ring: RingProfile) -> float | None:
    """The micro-batch's activations (``b x s x h`` in the compute dtype) every collective
    of the group moves; None where there is no group to meet (degree 1)."""
    if shape.tensor_parallel_degree == 1 or ring.num_ranks <= 1:
        return None
    return float(shape.num_tokens * model.arch.hidden_size * shape.dtype.num_bytes)


def block_tensor_comm(model: ModelSpec, *, shape: PassShape, ring: RingProfile) -> TensorComm:
    """The all-reduces of one micro-batch of ``shape`` through one block on a tensor group
    whose ring is ``ring`` (nothing at degree 1)."""
    message_bytes = _message_bytes(model, shape=shape, ring=ring)
    if message_bytes is None:
        return NO_TENSOR_COMM
    one_s = ring.time_s(Collective.ALL_REDUCE, num_bytes=message_bytes)
    forward_s = ALL_REDUCES_PER_BLOCK_PASS * one_s
    return TensorComm(forward_s=forward_s, backward_s=forward_s * (1.0 + rerun_share(shape)))


def rerun_share(shape: PassShape) -> float:
    """The share of a block's forward collectives its backward runs again (module
    docstring): all but the last under recompute, none without."""
    if not shape.recompute.checkpoints:
        return 0.0
    # Sequence parallel, each all-reduce is an all-gather and a reduce-scatter.
    per_pass = ALL_REDUCES_PER_BLOCK_PASS * (2 if shape.tensor_layout.splits_sequence else 1)
    return (per_pass - 1) / per_pass


def _edge_tensor_comm_s(
    model: ModelSpec,
    *,
    holds_embedding: Any,
    holds_head: Any,
    num_blocks: Any,
    shape: PassShape,
    ring: RingProfile,
) -> tuple[Any, Any]:
    """(forward, backward) seconds of the collectives of one micro-batch of ``shape`` at
    the edges of a stage of ``num_blocks`` blocks, holding the embedding and the head or
    not: the vocabulary-parallel embedding's and head's, and the sequence's gathers
    (module docstring; nothing under ``blocks`` or at degree 1). The head is never
    recomputed. Elementwise: scalars, or arrays over layer ranges."""
    layout = shape.tensor_layout
    message_bytes = _message_bytes(model, shape=shape, ring=ring)
    if message_bytes is None:
        return 0.0, 0.0
    if layout.splits_sequence:
        # As floats: numpy adds booleans as a logical or.
        has_blocks = np.greater(num_blocks, 0).astype(np.float64)
        # One all-gather or reduce-scatter (the same bytes on a ring) each.
        half_s = ring.time_s(Collective.ALL_GATHER, num_bytes=message_bytes)
        vocabulary = layout.splits_vocabulary
        forward = has_blocks + np.logical_and(vocabulary, holds_embedding)
        backward = has_blocks + np.logical_and(vocabulary, holds_head)
        return half_s * forward, half_s * backward
    if not layout.splits_vocabulary:
        return 0.0, 0.0
    whole_s = ring.time_s(Collective.ALL_REDUCE, num_bytes=message_bytes)
    return whole_s * np.asarray(holds_embedding), whole_s * np.asarray(holds_head)


def tensor_comm_s(
    model: ModelSpec,
    *,
    holds_embedding: Any,
    holds_head: Any,
    num_blocks: Any,
    shape: PassShape,
    ring: RingProfile,
) -> tuple[Any, Any]:
    """(forward, backward) seconds of the collectives of one micro-batch of ``shape``
    through a stage of ``num_blocks`` blocks, holding the embedding and the head or not,
    on a tensor group whose ring is ``ring``: its blocks' and its edges'. Elementwise over
    arrays of layer ranges (the planner's stage matrices) as over one range
    (:func:`tensor_comm`): the one formula both price a tensor-parallel pass with."""
    one = block_tensor_comm(model, shape=shape, ring=ring)
    edge_forward_s, edge_backward_s = _edge_tensor_comm_s(
        model,
        holds_embedding=holds_embedding,
        holds_head=holds_head,
        num_blocks=num_blocks,
        shape=shape,
        ring=ring,
    )
    return (
        num_blocks * one.forward_s + edge_forward_s,
        num_blocks * one.backward_s + edge_backward_s,
    )


def tensor_comm(
    model: ModelSpec, *, start: int, end: int, shape: PassShape, ring: RingProfile
) -> TensorComm:
    """The collectives of one micro-batch of ``shape`` through layers [start, end) on a
    tensor group whose ring is ``ring`` (nothing at degree 1): its blocks' and its
    edges' (:func:`tensor_comm_s`)."""
    num_blocks = sum(1 for layer in model.layers[start:end] if layer.kind is LayerKind.BLOCK)
    forward_s, backward_s = tensor_comm_s(
        model,
        holds_embedding=start == 0,
        holds_head=end == model.num_layers,
        num_blocks=num_blocks,
        shape=shape,
        ring=ring,
    )
    return TensorComm(forward_s=float(forward_s), backward_s=float(backward_s))
