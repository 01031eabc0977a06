"""The leader's broadcast of the weights a tensor group holds whole, under ZeRO-2 and 3.

Under tensor parallelism a group's members all hold the weights it does not split -- the
norms, the row-parallel biases, and the embedding and head unless the vocabulary is split
(``LayerSpec.num_whole_params``) -- and the group's leader owns their sharded state
(``runtime.distributed.group_layout``). Under ZeRO-2 and 3 the runtime streams them layer
by layer (``runtime.distributed.buckets``): each layer's are reduced and gathered among the
leaders alone, and after every gather each leader hands the gathered layer on to its
members, one broadcast per layer over the tensor group, which the members wait for
(``flat_bucket``'s routed buckets). ZeRO-3 gathers before every pass through a layer, so
each forward and each backward pass broadcasts the stage's layers once; ZeRO-2 keeps the
weights and gathers once per step, after the optimizer, so the broadcasts follow the
step-end all-gather. ZeRO none and 1 keep the whole weights in one bucket over the stage
group, where every member receives the gather itself: no broadcast.

A layer's broadcast is ``comm.broadcast_time_s`` of its whole weights in the compute dtype
(a tensor group sits in one node: one GPU type, one dtype). The plan estimate and the
simulator (``rank_pass``, ``data_parallel``) and the planner's stage matrices
(``planner.stage_costs``) all price them with :func:`layer_broadcasts_s`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from piebald.cost.comm import broadcast_time_s
from piebald.specs.cluster import ClusterSpec, Link
from piebald.specs.devices import Dtype
from piebald.specs.model import ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.tensor_layout import TensorLayout

__all__ = [
    "broadcasts_per_pass",
    "broadcasts_per_step",
    "layer_broadcasts_s",
    "weights_broadcast_s",
]


def broadcasts_per_pass(zero: ZeroMode, degree: int) -> bool:
    """Whether each pass broadcasts the stage's whole weights (ZeRO-3 at degree > 1)."""
    return degree > 1 and zero.gathers_per_pass


def broadcasts_per_step(zero: ZeroMode, degree: int) -> bool:
    """Whether the step's end broadcasts them, after the all-gather (ZeRO-2 at degree > 1:
    streamed layers whose weights stay resident)."""
    return degree > 1 and zero.per_pass and not zero.gathers_per_pass


@functools.lru_cache(maxsize=256)
def layer_broadcasts_s(
    model: ModelSpec, *, degree: int, layout: TensorLayout, dtype: Dtype, link: Link
) -> tuple[float, ...]:
    """Per layer (by index), the leader's broadcast of the layer's whole weights in
    ``dtype`` to the other ``degree - 1`` members over ``link`` (their node's,
    ``comm.broadcast_time_s``); 0 for a layer with none, and at degree 1."""
    return tuple(
        broadcast_time_s(
            num_bytes=layer.num_whole_params * dtype.num_bytes, link=link, num_ranks=degree
        )
        if layer.num_whole_params
        else 0.0
        for layer in model.layers_at(degree, layout)
    )


def weights_broadcast_s(
    cluster: ClusterSpec,
    group: Sequence[int],
    *,
    model: ModelSpec,
    layers: tuple[int, int],
    layout: TensorLayout,
    dtype: Dtype,
) -> float:
    """The broadcasts of layers [start, end) by ``group``'s leader, one after another (0 for
    a group of one)."""
    if len(group) <= 1:
        return 0.0
    start, end = layers
    link = cluster.link_between(group[0], group[1])
    per_layer = layer_broadcasts_s(model, degree=len(group), layout=layout, dtype=dtype, link=link)
    return sum(per_layer[start:end])
