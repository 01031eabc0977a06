"""One micro-batch's forward and backward through a stage on one of its ranks: the rank's
compute of its tensor slice, its tensor group's collectives inside the pass, and the
broadcast of the input its leader received.

Compute is ``cost.pass_times`` of a shape of the stage's degree and layout (one rank's
slice of the layers, ``ModelSpec.layers_at``), the collectives of the blocks and the
stage's edges ``cost.tensor_comm``'s. Only a group's leader talks to the neighbouring
stages (routes name leaders): it receives the micro-batch's activation and, after the next
stage's backward, the gradient of its output, and passes each on to its members before
they can start (every member needs the whole input; the members of the sending group hold
identical copies after their last block's all-reduce, or sequence parallel the gather of
its output, so only one of them sends). The broadcast runs on the node's link: a
pipelined broadcast moves every byte over each of the group's t - 1 hops once, with
chunks in flight on all of them, so alpha per hop plus one message's S / B
(:func:`group_broadcast_s`, ``comm.broadcast_time_s``). The first stage reads its rows
from the data on every member, and the last stage's loss is whole on every member (the
head is not split): neither broadcasts.

Under ZeRO-3 each pass also waits for the leader's broadcast of the gathered weights the
group holds whole, layer by layer (``cost.replica_broadcast``). At degree 1 a pass is its
compute alone. The plan estimate, the simulator's prices and (at given layer bounds) the
planner price a rank's pass with :func:`rank_pass`; the planner's stage matrices add up
the same terms for every layer range at once, with ``cost.tensor_comm.tensor_comm_s``,
:func:`input_broadcast_s` and ``replica_broadcast.layer_broadcasts_s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from piebald.cost import replica_broadcast
from piebald.cost.comm import RingProfile, broadcast_time_s, ring_profile
from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import PassTimes, pass_times
from piebald.cost.precision import activation_message_bytes
from piebald.cost.tensor_comm import TensorComm, tensor_comm
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan

__all__ = [
    "RankPass",
    "group_broadcast_s",
    "input_broadcast_s",
    "member_comm_s",
    "plan_rank_pass",
    "rank_pass",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankPass:
    """One micro-batch's passes through a stage on one rank, by part."""

    compute_forward_s: float
    compute_backward_s: float  # a recomputed forward's included
    tensor: TensorComm  # the block all-reduces
    broadcast_forward_s: float  # the received activation, leader to members
    broadcast_backward_s: float  # the received output gradient, leader to members
    # Under ZeRO-3, the gathered weights the group holds whole, leader to members, layer by
    # layer before each pass (``cost.replica_broadcast``).
    weights_broadcast_s: float = 0.0

    @property
    def tensor_forward_s(self) -> float:
        """The forward's tensor-parallel communication: all-reduces and broadcasts."""
        return float(
            member_comm_s(
                collectives_s=self.tensor.forward_s,
                input_broadcast_s=self.broadcast_forward_s,
                weights_broadcast_s=self.weights_broadcast_s,
            )
        )

    @property
    def tensor_backward_s(self) -> float:
        """The backward's tensor-parallel communication: all-reduces and broadcasts."""
        return float(
            member_comm_s(
                collectives_s=self.tensor.backward_s,
                input_broadcast_s=self.broadcast_backward_s,
                weights_broadcast_s=self.weights_broadcast_s,
            )
        )

    @property
    def forward_s(self) -> float:
        return self.compute_forward_s + self.tensor_forward_s

    @property
    def backward_s(self) -> float:
        return self.compute_backward_s + self.tensor_backward_s

    @property
    def pass_s(self) -> float:
        return self.forward_s + self.backward_s


def member_comm_s(*, collectives_s: Any, input_broadcast_s: Any, weights_broadcast_s: Any) -> Any:
    """What one direction of a tensor-group member's pass adds to its compute: its
    group's collectives in the layers (``cost.tensor_comm``), the received input (or
    output gradient) its leader broadcasts, and the weights the group holds whole
    broadcast before the pass (ZeRO-3, ``cost.replica_broadcast``). Elementwise over
    arrays of layer ranges (the planner's matrices) as over one range."""
    return collectives_s + input_broadcast_s + weights_broadcast_s


