"""Passes of a ZeRO-2/3 stage, layer by layer: gather a layer's parameters right before
it runs, release them after, and reduce-scatter its gradients as soon as its backward is
done (DeepSpeed ZeRO-2/3, FSDP), over the uneven shards of the stage's streamed buckets
(:mod:`piebald.runtime.distributed.buckets`).

A pass runs each layer as its own autograd graph ("island"): the layer's input is a
detached leaf, so the backward pass can run one layer at a time with exactly that layer's
parameters present, and the gradient of its input carries on to the layer before. The
gradients equal those of one graph through the whole part (the same operations, in the
same order, within each layer).

ZeRO-3 prefetch: while layer k computes, the gather of layer k + 1 (in the pass's order)
runs in the background, so at most two layers' parameters are present at once, which is
what ``cost.memory`` counts. ZeRO-2 gathers nothing (parameters stay resident) and only
reduce-scatters.

Every rank of the stage group makes the same collective calls in the same order (same
layers, same passes; the plan gives a ZeRO-2/3 stage equal micro-batch counts and one
pass pattern, ``piebald.specs.plan``).

Tensor-parallel stages: a layer may read two streamed buckets, its whole weights' (over
the tensor groups' leaders, each leader broadcasting the gathered layer to its group) and
its slices' (over the rank's data-parallel group). Every rank visits them in bucket order,
so each group sees its collectives in one order on all its ranks, and a layer's tensor
sums (``models.tensor_ops``) come after its gathers on every member alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from piebald.runtime.distributed.flat_bucket import FlatBucket
from piebald.runtime.models.stage_part import StagePart

__all__ = ["Island", "LayerStream"]


@dataclass(slots=True)
class Island:
    """One layer's part of a forward pass, kept for its backward."""

    layer_index: int
    inputs: torch.Tensor  # a leaf that requires grad, or token ids for the embedding
    output: torch.Tensor


class LayerStream:
    """Runs forward and backward passes of ``part`` layer by layer over its streamed
    buckets (see the module docstring)."""

    def __init__(self, part: StagePart, buckets: Sequence[FlatBucket]) -> None:
        streamed = [b for b in buckets if b.streamed]
        owner = {id(p): b for b in streamed for p in b.params}
        self.part = part
        self.buckets = tuple(streamed)
        # The streamed buckets each layer reads, in bucket order.
        self.needs: dict[int, tuple[FlatBucket, ...]] = {}
        for index in part.layer_indices:
            used = {id(owner[id(p)]) for p in part.parameters_used_by(index) if id(p) in owner}
            self.needs[index] = tuple(b for b in streamed if id(b) in used)
        # A bucket's gradient is final once the first layer reading it (the last in the
        # backward pass) is done.
        self.reduce_after: dict[int, tuple[FlatBucket, ...]] = {
            index: tuple(
                b
                for b in self.needs[index]
                if min(i for i in part.layer_indices if b in self.needs[i]) == index
            )
            for index in part.layer_indices
        }

    # --- parameters around a layer ------------------------------------------------------------

    def _enter(self, order: Sequence[int], k: int) -> None:
        """Before layer ``order[k]``: its parameters present, the next layer's on the way."""
        for bucket in self.needs[order[k]]:
            if bucket.gather_pending:
                bucket.finish_gather()
            elif bucket.sharded_at_rest and not bucket.params_resident:
                bucket.publish_params()
        if k + 1 < len(order):
            for bucket in self.needs[order[k + 1]]:
                if bucket.sharded_at_rest and not bucket.params_resident:
                    bucket.start_gather()

    def _leave(self, order: Sequence[int], k: int) -> None:
        """After layer ``order[k]``: release what the next layer does not read."""
        keep = self.needs[order[k + 1]] if k + 1 < len(order) else ()
        for bucket in self.needs[order[k]]:
            if bucket not in keep:
                bucket.release_params()

    # --- passes -------------------------------------------------------------------------------

    def forward(
        self,
        x: torch.Tensor,
        *,
        loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> list[Island]:
        """One forward pass from ``x`` (token ids, or the received activation leaf); with
        ``loss`` (the last stage) the last island's output is the loss of the logits."""
        order = list(self.part.layer_indices)
        rope = self.part.rope(x)
        islands: list[Island] = []
        for k, index in enumerate(order):
            self._enter(order, k)
            inputs = x if k == 0 else x.detach().requires_grad_()
            output = self.part.run_layer(index, inputs, rope)
            if loss is not None and k == len(order) - 1:
                output = loss(output)
            self._leave(order, k)
            islands.append(Island(layer_index=index, inputs=inputs, output=output))
            x = output
        return islands

    def backward(self, islands: list[Island], gradient: torch.Tensor | None) -> None:
        """The backward pass of a forward's ``islands``, last layer first, consuming the
        list (each layer's activations are freed once its backward is done): ``gradient``
        is that of the last output (None: the output is the loss to differentiate). The
        gradient of the first island's input is left in its ``.grad``."""
        order = [island.layer_index for island in reversed(islands)]
        for k in range(len(order)):
            island = islands.pop()
            self._enter(order, k)
            if gradient is None:
                torch.autograd.backward(island.output)
            else:
                torch.autograd.backward(island.output, grad_tensors=gradient)
            self._leave(order, k)
            for bucket in self.reduce_after[island.layer_index]:
                bucket.reduce_pass_gradients()
            if k + 1 < len(order):  # the first island's input gradient is the caller's
                gradient = island.inputs.grad
                island.inputs.grad = None
