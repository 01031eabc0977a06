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
from piebald.cost.compute import EfficiencyCurve, optimizer_step_time_s
from piebald.cost.layer_table import pass_times
from piebald.cost.memory import stage_memory_bytes, stage_params_matrix
from piebald.cost.zero_comm import stage_comm
from piebald.planner.stage_builder import StageRules
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import ZeroMode

__all__ = ["StageCost", "stage_cost"]

Matrix = npt.NDArray[np.float64]
_MAKESPAN_STEPS = 8
_PROBE_BYTES = (1e6, 1e9)  # collective time is affine in bytes: two probes give the line


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    cost_s: Matrix  # busy + sync per step for layers [a, b); inf where nothing fits
    pass_s: Matrix  # one micro-batch through the stage on its slowest rank
    sync_s: Matrix  # the end-of-step data-parallel collectives (part of cost_s)
    optimizer_s: Matrix  # the stage's optimizer step (not part of cost_s)


def _affine_comm(
    profile: RingProfile, num_ranks: int, zero: ZeroMode
) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
    """(intercept, slope per byte) of the traffic a forward pass waits for, of the traffic
    a backward pass takes at least, and of the end-of-step sync."""
    even = tuple(1.0 / num_ranks for _ in range(num_ranks))
    low, high = (
        stage_comm(profile, shard_fractions=even, zero=zero, state_bytes=size)
        for size in _PROBE_BYTES
    )
    span = _PROBE_BYTES[1] - _PROBE_BYTES[0]

    def line(lo: float, hi: float) -> tuple[float, float]:
        slope = (hi - lo) / span
        return lo - slope * _PROBE_BYTES[0], slope

    return (
        line(low.before_forward_s, high.before_forward_s),
        line(low.during_backward_s, high.during_backward_s),
        line(low.sync_s, high.sync_s),
    )


# inf and 0 entries (invalid ranges) divide freely; they are masked at the end.
@np.errstate(divide="ignore", invalid="ignore")
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
    ranks_to_end: int,
) -> StageCost:
    size = model.num_layers + 1
    start = np.arange(size)[:, None]
    end = np.arange(size)[None, :]
    valid = start < end
    classes = Counter(cluster.device_of(rank) for rank in ranks)
    num_micro_batches = job.global_batch_size / micro_batch_size
    neighbors = (stage_index > 0) + (stage_index < num_stages - 1)
    depth = ranks_to_end  # ranks of this and the later stages: the 1F1B in-flight budget
    wire = float(job.precision.num_bytes)  # weights and gradients travel in this width
    params = stage_params_matrix(model)
    profile = ring_profile(cluster, ranks)
    comm_of = {zero: _affine_comm(profile, len(ranks), zero) for zero in rules.zero_modes}
    best = np.full((size, size), np.inf)
    best_pass = np.full((size, size), np.inf)
    best_sync = np.zeros((size, size))
    best_optimizer = np.zeros((size, size))
    # The optimizer step is memory-bound and linear in the parameters a rank owns.
    optimizer_per_param_s = max(
        optimizer_step_time_s(num_params=1.0, device=d, optimizer=job.optimizer, curve=curve)
        for d in classes
    )
    for recompute in rules.recompute:
        forward: dict[DeviceType, Matrix] = {}
        backward: dict[DeviceType, Matrix] = {}
        for device in classes:
            times = pass_times(
                model,
                device=device,
                dtype=device.training_dtype(job.precision),
                micro_batch_size=micro_batch_size,
                seq_len=job.seq_len,
                recompute=recompute,
                curve=curve,
            )
            forward[device] = _range_matrix(times.forward_prefix_s, valid)
            backward[device] = _range_matrix(times.backward_prefix_s, valid)
        for zero in rules.zero_modes:
            (pre_a, pre_b), (during_a, during_b), (sync_a, sync_b) = comm_of[zero]
            on_wire = params * wire
            # Per-pass traffic overlaps the pass, as in the exact stage and plan estimate.
            pass_of = {
                d: np.maximum(forward[d], np.where(params > 0, pre_a + pre_b * on_wire, 0.0))
                + np.maximum(backward[d], np.where(params > 0, during_a + during_b * on_wire, 0.0))
                for d in classes
            }
            rate = np.zeros((size, size))
            for device, count in classes.items():
                rate += count / pass_of[device]
            busy = _makespan(
                pass_of, classes, num_micro_batches, continuous=num_micro_batches / rate
            )
            sync = np.where(params > 0, sync_a + sync_b * on_wire, 0.0)
            fits = _fits(
                model,
                job=job,
                classes=classes,
                pass_of=pass_of,
                rate=rate,
                num_micro_batches=num_micro_batches,
                depth=depth,
                zero=zero,
                recompute=recompute,
                micro_batch_size=micro_batch_size,
                neighbors=neighbors,
                even_shards=rules.even_shards or zero is ZeroMode.NONE,
                num_ranks=len(ranks),
            )
            # The optimizer step stays out of the DP's cost: the step pays the slowest
            # stage's once, a max of its own, which the pipeline proxy adds.
            cost = np.where(valid & fits, busy + sync, np.inf)
            slowest = np.maximum.reduce([pass_of[d] for d in classes])
            owned = 1.0 if zero is ZeroMode.NONE else 1.0 / len(ranks)
            better = cost < best
            best = np.where(better, cost, best)
            best_pass = np.where(better, slowest, best_pass)
            best_sync = np.where(better, sync, best_sync)
            best_optimizer = np.where(
                better, params * owned * optimizer_per_param_s, best_optimizer
            )
    return StageCost(cost_s=best, pass_s=best_pass, sync_s=best_sync, optimizer_s=best_optimizer)


def _range_matrix(prefix: npt.NDArray[np.float64], valid: npt.NDArray[np.bool_]) -> Matrix:
    """[a, b] -> prefix[b] - prefix[a] where a < b, inf elsewhere."""
    result: Matrix = np.where(valid, prefix[None, :] - prefix[:, None], np.inf)
    return result


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
    if len(classes) == 1:  # one GPU type: ceil(M / n) micro-batches each, exactly
        ((device, count),) = classes.items()
        exact: Matrix = np.ceil(num_micro_batches / count - 1e-9) * times[device]
        return exact
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
    pass_of: dict[DeviceType, Matrix],
    rate: Matrix,
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
        share = 1.0 / pass_of[device] / rate  # this rank's share of the stage
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