def group_broadcast_s(cluster: ClusterSpec, group: Sequence[int], *, num_bytes: float) -> float:
    """A message of ``num_bytes`` from a tensor group's leader to its other members (none
    for a group of one): alpha per hop plus S / B on the node's link."""
    if len(group) <= 1:
        return 0.0
    link = cluster.link_between(group[0], group[1])
    return broadcast_time_s(num_bytes=num_bytes, link=link, num_ranks=len(group))


def input_broadcast_s(
    cluster: ClusterSpec,
    group: Sequence[int],
    *,
    model: ModelSpec,
    job: JobSpec,
    micro_batch_size: int,
) -> float:
    """:func:`group_broadcast_s` of one micro-batch's stage input (or its gradient, the
    same size) as ``group``'s leader passes it on."""
    num_bytes = activation_message_bytes(
        cluster.device_of(group[0]),
        precision=job.precision,
        micro_batch_size=micro_batch_size,
        seq_len=job.seq_len,
        hidden_size=model.arch.hidden_size,
    )
    return group_broadcast_s(cluster, group, num_bytes=num_bytes)


def rank_pass(
    model: ModelSpec,
    *,
    start: int,
    end: int,
    shape: PassShape,
    times: PassTimes,
    ring: RingProfile,
    broadcast_s: float,
    receives_activation: bool,
    receives_gradient: bool,
    weights_broadcast_s: float = 0.0,
) -> RankPass:
    """The passes through layers [start, end) of a rank of shape ``shape`` (its degree
    included), ``times`` its ``pass_times``, on a tensor group whose ring is ``ring`` and
    whose leader broadcasts a received input in ``broadcast_s`` (``group_broadcast_s``),
    an activation where the stage has one before it, a gradient where it has one after,
    and the layers' whole weights in ``weights_broadcast_s`` before each pass (ZeRO-3)."""
    return RankPass(
        compute_forward_s=times.forward_s(start, end),
        compute_backward_s=times.backward_s(start, end),
        tensor=tensor_comm(model, start=start, end=end, shape=shape, ring=ring),
        broadcast_forward_s=broadcast_s if receives_activation else 0.0,
        broadcast_backward_s=broadcast_s if receives_gradient else 0.0,
        weights_broadcast_s=weights_broadcast_s,
    )


def plan_rank_pass(
    plan: Plan, *, stage_index: int, position: int, curve: EfficiencyCurve = DEFAULT_CURVE
) -> RankPass:
    """:func:`rank_pass` of the rank at ``position`` of stage ``stage_index`` of ``plan``."""
    stage = plan.stages[stage_index]
    rank = stage.ranks[position]
    device = plan.cluster.device_of(rank)
    size = stage.micro_batch_size[position]
    shape = PassShape.for_job(
        plan.job,
        device=device,
        micro_batch_size=size,
        recompute=stage.recompute,
        tensor_parallel_degree=stage.tensor_parallel_degree,
        tensor_layout=stage.tensor_layout,
    )
    group = stage.tensor_groups[position // stage.tensor_parallel_degree]
    broadcast_weights_s = 0.0
    if replica_broadcast.broadcasts_per_pass(stage.zero, stage.tensor_parallel_degree):
        broadcast_weights_s = replica_broadcast.weights_broadcast_s(
            plan.cluster,
            group,
            model=plan.model,
            layers=(stage.layer_start, stage.layer_end),
            layout=stage.tensor_layout,
            dtype=shape.dtype,
        )
    return rank_pass(
        plan.model,
        start=stage.layer_start,
        end=stage.layer_end,
        shape=shape,
        times=pass_times(plan.model, shape=shape, curve=curve),
        ring=ring_profile(plan.cluster, group),
        broadcast_s=input_broadcast_s(
            plan.cluster, group, model=plan.model, job=plan.job, micro_batch_size=size
        ),
        receives_activation=stage_index > 0,
        receives_gradient=stage_index < plan.num_stages - 1,
        weights_broadcast_s=broadcast_weights_s,
    )
