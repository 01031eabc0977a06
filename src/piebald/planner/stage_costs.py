"""Price one stage for every layer range at once: the matrices the layer-split DP reads.

For a stage (its ranks, its position in a pipeline of p stages, a micro-batch size),
``cost[a, b]`` is the time the stage needs per step for layers [a, b): its busy time plus
its data-parallel sync, under the best (ZeRO mode, recompute) setting that fits every
rank's memory, ``inf`` where none fits. Busy time uses the continuous relaxation of the
micro-batch allocation, M / sum_r 1 / t_r(a, b), which the exact allocation then rounds;
memory uses the same formulas as the exact check (``stage_memory_bytes``), with each
rank's micro-batches in flight estimated from its speed share.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from piebald.cost.comm import RingProfile, ring_profile
from piebald.cost.compute import EfficiencyCurve
from piebald.cost.layer_table import pass_times
from piebald.cost.memory import stage_memory_bytes, stage_params_matrix
from piebald.cost.zero_comm import stage_comm
from piebald.planner.stage_builder import StageRules
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import ZeroMode

__all__ = ["StageCost", "stage_cost"]

Matrix = npt.NDArray[np.float64]
_MAKESPAN_STEPS = 8
_PROBE_BYTES = (1e6, 1e9)  # collective time is affine in bytes: two probes give the line


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    cost_s: Matrix  # per-step time of the stage for layers [a, b); inf where nothing fits
    pass_s: Matrix  # one micro-batch through the stage on its slowest rank


def _affine_comm(
    profile: RingProfile, num_ranks: int, zero: ZeroMode
) -> tuple[tuple[float, float], tuple[float, float]]:
    """(intercept, slope per byte) of per-pass traffic and of the end-of-step sync."""
    even = tuple(1.0 / num_ranks for _ in range(num_ranks))
    low, high = (
        stage_comm(profile, shard_fractions=even, zero=zero, state_bytes=size)
        for size in _PROBE_BYTES
    )
    span = _PROBE_BYTES[1] - _PROBE_BYTES[0]

    def line(lo: float, hi: float) -> tuple[float, float]:
        slope = (hi - lo) / span
        return lo - slope * _PROBE_BYTES[0], slope

    per_pass = line(
        low.before_forward_s + low.during_backward_s, high.before_forward_s + high.during_backward_s
    )
    return per_pass, line(low.sync_s, high.sync_s)


def stage_cost(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    ranks: tuple[int, ...],
    micro_batch_size: int,
    stage_index: int,
    num_stages: int,
    rules: StageRules,
    curve: EfficiencyCurve,
) -> StageCost:
    # inf and 0 entries (invalid ranges) divide freely; they are masked at the end.
    with np.errstate(divide="ignore", invalid="ignore"):
        return _stage_cost(
            cluster,
            model=model,
            job=job,
            ranks=ranks,
            micro_batch_size=micro_batch_size,
            stage_index=stage_index,
            num_stages=num_stages,
            rules=rules,
            curve=curve,
        )


def _stage_cost(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    ranks: tuple[int, ...],
    micro_batch_size: int,
    stage_index: int,
    num_stages: int,
    rules: StageRules,
    curve: EfficiencyCurve,
) -> StageCost:
    size = model.num_layers + 1
    start = np.arange(size)[:, None]
    end = np.arange(size)[None, :]
    valid = start < end
    classes = Counter(cluster.device_of(rank) for rank in ranks)
    num_micro_batches = job.global_batch_size / micro_batch_size
    neighbors = (stage_index > 0) + (stage_index < num_stages - 1)
    depth = num_stages - stage_index  # micro-batches in flight in the stage under 1F1B
    wire = 4.0 if job.precision is Dtype.FP32 else 2.0
    params = stage_params_matrix(model)
    profile = ring_profile(cluster, ranks)
    comm_of = {zero: _affine_comm(profile, len(ranks), zero) for zero in rules.zero_modes}
    best = np.full((size, size), np.inf)
    best_pass = np.full((size, size), np.inf)
    for recompute in rules.recompute:
        times: dict[DeviceType, Matrix] = {}
        for device in classes:
            prefix = pass_times(
                model,
                device=device,
                dtype=device.training_dtype(job.precision),
                micro_batch_size=micro_batch_size,
                seq_len=job.seq_len,
                recompute=recompute,
                curve=curve,
            ).total_prefix_s
            times[device] = np.where(valid, prefix[None, :] - prefix[:, None], np.inf)
        for zero in rules.zero_modes:
            (pass_a, pass_b), (sync_a, sync_b) = comm_of[zero]
            comm_pass = np.where(params > 0, pass_a + pass_b * params * wire, 0.0)
            rate = np.zeros((size, size))
            for device, count in classes.items():
                rate += count / (times[device] + comm_pass)
            busy = _makespan(
                {d: times[d] + comm_pass for d in classes},
                classes,
                num_micro_batches,
                continuous=num_micro_batches / rate,
            )
            sync = np.where(params > 0, sync_a + sync_b * params * wire, 0.0)
            fits = _fits(
                model,
                job=job,
                classes=classes,
                times=times,
                rate=rate,
                comm_pass=comm_pass,
                num_micro_batches=num_micro_batches,
                depth=depth,
                zero=zero,
                recompute=recompute,
                micro_batch_size=micro_batch_size,
                neighbors=neighbors,
                even_shards=rules.even_shards or zero is ZeroMode.NONE,
                num_ranks=len(ranks),
            )
            cost = np.where(valid & fits, busy + sync, np.inf)
            slowest = np.maximum.reduce([times[d] + comm_pass for d in classes])
            better = cost < best
            best = np.where(better, cost, best)
            best_pass = np.where(better, slowest, best_pass)
    return StageCost(cost_s=best, pass_s=best_pass)


def _makespan(
    times: dict[DeviceType, Matrix],
    classes: Counter[DeviceType],
    num_micro_batches: float,
    *,
    continuous: Matrix,
) -> Matrix:
    """The integer min-makespan of the micro-batches over the stage's ranks, for every range.

    It is the smallest T with sum_k n_k floor(T / t_k) >= M, and such a T is a multiple of
    some t_k; starting from the continuous bound M / sum_k (n_k / t_k), step to the next
    such breakpoint until enough micro-batches fit (a few steps; capped, which can only
    leave the estimate at the continuous bound's side, never above the exact value)."""
    makespan = continuous
    for _ in range(_MAKESPAN_STEPS):
        fitted = sum(n * np.floor(makespan / times[d] + 1e-9) for d, n in classes.items())
        short = fitted < num_micro_batches - 1e-9
        if not np.any(short):
            break
        following = np.minimum.reduce(
            [(np.floor(makespan / times[d] + 1e-9) + 1.0) * times[d] for d in classes]
        )
        makespan = np.where(short, following, makespan)
    result: Matrix = makespan
    return result


def _fits(
    model: ModelSpec,
    *,
    job: JobSpec,
    classes: Counter[DeviceType],
    times: dict[DeviceType, Matrix],
    rate: Matrix,
    comm_pass: Matrix,
    num_micro_batches: float,
    depth: int,
    zero: ZeroMode,
    recompute: bool,
    micro_batch_size: int,
    neighbors: int,
    even_shards: bool,
    num_ranks: int,
) -> npt.NDArray[np.bool_]:
    """Where every rank fits: with even shards each on its own, otherwise the free memory of
    all ranks together holds the sharded state (water-filling succeeds)."""
    all_fit = np.ones(rate.shape, dtype=bool)
    shard_capacity = np.zeros(rate.shape)  # sum over ranks of free bytes / sharded bytes
    for device, count in classes.items():
        share = 1.0 / (times[device] + comm_pass) / rate  # this rank's share of the stage
        micro_batches = np.ceil(num_micro_batches * share)
        in_flight = np.maximum(1.0, np.minimum(micro_batches, np.ceil(depth * share)))
        fixed, sharded = stage_memory_bytes(
            model,
            layers=None,
            device=device,
            dtype=device.training_dtype(job.precision),
            optimizer=job.optimizer,
            zero=zero,
            micro_batch_size=micro_batch_size,
            seq_len=job.seq_len,
            num_in_flight=in_flight,
            recompute=recompute,
            num_neighbor_stages=neighbors,
        )
        free = device.memory_bytes - fixed
        if even_shards:
            all_fit &= free >= sharded / num_ranks
        else:
            all_fit &= free >= 0
            with np.errstate(divide="ignore", invalid="ignore"):
                shard_capacity += count * np.where(sharded > 0, free / sharded, np.inf)
    if not even_shards:
        all_fit &= shard_capacity >= 1.0
    result: npt.NDArray[np.bool_] = all_fit
    return result
