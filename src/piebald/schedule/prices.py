"""What every operation of a plan costs, priced with the planner's own cost functions.

The simulator must differ from the closed-form estimate (``piebald.cost.plan_estimate``)
only through the schedule, never through prices, so every number here comes from the same
functions with the same arguments: ``plan_rank_pass`` for a pass (compute of the rank's
tensor slice, its tensor group's collectives and input broadcast), ``p2p_time_s``'s
alpha-beta model over ``cluster.link_between`` for activation hops, ``plan_stage_comm``
(one data-parallel group's slice bytes and shares over its ring) for collectives,
``optimizer_step_time_s`` of ``owned_params`` for the optimizer, ``plan_rank_memory`` for
memory (its activations measured where the curve carries measurements, as the planner's
are). Ranks of one device type and micro-batch size in a stage cost the same, so each
distinct operation is priced once.

A transfer also names the physical resources it occupies, so concurrent transfers can share
them (``piebald.schedule.network``): inside a node each GPU's own port (NVLink and PCIe
lanes are per GPU), between nodes the sending node's NIC out and the receiving node's NIC in
(the RDMA port or the Ethernet port, whichever the link uses; NICs are full duplex), between
sites also the site link in that direction.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from piebald.cost.comm import p2p_time_s
from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, optimizer_step_time_s
from piebald.cost.data_parallel import owned_params, plan_stage_comm
from piebald.cost.in_flight import stage_in_flight
from piebald.cost.link_resources import transfer_resources
from piebald.cost.memory import plan_rank_memory
from piebald.cost.precision import activation_message_bytes
from piebald.cost.rank_pass import RankPass, plan_rank_pass
from piebald.specs.cluster import Link
from piebald.specs.devices import DeviceType
from piebald.specs.plan import Plan

__all__ = ["Prices", "Transfer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """One point-to-point message: alpha-beta alone, and the resources it shares."""

    num_bytes: float
    link: Link  # alpha and the path's rate when nothing else uses it
    resources: tuple[tuple[Hashable, float], ...]  # (resource, capacity in bytes/s)

    @property
    def alone_s(self) -> float:
        """The message with nothing else on its path: alpha + S / B."""
        return p2p_time_s(num_bytes=self.num_bytes, link=self.link)


class Prices:
    """Durations, transfers and memory of every operation of ``plan``."""

    def __init__(self, plan: Plan, *, curve: EfficiencyCurve = DEFAULT_CURVE) -> None:
        self.plan = plan
        self.curve = curve
        self.stages = tuple(plan_stage_comm(plan, index) for index in range(plan.num_stages))
        self._passes: dict[int, RankPass] = {}
        self._optimizer: dict[int, float] = {}
        self._memory: dict[int, tuple[float, float, int]] = {}
        self._transfers: dict[tuple[int, int], Transfer] = {}
        pass_of: dict[tuple[DeviceType, int, int, int], RankPass] = {}
        optimizer_of: dict[tuple[DeviceType, int, float, bool], float] = {}
        memory_of: dict[
            tuple[DeviceType, int, int, float, int, bool], tuple[float, float, int]
        ] = {}
        for index, stage in enumerate(plan.stages):
            for position, rank in enumerate(stage.ranks):
                device = plan.cluster.device_of(rank)
                size = stage.micro_batch_size[position]
                fraction = stage.shard_fraction[position]
                # (The node group sets a tensor group's link: part of a pass's kind.)
                kind = (device, size, index, plan.cluster.gpus[rank].group_index)
                if kind not in pass_of:
                    pass_of[kind] = plan_rank_pass(
                        plan, stage_index=index, position=position, curve=curve
                    )
                self._passes[rank] = pass_of[kind]
                stepped = (device, index, fraction, rank in stage.leaders)
                if stepped not in optimizer_of:
                    optimizer_of[stepped] = optimizer_step_time_s(
                        num_params=owned_params(plan, index, position),
                        device=device,
                        optimizer=plan.job.optimizer,
                        curve=curve,
                    )
                self._optimizer[rank] = optimizer_of[stepped]
                count = stage.num_micro_batches[position]
                # A tensor group's members hold less than its leader (``plan_rank_memory``).
                key = (device, size, index, fraction, count, rank in stage.leaders)
                if key not in memory_of:
                    memory_of[key] = self._rank_memory(index, position)
                self._memory[rank] = memory_of[key]

    def _rank_memory(self, index: int, position: int) -> tuple[float, float, int]:
        """(bytes held all step, bytes per micro-batch in flight, in-flight limit), as the
        plan estimate prices the rank (``plan_rank_memory``)."""
        limit = stage_in_flight(self.plan, index)[position]

        def memory(in_flight: int) -> float:
            return plan_rank_memory(
                self.plan,
                stage_index=index,
                position=position,
                num_in_flight=in_flight,
                curve=self.curve,
            ).total_bytes

        static = memory(0)
        return static, memory(1) - static, limit

    # -- compute ---------------------------------------------------------------------
    def forward_s(self, rank: int) -> float:
        """One forward pass: compute and tensor-parallel communication."""
        return self._passes[rank].forward_s

    def backward_s(self, rank: int) -> float:
        """One backward pass: compute and tensor-parallel communication."""
        return self._passes[rank].backward_s

    def tensor_forward_s(self, rank: int) -> float:
        """The tensor-parallel communication inside one forward pass (0 at degree 1)."""
        return self._passes[rank].tensor_forward_s

    def tensor_backward_s(self, rank: int) -> float:
        """The tensor-parallel communication inside one backward pass (0 at degree 1)."""
        return self._passes[rank].tensor_backward_s

    def optimizer_s(self, rank: int) -> float:
        return self._optimizer[rank]

    # -- memory ----------------------------------------------------------------------
    def static_memory_bytes(self, rank: int) -> float:
        """Weights, gradients, optimizer state, working buffers and reserve: held all step."""
        return self._memory[rank][0]

    def activation_bytes(self, rank: int) -> float:
        """Activations one micro-batch keeps from its forward until its backward ends."""
        return self._memory[rank][1]

    def in_flight_limit(self, rank: int) -> int:
        """Micro-batches the memory estimate lets the rank hold at once."""
        return self._memory[rank][2]

    # -- point to point ----------------------------------------------------------------
    def transfer(self, sender: int, receiver: int) -> Transfer:
        """An activation (or its gradient, the same size) from ``sender`` to ``receiver``."""
        key = (sender, receiver)
        if key not in self._transfers:
            self._transfers[key] = self._build_transfer(sender, receiver)
        return self._transfers[key]

    def _build_transfer(self, sender: int, receiver: int) -> Transfer:
        plan = self.plan
        cluster = plan.cluster
        stage = plan.stages[plan.stage_of_rank[sender]]
        size = stage.micro_batch_size[stage.ranks.index(sender)]
        num_bytes = activation_message_bytes(
            cluster.device_of(sender),
            precision=plan.job.precision,
            micro_batch_size=size,
            seq_len=plan.job.seq_len,
            hidden_size=plan.model.arch.hidden_size,
        )
        link = cluster.link_between(sender, receiver)
        resources = transfer_resources(cluster, sender, receiver)
        return Transfer(num_bytes=num_bytes, link=link, resources=resources)
