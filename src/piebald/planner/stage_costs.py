"""Price one stage for every layer range at once: the matrices the layer-split DP reads.

For a stage (its ranks, its position in a pipeline of p stages, a micro-batch size),
``cost[a, b]`` is the time the stage needs per step for layers [a, b): its busy time plus
its data-parallel sync, under the best (ZeRO mode, recompute) setting that fits every
rank's memory, ``inf`` where none fits. Busy time uses the continuous relaxation of the
micro-batch allocation, M / sum_r 1 / t_r(a, b), which the exact allocation then rounds;
memory uses the same formulas as the exact check (``stage_memory_bytes``), with each
rank's micro-batches in flight estimated from its speed share.

Where no setting fits with Little's in-flight budget, the range is priced as the exact
build (``stage_builder``) would make it: the fewest round trips rho whose budgets
w = ceil(n / rho) fit (``range_memory``: closed-form bounds, then bisection, all ranges
at once), its busy
time stretched by rho over Little's round trips in ``cost_s`` so the split steers away
from it, and rho in ``rounds`` for the pipeline proxy's round-trip bound.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from piebald.cost.comm import RingProfile, ring_profile
from piebald.cost.compute import EfficiencyCurve, optimizer_step_time_s
from piebald.cost.in_flight import (
    little_budget,
    mean_in_flight,
)
from piebald.cost.memory import prefix_sums, stage_memory_bytes, stage_params_matrix
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.precision import wire_dtype_of_devices
from piebald.cost.rank_pass import input_broadcast_s
from piebald.cost.tensor_comm import tensor_comm_s
from piebald.cost.zero_comm import stage_comm
from piebald.planner.range_memory import RangeMemory, RankKind
from piebald.planner.stage_builder import StageRules, tensor_group_of_each_type
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import JobSpec, Optimizer
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.plan import ZeroMode, tensor_degree_fits
from piebald.specs.tensor_layout import TensorLayout

__all__ = ["StageCost", "memory_matrices", "stage_cost"]

Matrix = npt.NDArray[np.float64]  # [a, b]: layers [a, b)
# One entry per layer range [a, b) with a < b, in row-major order of Matrix: the ranges
# that exist, about half of the matrix, which is all the pricing below works on.
Ranges = npt.NDArray[np.float64]
_MAKESPAN_STEPS = 8
_PROBE_BYTES = (1e6, 1e9)  # collective time is affine in bytes: two probes give the line
_TIE = 1e-9  # relative: costs this close are equal (rounding of equal collectives)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    cost_s: Matrix  # busy (x extra round trips) + sync per step for [a, b); inf: no fit
    busy_s: Matrix  # the busiest rank's compute over the step
    pass_s: Matrix  # one micro-batch through the stage on its slowest rank
    sync_s: Matrix  # the end-of-step data-parallel collectives (part of cost_s)
    optimizer_s: Matrix  # the stage's optimizer step (not part of cost_s)
    # Round trips per step a lowered in-flight budget forces; 0 where Little's fits.
    rounds: Matrix


@functools.lru_cache(maxsize=4096)
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


# inf and 0 entries (ranges that fit nowhere) divide freely; they are masked at the end.
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
    valid = _valid_ranges(model.num_layers + 1)
    settings: list[_Setting] = []
    for degree in rules.tensor_parallel_degrees:
        layout = rules.layout_at(degree)
        if tensor_degree_fits(
            cluster, model.arch, ranks, degree, layout=layout, seq_len=job.seq_len
        ):
            settings += _settings(
                cluster,
                model=model,
                job=job,
                ranks=ranks,
                degree=degree,
                micro_batch_size=micro_batch_size,
                stage_index=stage_index,
                num_stages=num_stages,
                rules=rules,
                curve=curve,
                # Little's law counts the stage's tensor groups (one pipeline lane each).
                ranks_to_end=ranks_to_end - len(ranks) + len(ranks) // degree,
            )
    # The cheapest setting for each range (``chosen``: its index, -1 for none); of equals,
    # the one with the shorter optimizer step (ZeRO-1 syncs as much as none, a reduce-scatter
    # and an all-gather for an all-reduce, and steps a shard), as the exact build chooses;
    # Little's in-flight budget wherever some setting fits with it ...
    num_ranges = int(valid.sum())
    best = np.full(num_ranges, np.inf)
    best_optimizer = np.full(num_ranges, np.inf)
    chosen = np.full(num_ranges, -1)
    for index, setting in enumerate(settings):
        cost = np.where(setting.fits_little, setting.busy + setting.sync, np.inf)
        tie = np.isfinite(best) & (np.abs(cost - best) <= _TIE * best)
        better = ((cost < best) & ~tie) | (tie & (setting.optimizer < best_optimizer))
        best = np.where(better, cost, best)
        best_optimizer = np.where(better, setting.optimizer, best_optimizer)
        chosen = np.where(better, index, chosen)
    best_rounds = np.zeros(num_ranges)
    # ... and a shrunk budget (more round trips) only where none does.
    none_fit = np.isinf(best)
    if np.any(none_fit):
        for index, setting in enumerate(settings):
            at, stretch, rounds = setting.memory.shrunk_at(
                none_fit, busy=setting.busy, sync=setting.sync, beat=best
            )
            cost = setting.busy[at] * stretch + setting.sync[at]
            better = cost < best[at]
            won = at[better]
            best[won] = cost[better]
            chosen[won] = index
            best_rounds[won] = rounds[better]
    busy_s, pass_s = np.full(num_ranges, np.inf), np.full(num_ranges, np.inf)
    sync_s, optimizer_s = np.zeros(num_ranges), np.zeros(num_ranges)
    for index, setting in enumerate(settings):
        won = chosen == index
        if np.any(won):
            np.copyto(busy_s, setting.busy, where=won)
            np.copyto(pass_s, setting.slowest, where=won)
            np.copyto(sync_s, setting.sync, where=won)
            np.copyto(optimizer_s, setting.optimizer, where=won)

    def matrix(ranges: Ranges, otherwise: float) -> Matrix:
        """``ranges`` in place in a matrix, ``otherwise`` where b <= a."""
        result = np.full(valid.shape, otherwise)
        result[valid] = ranges
        return result

    return StageCost(
        cost_s=matrix(best, np.inf),
        busy_s=matrix(busy_s, np.inf),
        pass_s=matrix(pass_s, np.inf),
        sync_s=matrix(sync_s, 0.0),
        optimizer_s=matrix(optimizer_s, 0.0),
        rounds=matrix(best_rounds, 0.0),
    )


def _settings(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    ranks: tuple[int, ...],
    degree: int,
    micro_batch_size: int,
    stage_index: int,
    num_stages: int,
    rules: StageRules,
    curve: EfficiencyCurve,
    ranks_to_end: int,
) -> list[_Setting]:
    """Every (recompute, ZeRO mode) of the stage at tensor-parallel ``degree``, priced
    for every layer range: its tensor groups are the stage's data-parallel ranks, each
    computing its slice of the layers in the rules' layout (``ModelSpec.layers_at``),
    meeting its group in every block and at the stage's edges (``cost.tensor_comm``) and
    taking the input its leader receives: a member's pass as ``cost.rank_pass`` prices
    it, with the same functions."""
    layout = rules.layout_at(degree)
    leaders = ranks[::degree]  # one per tensor group; the stage's data parallelism is theirs
    classes = Counter(cluster.device_of(rank) for rank in leaders)
    num_micro_batches = job.global_batch_size / micro_batch_size
    neighbors = (stage_index > 0) + (stage_index < num_stages - 1)
    # Weights and gradients travel in the group's common compute dtype (cost.precision).
    wire_dtype = wire_dtype_of_devices(classes, precision=job.precision)
    wire = float(wire_dtype.num_bytes)
    params = _params(model, degree, layout)
    on_wire = params * wire
    has_params = params > 0
    # One data-parallel group; the stage's t of them run at once, sharing the NICs.
    profile = ring_profile(cluster, leaders, rings_per_nic=degree)
    # A tensor group per GPU type (its node's link), and the blocks in each range.
    tensor_group = tensor_group_of_each_type(cluster, ranks, degree) if degree > 1 else {}
    blocks, holds_embedding, holds_head = _blocks(model), *_ends(model)
    # The optimizer step is memory-bound and linear in the parameters a rank owns.
    optimizer_per_param_s = max(
        optimizer_step_time_s(num_params=1.0, device=d, optimizer=job.optimizer, curve=curve)
        for d in classes
    )
    settings: list[_Setting] = []
    for recompute in rules.recompute:
        shapes = {
            device: PassShape.for_job(
                job,
                device=device,
                micro_batch_size=micro_batch_size,
                recompute=recompute,
                tensor_parallel_degree=degree,
                tensor_layout=layout,
            )
            for device in classes
        }
        forward: dict[DeviceType, Ranges] = {}
        backward: dict[DeviceType, Ranges] = {}
        for device, shape in shapes.items():
            forward[device], backward[device] = _pass_ranges(model, shape=shape, curve=curve)
            if degree > 1:  # as ``cost.rank_pass`` prices a member's pass
                group = tensor_group[device]
                comm_forward_s, comm_backward_s = tensor_comm_s(
                    model,
                    holds_embedding=holds_embedding,
                    holds_head=holds_head,
                    num_blocks=blocks,
                    shape=shape,
                    ring=ring_profile(cluster, group),
                )
                broadcast_s = input_broadcast_s(
                    cluster, group, model=model, job=job, micro_batch_size=micro_batch_size
                )
                forward[device] = forward[device] + comm_forward_s + broadcast_s * (stage_index > 0)
                backward[device] = (
                    backward[device]
                    + comm_backward_s
                    + broadcast_s * (stage_index < num_stages - 1)
                )
        # ZeRO modes with the same per-pass traffic (none, and ZeRO-1, which sync once per
        # step) time their passes alike: the passes and what follows from them once each.
        passes: dict[tuple[float, float, float, float, bool], _Passes] = {}
        for zero in rules.zero_modes:
            # Per-pass ZeRO puts the ranks in lockstep: equal counts, one stage only
            # (``specs.plan``), each pass as long as the slowest rank's.
            lockstep = zero.per_pass and len(leaders) > 1
            per_rank = num_micro_batches / len(leaders)
            if lockstep and (num_stages > 1 or not float(per_rank).is_integer()):
                continue
            (pre_a, pre_b), (during_a, during_b), (sync_a, sync_b) = _affine_comm(
                profile, len(leaders), zero
            )
            key = (pre_a, pre_b, during_a, during_b, lockstep)
            if key not in passes:
                passes[key] = _passes(
                    forward,
                    backward,
                    classes,
                    # Per-pass traffic overlaps the pass, as in the exact stage and plan
                    # estimate.
                    before_forward_s=np.where(has_params, pre_a + pre_b * on_wire, 0.0),
                    during_backward_s=np.where(has_params, during_a + during_b * on_wire, 0.0),
                    num_micro_batches=num_micro_batches,
                    ranks_to_end=ranks_to_end,
                )
                if lockstep:
                    passes[key] = _in_lockstep(
                        passes[key], classes, per_rank=per_rank, ranks_to_end=ranks_to_end
                    )
            timed = passes[key]
            kinds = []
            for device, count in classes.items():
                free, per_in_flight, sharded = _memory_ranges(
                    model,
                    shape=shapes[device],
                    optimizer=job.optimizer,
                    zero=zero,
                    neighbors=neighbors,
                    wire=wire_dtype,
                    curve=curve,
                )
                kinds.append(
                    RankKind(
                        count=count,
                        free_bytes=free,
                        per_in_flight_bytes=per_in_flight,
                        sharded_bytes=sharded,
                        micro_batches=timed.micro_batches[device],
                        little=timed.little[device],
                    )
                )
            memory = RangeMemory(
                kinds=kinds,
                even_shards=rules.even_shards or zero.replicated,
                num_ranks=len(leaders),
            )
            owned = 1.0 / len(leaders) if zero.shards_optimizer else 1.0
            settings.append(
                _Setting(
                    busy=timed.busy,
                    sync=np.where(has_params, sync_a + sync_b * on_wire, 0.0),
                    slowest=timed.slowest,
                    # The optimizer step stays out of the DP's cost: the step pays the
                    # slowest stage's once, a max of its own, which the pipeline proxy adds.
                    optimizer=params * owned * optimizer_per_param_s,
                    memory=memory,
                    fits_little=memory.fits(None),
                )
            )
    return settings


@dataclass(frozen=True, slots=True, kw_only=True)
class _Passes:
    """A stage's passes under one recompute setting and one per-pass traffic, for every
    range, and what follows from them: the busiest rank's time, each GPU type's share."""

    busy: Ranges
    slowest: Ranges  # one micro-batch through the stage on its slowest rank
    micro_batches: dict[DeviceType, Ranges]  # each rank's, from its speed share
    little: dict[DeviceType, Ranges]  # each rank's Little's in-flight budget


def _passes(
    forward: dict[DeviceType, Ranges],
    backward: dict[DeviceType, Ranges],
    classes: Counter[DeviceType],
    *,
    before_forward_s: Ranges,
    during_backward_s: Ranges,
    num_micro_batches: float,
    ranks_to_end: int,
) -> _Passes:
    pass_of = {
        d: np.maximum(forward[d], before_forward_s) + np.maximum(backward[d], during_backward_s)
        for d in classes
    }
    rate = np.zeros(before_forward_s.shape)
    for device, count in classes.items():
        rate += count / pass_of[device]
    busy = _makespan(pass_of, classes, num_micro_batches, continuous=num_micro_batches / rate)
    micro_batches, little = {}, {}
    for device in classes:
        share = 1.0 / pass_of[device] / rate  # a rank's share (nan: invalid)
        micro_batches[device] = np.maximum(1.0, np.ceil(num_micro_batches * share))
        # Little's budget without its slack (what the exact build falls back to last).
        little[device] = little_budget(
            mean_in_flight(
                ranks_to_end=ranks_to_end, rank_micro_batches=share, stage_micro_batches=1.0
            ),
            slack=0,
            most=micro_batches[device],
        )
    return _Passes(
        busy=busy,
        slowest=np.maximum.reduce([pass_of[d] for d in classes]),
        micro_batches=micro_batches,
        little=little,
    )


def _in_lockstep(
    timed: _Passes, classes: Counter[DeviceType], *, per_rank: float, ranks_to_end: int
) -> _Passes:
    """``timed`` with every rank running ``per_rank`` micro-batches in lockstep: each pass
    lasts as long as the slowest rank's."""
    share = 1.0 / sum(classes.values())
    mean = mean_in_flight(
        ranks_to_end=ranks_to_end, rank_micro_batches=share, stage_micro_batches=1.0
    )
    little = float(little_budget(mean, slack=0, most=per_rank))
    return _Passes(
        busy=per_rank * timed.slowest,
        slowest=timed.slowest,
        micro_batches={d: np.full(timed.slowest.shape, per_rank) for d in classes},
        little={d: np.full(timed.slowest.shape, little) for d in classes},
    )


