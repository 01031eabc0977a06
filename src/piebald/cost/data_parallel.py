"""A plan's stage as its data-parallel groups see it: the ring they sync over, the bytes and
shares they sync, and the part of the training state each rank owns.

At tensor-parallel degree 1 a stage is one data-parallel group of all its ranks, syncing
the stage's parameters with the plan's shard fractions. At degree t a stage has t of them,
one per position in its tensor groups (``Stage.data_parallel_group``): each syncs the
per-rank slice of the stage (``ModelSpec.stage_params(..., tensor_parallel_degree=t)``),
and each member's share of that slice is t times its plan fraction (fractions are of the
whole stage). The t groups are alike -- the same shares, one member in every tensor group
and so the same nodes -- and sync at once on different GPUs: one of them prices the stage,
its ring giving each group 1/t of every NIC it crosses (``comm.ring_profile``'s
``rings_per_nic``; inside a node every GPU has its own port).

The plan estimate and the simulator's prices read the stage's sync and each rank's owned
parameters from here, so both price them alike (and the planner can too).
"""

from __future__ import annotations

from dataclasses import replace

from piebald.cost.comm import RingProfile, ring_profile
from piebald.cost.precision import stage_wire_dtype
from piebald.cost.replica_broadcast import broadcasts_per_step, weights_broadcast_s
from piebald.cost.zero_comm import StageComm, stage_comm
from piebald.specs.plan import Plan, Stage

__all__ = [
    "data_parallel_ring",
    "data_parallel_shares",
    "owned_params",
    "plan_stage_comm",
    "stage_slice_params",
]


def stage_slice_params(plan: Plan, stage_index: int) -> float:
    """Parameters one rank of the stage holds whole before any sharding: its tensor slice
    of the stage's layers in the stage's layout (all of them at degree 1), tied replica
    included."""
    stage = plan.stages[stage_index]
    return float(
        plan.model.stage_params(
            stage.layer_start,
            stage.layer_end,
            tensor_parallel_degree=stage.tensor_parallel_degree,
            layout=stage.tensor_layout,
        )
    )


def data_parallel_shares(stage: Stage, rank: int) -> tuple[float, ...]:
    """The shares of their slice that the members of ``rank``'s data-parallel group own, in
    group order (summing to 1): the plan's fractions times the degree."""
    t = stage.tensor_parallel_degree
    return tuple(
        stage.shard_fraction[stage.ranks.index(member)] * t
        for member in stage.data_parallel_group(rank)
    )


def owned_params(plan: Plan, stage_index: int, position: int) -> float:
    """Parameters the rank at ``position`` of the stage steps in its optimizer: its share of
    its slice where the optimizer state is sharded, the whole slice otherwise. A tensor
    group's member other than its leader owns nothing of what the group holds whole, nor
    of the tied weight (``runtime.distributed.group_layout``): its share is of the split
    weights alone."""
    stage = plan.stages[stage_index]
    t = stage.tensor_parallel_degree
    if not stage.zero.shards_optimizer:
        return stage_slice_params(plan, stage_index)
    share = stage.shard_fraction[position] * t
    if stage.ranks[position] in stage.leaders:
        return stage_slice_params(plan, stage_index) * share
    layers = plan.model.layers_at(t, stage.tensor_layout)[stage.layer_start : stage.layer_end]
    return float(sum(layer.num_params - layer.num_whole_params for layer in layers)) * share


def data_parallel_ring(plan: Plan, stage_index: int) -> RingProfile:
    """The ring of the stage's first data-parallel group, sharing its NICs with the other
    t - 1 groups (module docstring)."""
    stage = plan.stages[stage_index]
    return ring_profile(
        plan.cluster,
        stage.data_parallel_group(stage.ranks[0]),
        rings_per_nic=stage.tensor_parallel_degree,
    )


def plan_stage_comm(plan: Plan, stage_index: int) -> StageComm:
    """The stage's data-parallel collectives (``zero_comm.stage_comm``), each run by every
    one of its data-parallel groups at once: the slice's bytes in the group's wire dtype
    over one group's ring, with that group's shares; under ZeRO-2 at degree > 1 the
    step-end gather is followed by the leaders' broadcast of the weights their groups
    hold whole (``cost.replica_broadcast``), priced in ``all_gather_s``."""
    stage = plan.stages[stage_index]
    group = stage.data_parallel_group(stage.ranks[0])
    # A tensor group sits in one node, so every data-parallel group has one member on each
    # node the stage spans: the same GPU types, hence the stage's wire dtype.
    wire = stage_wire_dtype(plan.cluster, stage.ranks, precision=plan.job.precision)
    comm = stage_comm(
        data_parallel_ring(plan, stage_index),
        shard_fractions=data_parallel_shares(stage, group[0]),
        zero=stage.zero,
        state_bytes=stage_slice_params(plan, stage_index) * wire.num_bytes,
    )
    t = stage.tensor_parallel_degree
    if not broadcasts_per_step(stage.zero, t):
        return comm
    # ZeRO-2 under tensor parallelism: after the step-end gather among the leaders, each
    # hands the layers its group holds whole on to its members (``cost.replica_broadcast``);
    # the stage waits for its slowest group.
    cluster = plan.cluster
    broadcast_s = max(
        weights_broadcast_s(
            cluster,
            tensor_group,
            model=plan.model,
            layers=(stage.layer_start, stage.layer_end),
            layout=stage.tensor_layout,
            dtype=cluster.device_of(tensor_group[0]).training_dtype(plan.job.precision),
        )
        for tensor_group in stage.tensor_groups
    )
    return replace(comm, all_gather_s=comm.all_gather_s + broadcast_s)
