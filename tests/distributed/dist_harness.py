"""Shared pieces of the distributed tests: spawning gloo ranks, hand-written plans, and a toy
"model" split into stage parts whose single-process reference is easy to write.

Worker functions must be importable by plain module name in the spawned children, so they
live in modules on ``sys.path`` (tests/distributed/conftest.py puts this folder there).
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import os
import tempfile
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional

from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, Schedule, Stage, ZeroMode, weighted_round_robin
from piebald.specs.presets import PRESETS
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

PG_TIMEOUT_S = 30.0  # a hang becomes a failure well inside pytest's timeout


# --- spawning ---------------------------------------------------------------------------------


def _entry(
    rank: int,
    worker: Callable[..., None],
    world_size: int,
    init_method: str,
    args: tuple[Any, ...],
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    try:
        worker(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(worker: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``worker(rank, world_size, *args)`` on ``world_size`` gloo processes; an exception
    on any rank fails the call, and the other ranks are terminated (torch's join)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # forkserver: one clean server process imports torch and the workers once per test
    # session, and every rank is a fork of it (no threads started there, so forking is
    # safe). Spawning re-imports torch in every rank: 8-17 s per test on 2 busy cores.
    # torch._dynamo is imported lazily by the first torch.optim optimizer: 8 s per rank.
    multiprocessing.set_forkserver_preload(
        ["torch", "torch._dynamo", "dist_harness", "dist_workers"]
    )
    with tempfile.TemporaryDirectory() as scratch:
        init_method = f"file://{Path(scratch) / 'store'}"
        mp.start_processes(
            _entry,
            args=(worker, world_size, init_method, args),
            nprocs=world_size,
            start_method="forkserver",
            join=True,
        )


# --- plans ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageSpec:
    layer_end: int
    ranks: tuple[int, ...]
    num_micro_batches: tuple[int, ...]
    fractions: tuple[float, ...]
    zero: ZeroMode = ZeroMode.OPTIMIZER
    micro_batch_sizes: tuple[int, ...] | None = None  # None: 1 per rank
    recompute: Recompute = Recompute.NONE
    tensor_parallel_degree: int = 1  # consecutive runs of this many ranks: tensor groups
    # What the tensor groups split besides the blocks' heads and width; None: sequence
    # parallel at degree > 1 (the layout the planner makes), blocks at degree 1.
    tensor_layout: TensorLayout | None = None

    @property
    def layout(self) -> TensorLayout:
        if self.tensor_layout is not None:
            return self.tensor_layout
        return TensorLayout.SEQUENCE if self.tensor_parallel_degree > 1 else TensorLayout.BLOCKS


def make_plan(
    stages: Sequence[StageSpec],
    *,
    num_gpus: int,
    tied: bool = True,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    gpu_types: Sequence[str] | None = None,
    seq_len: int = 32,
    model: ModelSpec | None = None,
) -> Plan:
    """A plan for ``model`` (default: the 6-layer ``tiny`` model, embedding, 4 blocks, head,
    tied or not), micro-batch size 1 unless a stage says otherwise, routes by weighted round
    robin in every stage; rank r is a ``gpu_types[r]`` (default: all A100-80GB), consecutive
    equal types forming a node. Under tensor parallelism a stage lists every member's
    values (a tensor group's equal) and routes name the groups' leaders; its layout is
    sequence parallel unless it says otherwise."""
    if model is None:
        arch = dataclasses.replace(PRESETS["tiny"], tie_embeddings=tied)
        model = ModelSpec(name="tiny-tied" if tied else "tiny", arch=arch)
    types = list(gpu_types) if gpu_types is not None else ["A100-80GB"] * num_gpus
    assert len(types) == num_gpus, "one GPU type per rank"
    runs = [(name, len(list(group))) for name, group in itertools.groupby(types)]
    cluster = parse_cluster(
        {
            "name": "test",
            "nodes": [
                {
                    "name": f"n{index}",
                    "gpu": name,
                    "gpus_per_node": count,
                    "intra_link": "300GB/s",
                    "nic": {"kind": "infiniband", "bandwidth": "100Gb/s"},
                }
                for index, (name, count) in enumerate(runs)
            ],
        },
        source="test",
    )
    first = stages[0]
    t = first.tensor_parallel_degree
    num_mb = sum(first.num_micro_batches[::t])
    first_sizes = first.micro_batch_sizes or (1,) * len(first.ranks)
    global_batch = sum(
        n * size for n, size in zip(first.num_micro_batches[::t], first_sizes[::t], strict=True)
    )
    start = 0
    built = []
    for spec in stages:
        built.append(
            Stage(
                layer_start=start,
                layer_end=spec.layer_end,
                ranks=spec.ranks,
                micro_batch_size=spec.micro_batch_sizes or (1,) * len(spec.ranks),
                num_micro_batches=spec.num_micro_batches,
                shard_fraction=spec.fractions,
                zero=spec.zero,
                recompute=spec.recompute,
                tensor_parallel_degree=spec.tensor_parallel_degree,
                tensor_layout=spec.layout,
            )
        )
        start = spec.layer_end
    columns = []
    for spec in stages:
        t = spec.tensor_parallel_degree
        order = weighted_round_robin(list(spec.num_micro_batches[::t]))
        columns.append([spec.ranks[::t][i] for i in order])
    routes = tuple(tuple(column[j] for column in columns) for j in range(num_mb))
    return Plan(
        cluster=cluster,
        model=model,
        job=JobSpec(global_batch_size=global_batch, seq_len=seq_len),
        stages=tuple(built),
        routes=routes,
        schedule=schedule,
    )


# --- the toy model ----------------------------------------------------------------------------
# Roles: the first stage holds the embedding E and a Linear "a"; a middle stage holds "c";
# the last stage holds "b", a gain "norm" and the head, tied to E. Micro-batch j's loss on
# each role is a function of that role's parameters and data drawn from (seed, step, role,
# j), so the sum over all micro-batches and roles is the single-process reference loss.

VOCAB, HIDDEN, ROWS = 11, 6, 3

SHAPES: dict[str, tuple[int, ...]] = {
    "embed.weight": (VOCAB, HIDDEN),
    "a.weight": (HIDDEN, HIDDEN),
    "a.bias": (HIDDEN,),
    "c.weight": (HIDDEN, HIDDEN),
    "b.weight": (HIDDEN, HIDDEN),
    "norm.weight": (HIDDEN,),
}
ROLE_PARAMS = {
    "first": ("embed.weight", "a.weight", "a.bias"),
    "middle": ("c.weight",),
    "last": ("b.weight", "norm.weight", "embed.weight"),
}
TIED_NAME = "embed.weight"


def three_stage_plan() -> Plan:
    """Stages of 1, 1 and 2 ranks on ranks [3], [0], [2, 1], the last fully sharded 0.7/0.3
    (equal counts under GPipe, as ZeRO-3 needs), with a tied embedding/head."""
    return make_plan(
        [
            StageSpec(layer_end=2, ranks=(3,), num_micro_batches=(4,), fractions=(1.0,)),
            StageSpec(
                layer_end=4,
                ranks=(0,),
                num_micro_batches=(4,),
                fractions=(1.0,),
                zero=ZeroMode.NONE,
            ),
            StageSpec(
                layer_end=6,
                ranks=(2, 1),
                num_micro_batches=(2, 2),
                fractions=(0.7, 0.3),
                zero=ZeroMode.FULL,
            ),
        ],
        num_gpus=4,
        schedule=Schedule.GPIPE,
    )


def roles_of_stage(stage_index: int, num_stages: int) -> tuple[str, ...]:
    if num_stages == 1:
        return ("first", "middle", "last")
    if stage_index == 0:
        return ("first",)
    if stage_index == num_stages - 1:
        return ("middle", "last") if num_stages == 2 else ("last",)
    return ("middle",)


def stage_param_names(stage_index: int, num_stages: int) -> tuple[str, ...]:
    names: list[str] = []
    for role in roles_of_stage(stage_index, num_stages):
        names += [n for n in ROLE_PARAMS[role] if n not in names]
    return tuple(names)


def init_param(name: str, *, seed: int, dtype: torch.dtype = torch.float32) -> nn.Parameter:
    generator = torch.Generator().manual_seed(seed * 1000 + sorted(SHAPES).index(name))
    value = torch.randn(SHAPES[name], generator=generator) * 0.5
    if name == "norm.weight":
        value = 1.0 + 0.1 * value
    return nn.Parameter(value.to(dtype))


def build_params(
    names: Sequence[str], *, seed: int, dtype: torch.dtype = torch.float32
) -> dict[str, nn.Parameter]:
    return {name: init_param(name, seed=seed, dtype=dtype) for name in names}


def _data(seed: int, step: int, role: str, j: int) -> torch.Generator:
    # Not hash(): string hashing differs between processes.
    role_index = ("first", "middle", "last").index(role)
    return torch.Generator().manual_seed(((seed * 1009 + step) * 7 + role_index) * 1013 + j)


def role_loss(
    role: str, params: dict[str, nn.Parameter], *, seed: int, step: int, j: int, weight: float
) -> torch.Tensor:
    g = _data(seed, step, role, j)
    dtype = next(iter(params.values())).dtype
    if role == "first":
        tokens = torch.randint(VOCAB, (ROWS,), generator=g)
        target = torch.randn(ROWS, HIDDEN, generator=g).to(dtype)
        x = torch.tanh(
            functional.linear(params["embed.weight"][tokens], params["a.weight"], params["a.bias"])
        )
        return (x * target).sum() * weight
    if role == "middle":
        z = torch.randn(ROWS, HIDDEN, generator=g).to(dtype)
        target = torch.randn(ROWS, HIDDEN, generator=g).to(dtype)
        return (torch.tanh(functional.linear(z, params["c.weight"])) * target).sum() * weight
    z = torch.randn(ROWS, HIDDEN, generator=g).to(dtype)
    labels = torch.randint(VOCAB, (ROWS,), generator=g)
    h = functional.linear(z, params["b.weight"]) * params["norm.weight"]
    logits = h @ params["embed.weight"].t()
    return functional.cross_entropy(logits.float(), labels, reduction="sum") * weight


def local_loss(
    plan: Plan, rank: int, params: dict[str, nn.Parameter], *, seed: int, step: int
) -> torch.Tensor | None:
    """Backward-ready sum of this rank's micro-batch losses, or None if it has none."""
    stage_index = plan.stage_of_rank[rank]
    weight = 1.0 / len(plan.routes)
    total: torch.Tensor | None = None
    for j, route in enumerate(plan.routes):
        if route[stage_index] != rank:
            continue
        for role in roles_of_stage(stage_index, plan.num_stages):
            loss = role_loss(role, params, seed=seed, step=step, j=j, weight=weight)
            total = loss if total is None else total + loss
    return total


def reference_loss(
    plan: Plan, params: dict[str, nn.Parameter], *, seed: int, step: int
) -> torch.Tensor:
    weight = 1.0 / len(plan.routes)
    total = torch.zeros(())
    for j in range(len(plan.routes)):
        for role in ("first", "middle", "last"):
            total = total + role_loss(role, params, seed=seed, step=step, j=j, weight=weight)
    return total