@functools.cache
def _valid_ranges(size: int) -> npt.NDArray[np.bool_]:
    """[a, b] -> a < b: where the ranges lie in a matrix (read-only)."""
    valid = np.arange(size)[:, None] < np.arange(size)[None, :]
    valid.setflags(write=False)
    return valid


def _read_only_ranges(matrix: Matrix) -> Ranges:
    """The entries of ``matrix`` over the ranges that exist."""
    ranges: Ranges = matrix[_valid_ranges(len(matrix))]
    ranges.setflags(write=False)
    return ranges


@functools.lru_cache(maxsize=64)
def _params(model: ModelSpec, degree: int, layout: TensorLayout) -> Ranges:
    """Parameters a rank of a stage of each layer range stores (``stage_params_matrix``),
    at tensor-parallel ``degree`` in ``layout``."""
    return _read_only_ranges(
        stage_params_matrix(model, tensor_parallel_degree=degree, layout=layout)
    )


@functools.lru_cache(maxsize=64)
def _ends(model: ModelSpec) -> tuple[Ranges, Ranges]:
    """Whether each layer range holds the embedding, and the head: 1.0 or 0.0
    (read-only)."""
    size = model.num_layers + 1
    embedding, head = np.zeros((size, size)), np.zeros((size, size))
    embedding[0, :] = 1.0  # [0, b)
    head[:, model.num_layers] = 1.0  # [a, L)
    return _read_only_ranges(embedding), _read_only_ranges(head)


