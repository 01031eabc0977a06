"""Plans and prices for the simulator tests: a small Llama, one-node clusters of a 1 TFLOP/s
GPU type, pipelines built stage by stage, and prices with round numbers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from cluster_builders import HALF_GPU, ROUND_GPU, hand_model
from piebald.cost.zero_comm import StageComm
from piebald.schedule.prices import Prices, Transfer
from piebald.specs.cluster import ClusterSpec, Link, LinkKind
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan, Schedule, Stage, ZeroMode

SEQ_LEN = 32
GPU_TYPES = [ROUND_GPU, HALF_GPU]
model = hand_model


def cluster(
    *groups: tuple[str, int], intra_link: str = "100GB/s", nic: str | None = None
) -> ClusterSpec:
    """One node per (GPU type, count) group; nodes talk over ``nic`` (InfiniBand)."""
    nodes: list[dict[str, Any]] = []
    for index, (gpu, count) in enumerate(groups):
        node: dict[str, Any] = {
            "name": f"n{index}",
            "gpu": gpu,
            "gpus_per_node": count,
            "intra_link": intra_link,
        }
        if nic is not None:
            node["nic"] = {"kind": "infiniband", "bandwidth": nic}
        nodes.append(node)
    return parse_cluster({"name": "hand", "gpu_types": GPU_TYPES, "nodes": nodes}, source="test")


def pipeline(
    cluster_spec: ClusterSpec,
    *,
    stage_ranks: Sequence[Sequence[int]],
    counts: Sequence[Sequence[int]],
    routes: Sequence[Sequence[int]],
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    micro_batch_size: int = 1,
    zero: ZeroMode = ZeroMode.NONE,
    shard_fractions: Sequence[Sequence[float]] | None = None,
    num_blocks: int | None = None,
) -> Plan:
    """A plan whose stage i holds ranks ``stage_ranks[i]``; layers split as evenly as the
    model allows (one block more than stages by default)."""
    p = len(stage_ranks)
    spec = model(num_blocks if num_blocks is not None else max(1, p))
    layers = spec.num_layers
    bounds = [round(i * layers / p) for i in range(p + 1)]
    total = sum(counts[0])
    stages = tuple(
        Stage(
            layer_start=bounds[i],
            layer_end=bounds[i + 1],
            ranks=tuple(stage_ranks[i]),
            micro_batch_size=(micro_batch_size,) * len(stage_ranks[i]),
            num_micro_batches=tuple(counts[i]),
            shard_fraction=(
                tuple(shard_fractions[i])
                if shard_fractions is not None
                else (1.0 / len(stage_ranks[i]),) * len(stage_ranks[i])
            ),
            zero=zero,
        )
        for i in range(p)
    )
    return Plan(
        cluster=cluster_spec,
        model=spec,
        job=JobSpec(global_batch_size=total * micro_batch_size, seq_len=SEQ_LEN),
        stages=stages,
        routes=tuple(tuple(route) for route in routes),
        schedule=schedule,
    )


FREE_LINK = Link(kind=LinkKind.INTRA_NODE, bandwidth_bytes_per_s=math.inf, latency_s=0.0)
NO_COMM = StageComm(
    gather_pass_s=0.0, scatter_pass_s=0.0, all_reduce_s=0.0, reduce_scatter_s=0.0, all_gather_s=0.0
)


class FixedPrices(Prices):
    """Hand-chosen pass times per rank; free transfers, no collectives, no optimizer time."""

    def __init__(
        self,
        plan: Plan,
        *,
        forward_s: Mapping[int, float],
        backward_s: Mapping[int, float],
        in_flight: Mapping[int, int] | None = None,
    ) -> None:
        super().__init__(plan)
        self.fixed_forward, self.fixed_backward = forward_s, backward_s
        self.fixed_in_flight = in_flight
        self.stages = (NO_COMM,) * plan.num_stages

    def forward_s(self, rank: int) -> float:
        return self.fixed_forward[rank]

    def backward_s(self, rank: int) -> float:
        return self.fixed_backward[rank]

    def optimizer_s(self, rank: int) -> float:
        return 0.0

    def in_flight_limit(self, rank: int) -> int:
        if self.fixed_in_flight is not None:
            return self.fixed_in_flight[rank]
        return super().in_flight_limit(rank)

    def transfer(self, sender: int, receiver: int) -> Transfer:
        return Transfer(num_bytes=0.0, link=FREE_LINK, resources=())
