"""Tensor-parallel plans for the cost, schedule and simulator tests: two nodes of eight
H100s (NVLink inside, InfiniBand between), stages of tensor groups with equal shares,
sequence parallel unless a test says otherwise (the layout the planner makes), and
round-robin routes over each stage's leaders."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cluster_builders import cluster, group
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, Schedule, Stage, ZeroMode
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

TWO_H100_NODES = cluster(
    "two-h100-nodes",
    group("h100", "H100-SXM", 8, count=2, intra="450GB/s", nic=("infiniband", "50GB/s")),
)


def tp_stage(
    *,
    layers: tuple[int, int],
    ranks: Sequence[int],
    degree: int,
    num_micro_batches: int,
    zero: ZeroMode = ZeroMode.NONE,
    micro_batch_size: int = 1,
    recompute: Recompute = Recompute.NONE,
    layout: TensorLayout | None = None,
) -> Stage:
    """A stage of consecutive tensor groups of ``degree``, each running
    ``num_micro_batches`` and holding an equal share of the state, in ``layout`` (default:
    sequence parallel at degree > 1, the layout the planner makes)."""
    if layout is None:
        layout = TensorLayout.SEQUENCE if degree > 1 else TensorLayout.BLOCKS
    n = len(ranks)
    return Stage(
        layer_start=layers[0],
        layer_end=layers[1],
        ranks=tuple(ranks),
        micro_batch_size=(micro_batch_size,) * n,
        num_micro_batches=(num_micro_batches,) * n,
        shard_fraction=(1.0 / n,) * n,
        zero=zero,
        recompute=recompute,
        tensor_parallel_degree=degree,
        tensor_layout=layout,
    )


def tp_plan(
    model: ModelSpec | str,
    stages: Sequence[Stage],
    *,
    cluster_spec: ClusterSpec = TWO_H100_NODES,
    seq_len: int = 1024,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
) -> Plan:
    """A plan of ``stages`` whose micro-batch j visits leader j mod (its tensor groups) of
    every stage (so every stage's groups must split the micro-batches evenly)."""
    spec = load_model(model) if isinstance(model, str) else model
    first = stages[0]
    num_routes = sum(first.group_micro_batches)
    routes = tuple(
        tuple(stage.leaders[j % len(stage.leaders)] for stage in stages) for j in range(num_routes)
    )
    return Plan(
        cluster=cluster_spec,
        model=spec,
        job=JobSpec(global_batch_size=num_routes * first.micro_batch_size[0], seq_len=seq_len),
        stages=tuple(stages),
        routes=routes,
        schedule=schedule,
    )


def two_node_plan(
    model: str,
    *,
    cut: int,
    zero: ZeroMode = ZeroMode.OPTIMIZER,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    num_micro_batches: int = 32,
    layout: TensorLayout = TensorLayout.SEQUENCE,
) -> Plan:
    """Layers [0, cut) at tensor-parallel degree 2 in ``layout`` on node 0 (four groups),
    the rest at degree 1 on node 1 (eight ranks)."""
    num_layers = load_model(model).num_layers
    return tp_plan(
        model,
        [
            tp_stage(
                layers=(0, cut),
                ranks=range(8),
                degree=2,
                num_micro_batches=num_micro_batches // 4,
                zero=zero,
                layout=layout,
            ),
            tp_stage(
                layers=(cut, num_layers),
                ranks=range(8, 16),
                degree=1,
                num_micro_batches=num_micro_batches // 8,
                zero=zero,
            ),
        ],
        schedule=schedule,
    )


def tp4_dp2_plan(
    model: str,
    *,
    zero: ZeroMode = ZeroMode.NONE,
    num_micro_batches: int = 16,
    layout: TensorLayout = TensorLayout.SEQUENCE,
) -> Plan:
    """One stage of all layers on node 0: two tensor groups of four, in ``layout``."""
    num_layers = load_model(model).num_layers
    return tp_plan(
        model,
        [
            tp_stage(
                layers=(0, num_layers),
                ranks=range(8),
                degree=4,
                num_micro_batches=num_micro_batches // 2,
                zero=zero,
                layout=layout,
            )
        ],
    )


def collapsed(plan: Plan) -> Plan:
    """``plan`` with every tensor group replaced by its leader at degree 1 (holding the
    group's share of the state)."""

    def collapse(stage: Stage) -> Stage:
        t = stage.tensor_parallel_degree
        return dataclasses.replace(
            stage,
            ranks=stage.leaders,
            micro_batch_size=stage.micro_batch_size[::t],
            num_micro_batches=stage.group_micro_batches,
            shard_fraction=tuple(f * t for f in stage.shard_fraction[::t]),
            tensor_parallel_degree=1,
            tensor_layout=TensorLayout.BLOCKS,
        )

    return dataclasses.replace(plan, stages=tuple(collapse(s) for s in plan.stages))