@functools.lru_cache(maxsize=64)
def _blocks(model: ModelSpec) -> Ranges:
    """Transformer blocks in each layer range (read-only)."""
    prefix = prefix_sums([float(layer.kind is LayerKind.BLOCK) for layer in model.layers])
    return _read_only_ranges(prefix[None, :] - prefix[:, None])


@functools.lru_cache(maxsize=1024)
def _pass_ranges(
    model: ModelSpec, *, shape: PassShape, curve: EfficiencyCurve
) -> tuple[Ranges, Ranges]:
    """Forward and backward time of every layer range in passes of ``shape``,
    prefix[b] - prefix[a] (the same for every stage of these GPUs, so computed once)."""
    times = pass_times(model, shape=shape, curve=curve)
    forward, backward = (
        _read_only_ranges(prefix[None, :] - prefix[:, None])
        for prefix in (times.forward_prefix_s, times.backward_prefix_s)
    )
    return forward, backward


def _makespan(
    times: dict[DeviceType, Ranges],
    classes: Counter[DeviceType],
    num_micro_batches: float,
    *,
    continuous: Ranges,
) -> Ranges:
    """The integer min-makespan of the micro-batches over the stage's ranks, for every range.

    It is the smallest T with sum_k n_k floor(T / t_k) >= M, and such a T is a multiple of
    some t_k; starting from the continuous bound M / sum_k (n_k / t_k), step to the next
    such breakpoint until enough micro-batches fit (a few steps; capped, which can only
    leave the estimate at the continuous bound's side, never above the exact value)."""
    if len(classes) == 1:  # one GPU type: ceil(M / n) micro-batches each, exactly
        ((device, count),) = classes.items()
        exact: Ranges = np.ceil(num_micro_batches / count - 1e-9) * times[device]
        return exact
    # Each range steps on its own: after the first step, only those still short.
    result: Ranges = continuous.copy()
    makespan, at = continuous, None
    for _ in range(_MAKESPAN_STEPS):
        part = {d: t if at is None else t[at] for d, t in times.items()}
        done = {d: np.floor(makespan / part[d] + 1e-9) for d in classes}  # by each rank
        fitted = sum(n * done[d] for d, n in classes.items())
        short = fitted < num_micro_batches - 1e-9
        if not np.any(short):
            break
        following = np.minimum.reduce([(done[d] + 1.0) * part[d] for d in classes])
        at = np.flatnonzero(short) if at is None else at[short]
        makespan = following[short]
        result[at] = makespan
    return result


