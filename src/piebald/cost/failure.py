"""The price of a failure, and the checkpoint interval a failure rate calls for.

A run that fails goes back to its last checkpoint. What one failure costs
(:class:`FailureCost`), in the order it happens:

- **detect**: until the survivors know (a heartbeat's expiry, or for a hang the
  collective timeout);
- **restart**: starting the processes again and initialising their process groups;
- **re-plan**: piebald's planner on the GPUs that are left (on the recovery's critical
  path unless precomputed: research note ``schedules_and_elasticity.md``, B.2);
- **restore**: every rank reading back its shard of the last checkpoint;
- **lost work**: the steps since that checkpoint, on average half an interval of them.

What a checkpoint costs: each rank writes what it owns of the training state, its fp32
master shard and Adam's moments (``runtime.distributed.checkpoint``), to storage every
node reaches (a shared file system). The ranks of one node share that node's path to the
storage (its NIC or storage client), so a node writes the sum of its ranks' bytes at its
one bandwidth, and the save ends when the slowest node is done (the ranks then agree
before the manifest is written): save = max over nodes of node bytes / write bandwidth.
A file system whose total bandwidth is below the sum of its clients' is described by
passing its share per node. Restore reads the same bytes at the read bandwidth.

The interval: J. W. Young, "A first order approximation to the optimum checkpoint interval",
Comm. ACM 17(9), 1974: tau = sqrt(2 delta M) for a save of delta seconds and a mean time
between failures M; J. T. Daly, "A higher order estimate of the optimum checkpoint interval
for restart dumps", Future Generation Computer Systems 22(3), 2006:
tau = sqrt(2 delta M) (1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)) - delta for
delta < 2M, else M. Both are compute time between checkpoints, here a whole number of
steps. The expected overhead of a run at interval tau (Young's first-order model) is
delta / tau (saving) + (tau / 2 + R) / M (per failure half an interval lost and the
recovery R = detect + restart + re-plan + restore), which Young's interval minimises.

Defaults, each a named constant with its source; every one can be overridden
(:class:`FailureModel`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from piebald.cost.memory import rank_memory
from piebald.cost.pass_shape import PassShape
from piebald.errors import ArgumentError
from piebald.specs.devices import Dtype
from piebald.specs.plan import Plan, ZeroMode
from piebald.specs.units import parse_rate

__all__ = [
    "DEFAULT_DETECT_S",
    "DEFAULT_READ_BYTES_PER_S",
    "DEFAULT_REPLAN_S",
    "DEFAULT_RESTART_S",
    "DEFAULT_WRITE_BYTES_PER_S",
    "FailureCost",
    "FailureModel",
    "FailurePrice",
    "checkpoint_restore_s",
    "checkpoint_save_s",
    "daly_interval_s",
    "failure_cost",
    "interval_steps",
    "node_checkpoint_bytes",
    "overhead_fraction",
    "price_failures",
    "rank_checkpoint_bytes",
    "young_interval_s",
]

# Per node, to the checkpoint storage: 20 Gb/s, the remote persistent storage bandwidth of
# Gemini (Wang et al., "Gemini: Fast Failure Recovery in Distributed Training with
# In-Memory Checkpoints", SOSP 2023: "it takes 42 minutes to checkpoint the
# model states of MT-NLG [...] when the bandwidth is 20Gbps"). A node's NVMe or a parallel
# file system is faster, a cloud object store slower: pass what yours measures.
DEFAULT_WRITE_BYTES_PER_S = parse_rate("20Gb/s")
# Reading back: the same path, and no separate figure in the same source.
DEFAULT_READ_BYTES_PER_S = DEFAULT_WRITE_BYTES_PER_S
# A lost node is noticed when its heartbeats stop: torchrun's c10d rendezvous declares a
# node dead after keep_alive_max_attempt (3) missed keep-alives of keep_alive_interval (5 s)
# (torch's RendezvousTimeout defaults, docs/research/torch_distributed.md section 5, where
# a killed node's survivors formed a new world about 14 s later). A hang instead waits for
# the collective timeout (NCCL's default is 10 minutes): pass that.
DEFAULT_DETECT_S = 15.0
# An assumption, not a measurement: the re-rendezvous alone took about 1 s on CPU
# (torch_distributed.md section 5); a GPU job also starts Python, imports torch, creates
# its CUDA contexts and NCCL communicators, which take tens of seconds at scale.
DEFAULT_RESTART_S = 30.0
# piebald's own planning time for a 1,024-GPU cluster of six GPU types: 14.6 s, the
# whole `piebald plan` command (docs/results/planning-time.md).
DEFAULT_REPLAN_S = 15.0


def _check(argument: str, value: object, *, positive: bool) -> None:
    """``value`` is a finite real number, > 0 where ``positive``, else >= 0."""
    bound = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(argument=argument, value=value, expected=f"a finite number {bound}")
    if not math.isfinite(value) or (value <= 0 if positive else value < 0):
        raise ArgumentError(argument=argument, value=value, expected=f"a finite number {bound}")


def _check_steps(argument: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(argument=argument, value=value, expected="a whole number >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureModel:
    """How often a run fails and what recovering costs, apart from the plan itself.

    ``mtbf_s``: the mean time between failures of the whole run (all its GPUs together;
    Llama 3 405B on 16,384 H100s saw 419 unexpected interruptions in 54 days, one every
    3.1 hours: Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.4);
    ``write_bytes_per_s`` and ``read_bytes_per_s``: one node's bandwidth to the checkpoint
    storage; ``detect_s``, ``restart_s``, ``replan_s``: as the module docstring says.
    The defaults are the module's constants, with their sources."""

    mtbf_s: float
    write_bytes_per_s: float = DEFAULT_WRITE_BYTES_PER_S
    read_bytes_per_s: float = DEFAULT_READ_BYTES_PER_S
    detect_s: float = DEFAULT_DETECT_S
    restart_s: float = DEFAULT_RESTART_S
    replan_s: float = DEFAULT_REPLAN_S

    def __post_init__(self) -> None:
        _check("mtbf_s", self.mtbf_s, positive=True)
        _check("write_bytes_per_s", self.write_bytes_per_s, positive=True)
        _check("read_bytes_per_s", self.read_bytes_per_s, positive=True)
        _check("detect_s", self.detect_s, positive=False)
        _check("restart_s", self.restart_s, positive=False)
        _check("replan_s", self.replan_s, positive=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureCost:
    """What one failure costs, in seconds of the run's wall time (module docstring)."""

    detect_s: float
    restart_s: float
    replan_s: float
    restore_s: float
    lost_work_s: float  # expected: half a checkpoint interval of steps

    @property
    def recovery_s(self) -> float:
        """Everything but the lost work: from the failure to the first step again."""
        return self.detect_s + self.restart_s + self.replan_s + self.restore_s

    @property
    def total_s(self) -> float:
        return self.recovery_s + self.lost_work_s


def rank_checkpoint_bytes(plan: Plan) -> dict[int, float]:
    """Bytes each rank the plan uses writes to a checkpoint: what it owns of its stage's
    fp32 master weights and optimizer moments (``runtime.distributed.checkpoint``).

    It owns its shard fraction of them whatever the stage's ZeRO mode (a replicated
    optimizer still checkpoints only its shard), and a tensor group's member other than
    its leader owns nothing of what the group holds whole. That is what
    ``cost.memory.rank_memory`` counts as the optimizer state of a 16-bit rank under
    ZeRO-1 (Megatron-LM's accounting: fp32 master, m and v, 12 bytes a parameter with
    AdamW, the master's 4 with SGD), so it is priced by that one function: at 16 bits and
    ZeRO-1 whatever the rank computes in (an fp32 rank's weights are its master, the same
    bytes)."""
    out: dict[int, float] = {}
    alike: dict[tuple[object, ...], float] = {}  # a large plan's ranks repeat a few kinds
    for stage_index, stage in enumerate(plan.stages):
        t = stage.tensor_parallel_degree
        for position, rank in enumerate(stage.ranks):
            device = plan.cluster.device_of(rank)
            replica = rank not in stage.leaders
            fraction = stage.shard_fraction[position] * t
            key = (stage_index, device.name, stage.micro_batch_size[position], fraction, replica)
            if key in alike:
                out[rank] = alike[key]
                continue
            shape = PassShape(
                device=device,
                dtype=Dtype.BF16,  # 16-bit accounting: the fp32 master is optimizer state
                micro_batch_size=stage.micro_batch_size[position],
                seq_len=plan.job.seq_len,
                recompute=stage.recompute,
                tensor_parallel_degree=t,
                tensor_layout=stage.tensor_layout,
            )
            memory = rank_memory(
                plan.model,
                shape=shape,
                layer_start=stage.layer_start,
                layer_end=stage.layer_end,
                optimizer=plan.job.optimizer,
                zero=ZeroMode.OPTIMIZER,
                shard_fraction=fraction,
                num_in_flight=1,
                num_neighbor_stages=(stage_index > 0) + (stage_index < plan.num_stages - 1),
                replica=replica,
            )
            out[rank] = alike[key] = memory.optimizer_bytes
    return out


def node_checkpoint_bytes(plan: Plan) -> dict[int, float]:
    """Bytes each node (by its index in the cluster) writes to a checkpoint: the sum of
    its ranks' (:func:`rank_checkpoint_bytes`); nodes the plan does not use are absent."""
    out: dict[int, float] = {}
    for rank, num_bytes in rank_checkpoint_bytes(plan).items():
        node = plan.cluster.node_of(rank).index
        out[node] = out.get(node, 0.0) + num_bytes
    return out


def checkpoint_save_s(plan: Plan, *, write_bytes_per_s: float = DEFAULT_WRITE_BYTES_PER_S) -> float:
    """Seconds one checkpoint of ``plan`` takes: the slowest node's bytes at its write
    bandwidth (the module docstring says why per node)."""
    _check("write_bytes_per_s", write_bytes_per_s, positive=True)
    return max(node_checkpoint_bytes(plan).values()) / write_bytes_per_s


def checkpoint_restore_s(
    plan: Plan, *, read_bytes_per_s: float = DEFAULT_READ_BYTES_PER_S
) -> float:
    """Seconds reading ``plan``'s checkpoint back takes: the same bytes as
    :func:`checkpoint_save_s`, at the read bandwidth."""
    _check("read_bytes_per_s", read_bytes_per_s, positive=True)
    return max(node_checkpoint_bytes(plan).values()) / read_bytes_per_s


def young_interval_s(*, save_s: float, mtbf_s: float) -> float:
    """Young's optimum compute time between checkpoints, sqrt(2 delta M) (Young 1974)."""
    _check("save_s", save_s, positive=False)
    _check("mtbf_s", mtbf_s, positive=True)
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval_s(*, save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (Daly 2006): for delta < 2M,
    sqrt(2 delta M) (1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)) - delta, else M. For
    delta << M it tends to Young's (their ratio is 1 - (2/3) sqrt(delta / 2M) + ...)."""
    _check("save_s", save_s, positive=False)
    _check("mtbf_s", mtbf_s, positive=True)
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - save_s


def interval_steps(interval_s: float, *, step_time_s: float) -> int:
    """An interval in whole steps of ``step_time_s``: the nearest, at least 1."""
    _check("interval_s", interval_s, positive=False)
    _check("step_time_s", step_time_s, positive=True)
    return max(1, round(interval_s / step_time_s))


def overhead_fraction(
    *, interval_s: float, save_s: float, mtbf_s: float, recovery_s: float
) -> float:
    """The expected share of a run's time lost to checkpoints and failures at one checkpoint
    every ``interval_s`` of compute, to first order (Young 1974):
    delta / tau + (tau / 2 + R) / M, with R the recovery from a failure to the first step
    again (:attr:`FailureCost.recovery_s`)."""
    _check("interval_s", interval_s, positive=True)
    _check("save_s", save_s, positive=False)
    _check("mtbf_s", mtbf_s, positive=True)
    _check("recovery_s", recovery_s, positive=False)
    return save_s / interval_s + (interval_s / 2.0 + recovery_s) / mtbf_s


def failure_cost(
    *, model: FailureModel, restore_s: float, step_time_s: float, checkpoint_every: int
) -> FailureCost:
    """What one failure costs a run that checkpoints every ``checkpoint_every`` steps of
    ``step_time_s`` and restores in ``restore_s`` (:func:`checkpoint_restore_s`): the
    model's detect, restart and re-plan times, the restore, and the expected lost work,
    half an interval of steps (a failure falls anywhere in the interval, uniformly)."""
    _check("restore_s", restore_s, positive=False)
    _check("step_time_s", step_time_s, positive=True)
    _check_steps("checkpoint_every", checkpoint_every)
    return FailureCost(
        detect_s=model.detect_s,
        restart_s=model.restart_s,
        replan_s=model.replan_s,
        restore_s=restore_s,
        lost_work_s=checkpoint_every / 2.0 * step_time_s,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FailurePrice:
    """Everything :func:`price_failures` found for one plan and failure model.

    ``checkpoint_bytes``: the most one node writes; ``save_s``: one checkpoint;
    ``young_steps`` and ``daly_steps``: the optimum intervals in steps;
    ``checkpoint_every``: the interval priced (given, or Daly's); ``cost``: one failure at
    that interval; ``overhead``: the expected share of the run lost at it, and
    ``daly_overhead`` at Daly's."""

    model: FailureModel
    step_time_s: float
    checkpoint_bytes: float
    save_s: float
    young_steps: int
    daly_steps: int
    checkpoint_every: int
    given: bool  # checkpoint_every was given, not Daly's
    cost: FailureCost
    overhead: float
    daly_overhead: float


def price_failures(
    plan: Plan,
    *,
    model: FailureModel,
    step_time_s: float,
    checkpoint_every: int | None = None,
) -> FailurePrice:
    """The price of failures of ``plan`` stepping every ``step_time_s``: its save time,
    Young's and Daly's intervals in steps, and one failure's cost and the run's expected
    overhead at ``checkpoint_every`` steps (default: Daly's interval)."""
    _check("step_time_s", step_time_s, positive=True)
    if checkpoint_every is not None:
        _check_steps("checkpoint_every", checkpoint_every)
    checkpoint_bytes = max(node_checkpoint_bytes(plan).values())
    # checkpoint_save_s and checkpoint_restore_s, the bytes counted once
    save_s = checkpoint_bytes / model.write_bytes_per_s
    young = interval_steps(
        young_interval_s(save_s=save_s, mtbf_s=model.mtbf_s), step_time_s=step_time_s
    )
    daly = interval_steps(
        daly_interval_s(save_s=save_s, mtbf_s=model.mtbf_s), step_time_s=step_time_s
    )
    every = daly if checkpoint_every is None else checkpoint_every
    cost = failure_cost(
        model=model,
        restore_s=checkpoint_bytes / model.read_bytes_per_s,
        step_time_s=step_time_s,
        checkpoint_every=every,
    )

    def overhead(steps: int) -> float:
        return overhead_fraction(
            interval_s=steps * step_time_s,
            save_s=save_s,
            mtbf_s=model.mtbf_s,
            recovery_s=cost.recovery_s,
        )

    return FailurePrice(
        model=model,
        step_time_s=step_time_s,
        checkpoint_bytes=checkpoint_bytes,
        save_s=save_s,
        young_steps=young,
        daly_steps=daly,
        checkpoint_every=every,
        given=checkpoint_every is not None,
        cost=cost,
        overhead=overhead(every),
        daly_overhead=overhead(daly),
    )