@functools.lru_cache(maxsize=1024)
def memory_matrices(
    model: ModelSpec,
    *,
    shape: PassShape,
    optimizer: Optimizer,
    zero: ZeroMode,
    neighbors: int,
    wire: Dtype,
    curve: EfficiencyCurve,
) -> tuple[Matrix, Matrix, Matrix]:
    """(bytes with no micro-batch in flight, bytes per micro-batch in flight, bytes per unit
    of shard fraction) of a rank for every layer range: ``stage_memory_bytes`` (activations
    measured where ``curve`` has them, as in the exact check), which is affine in the
    micro-batches in flight. The same for every stage of these GPUs, so computed once
    (read-only)."""
    empty, one = (
        stage_memory_bytes(
            model,
            shape=shape,
            layers=None,
            optimizer=optimizer,
            zero=zero,
            num_in_flight=in_flight,
            num_neighbor_stages=neighbors,
            wire_dtype=wire,
            curve=curve,
        )
        for in_flight in (0, 1)
    )
    fixed, sharded = (np.asarray(x, dtype=np.float64) for x in empty)
    per_in_flight = np.asarray(one[0], dtype=np.float64) - fixed
    for matrix in (fixed, per_in_flight, sharded):
        matrix.setflags(write=False)
    return fixed, per_in_flight, sharded


@functools.lru_cache(maxsize=1024)
def _memory_ranges(
    model: ModelSpec,
    *,
    shape: PassShape,
    optimizer: Optimizer,
    zero: ZeroMode,
    neighbors: int,
    wire: Dtype,
    curve: EfficiencyCurve,
) -> tuple[Ranges, Ranges, Ranges]:
    """``memory_matrices`` over the ranges, with the memory left (the device's less the
    bytes with no micro-batch in flight) in place of the latter (read-only)."""
    fixed, per_in_flight, sharded = memory_matrices(
        model,
        shape=shape,
        optimizer=optimizer,
        zero=zero,
        neighbors=neighbors,
        wire=wire,
        curve=curve,
    )
    free = shape.device.memory_bytes - fixed
    return _read_only_ranges(free), _read_only_ranges(per_in_flight), _read_only_ranges(sharded)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Setting:
    """One (recompute, ZeRO mode) of a stage, priced for every layer range."""

    busy: Ranges
    sync: Ranges
    slowest: Ranges
    optimizer: Ranges
    memory: RangeMemory
    fits_little: npt.NDArray[np.bool_]
