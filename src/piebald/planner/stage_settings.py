"""Every setting of one stage priced for every layer range at once: what the layer-split
DP's stage prices (``stage_costs``) choose among.

A setting is a (tensor-parallel degree, recompute, ZeRO mode) of a stage (its ranks, its
position in a pipeline of p stages, a micro-batch size). Over every layer range [a, b) it
has a busy time, using the continuous relaxation of the micro-batch allocation, M / sum_r
1 / t_r(a, b), which the exact allocation then rounds (``_makespan`` steps to the
integer min-makespan), its data-parallel sync, its slowest rank's pass, its optimizer
step, and each GPU type's memory (the same formulas as the exact check,
``stage_memory_bytes``, with each rank's micro-batches in flight estimated from its speed
share). All of it but Little's in-flight budget, which depends on the ranks to the
pipeline's end: ``stage_settings`` prices a stage once for stages alike but for that
count (the search caches it).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from piebald.cost.comm import RingProfile, ring_profile
from piebald.cost.compute import EfficiencyCurve, optimizer_step_time_s
from piebald.cost.memory import prefix_sums, stage_memory_bytes, stage_params_matrix
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.precision import wire_dtype_of_devices
from piebald.cost.rank_pass import input_broadcast_s, member_comm_s
from piebald.cost.replica_broadcast import (
    broadcasts_per_pass,
    broadcasts_per_step,
    layer_broadcasts_s,
)
from piebald.cost.tensor_comm import tensor_comm_s
from piebald.cost.zero_comm import overlapped_passes_s, stage_comm
from piebald.planner.layer_ranges import Matrix, Ranges, read_only_ranges, valid_ranges
from piebald.planner.range_memory import RankRoom
from piebald.planner.setting_pairs import SettingPairs
from piebald.planner.stage_builder import StageRules, tensor_group_of_each_type
from piebald.specs.cluster import ClusterSpec, Link
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import JobSpec, Optimizer
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.plan import ZeroMode, tensor_degree_fits
from piebald.specs.tensor_layout import TensorLayout

__all__ = ["Setting", "StageSettings", "memory_matrices", "stage_settings"]

_MAKESPAN_STEPS = 8
_PROBE_BYTES = (1e6, 1e9)  # collective time is affine in bytes: two probes give the line


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One (tensor-parallel degree, recompute, ZeRO mode) of a stage, priced for every
    layer range: all but Little's budget, which depends on the ranks to the pipeline's
    end."""

    busy: Ranges
    sync: Ranges
    slowest: Ranges
    optimizer: Ranges
    num_groups: int  # tensor groups: the stage's data-parallel ranks
    devices: tuple[DeviceType, ...]  # the GPU types of its groups, in rank order
    kinds: tuple[RankRoom, ...]  # its groups of each of those types
    shares: tuple[Ranges | float, ...]  # of the stage's micro-batches, one group's of each
    even_shards: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSettings:
    """Every setting of one stage, as the pairs (setting, layer range) where it holds one
    micro-batch in flight per rank (elsewhere it fits with no in-flight budget), stacked
    range by range and, in each range, in the order of the settings: what ``stage_cost``
    chooses among for any number of ranks to the pipeline's end."""

    num_ranks: int
    num_layers: int
    pairs: SettingPairs | None  # None: the strategy allows the stage no setting at all
    # Below any range's cost: the least of its settings' busy + sync (a shrunk budget only
    # stretches the busy time); inf where none holds one micro-batch in flight.
    lower_s: Matrix

    @classmethod
    def of(cls, settings: Sequence[Setting], *, num_ranks: int, num_layers: int) -> StageSettings:
        """``settings`` (each over every range of ``num_layers`` layers, all of the same
        GPU types) of a stage of ``num_ranks`` ranks."""
        pairs = SettingPairs.of(settings) if settings else None
        valid = valid_ranges(num_layers + 1)
        lower = np.full(int(valid.sum()), np.inf)
        if pairs is not None and len(pairs.range):
            lower[pairs.range[pairs.segments.starts]] = pairs.segments.least(pairs.cost)[
                pairs.segments.starts
            ]
        lower_s = np.full(valid.shape, np.inf)
        lower_s[valid] = lower
        lower_s.setflags(write=False)
        return cls(num_ranks=num_ranks, num_layers=num_layers, pairs=pairs, lower_s=lower_s)


def stage_settings(
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
) -> StageSettings:
    """The settings of a stage of ``ranks``, its position in a pipeline of ``num_stages``
    and its micro-batch size; it prices the same for any ``stage_index`` with as many
    neighbouring stages on each side."""
    settings: list[Setting] = []
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
            )
    return StageSettings.of(settings, num_ranks=len(ranks), num_layers=model.num_layers)


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
) -> list[Setting]:
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
    # Under ZeRO-2/3 each group's leader hands the weights the group holds whole on to its
    # members (``cost.replica_broadcast``): ZeRO-3 before every pass, ZeRO-2 once per step,
    # after the gather.
    weights_broadcast = {
        device: _broadcast_ranges(
            model,
            degree=degree,
            layout=layout,
            dtype=device.training_dtype(job.precision),
            link=cluster.link_between(*group[:2]),
        )
        for device, group in tensor_group.items()
    }
    # Each type's tensor group: its ring and the input its leader broadcasts, the same
    # under every recompute.
    group_ring = {device: ring_profile(cluster, group) for device, group in tensor_group.items()}
    group_input_s = {
        device: input_broadcast_s(
            cluster, group, model=model, job=job, micro_batch_size=micro_batch_size
        )
        for device, group in tensor_group.items()
    }
    settings: list[Setting] = []
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
        # A member's pass as ``cost.rank_pass`` prices it: its compute, and its group's
        # collectives and broadcasts (``member_comm_s``; the weights' only under per-pass
        # ZeRO, below).
        compute: dict[DeviceType, tuple[Ranges, Ranges]] = {}
        collectives: dict[DeviceType, tuple[Ranges | float, Ranges | float]] = {}
        for device, shape in shapes.items():
            compute[device] = _pass_ranges(model, shape=shape, curve=curve)
            collectives[device] = (0.0, 0.0)
            if degree > 1:
                collectives[device] = tensor_comm_s(
                    model,
                    holds_embedding=holds_embedding,
                    holds_head=holds_head,
                    num_blocks=blocks,
                    shape=shape,
                    ring=group_ring[device],
                )

        # ZeRO modes with the same per-pass traffic (none, and ZeRO-1, which sync once per
        # step) time their passes alike: the passes and what follows from them once each.
        passes: dict[tuple[float, float, float, float, bool, bool], _Passes] = {}
        for zero in _priced_zero_modes(rules.zero_modes, num_groups=len(leaders)):
            # Per-pass ZeRO puts the ranks in lockstep: equal counts, one stage only
            # (``specs.plan``), each pass as long as the slowest rank's.
            lockstep = zero.per_pass and len(leaders) > 1
            per_rank = num_micro_batches / len(leaders)
            if lockstep and (num_stages > 1 or not float(per_rank).is_integer()):
                continue
            (pre_a, pre_b), (during_a, during_b), (sync_a, sync_b) = _affine_comm(
                profile, len(leaders), zero
            )
            per_pass = broadcasts_per_pass(zero, degree)
            key = (pre_a, pre_b, during_a, during_b, lockstep, per_pass)
            if key not in passes:
                passes[key] = _passes(
                    *_member_passes(
                        compute,
                        collectives,
                        inputs_s=group_input_s,
                        weights_s=weights_broadcast if per_pass else None,
                        receives=(stage_index > 0, stage_index < num_stages - 1),
                    ),
                    classes,
                    # Per-pass traffic overlaps the pass, as in the exact stage and plan
                    # estimate.
                    before_forward_s=np.where(has_params, pre_a + pre_b * on_wire, 0.0),
                    during_backward_s=np.where(has_params, during_a + during_b * on_wire, 0.0),
                    num_micro_batches=num_micro_batches,
                )
                if lockstep:
                    passes[key] = _in_lockstep(passes[key], classes, per_rank=per_rank)
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
                    RankRoom(
                        count=count,
                        free_bytes=free,
                        per_in_flight_bytes=per_in_flight,
                        sharded_bytes=sharded,
                        micro_batches=timed.micro_batches[device],
                    )
                )
            owned = 1.0 / len(leaders) if zero.shards_optimizer else 1.0
            settings.append(
                Setting(
                    busy=timed.busy,
                    sync=np.where(has_params, sync_a + sync_b * on_wire, 0.0)
                    + (
                        np.maximum.reduce(list(weights_broadcast.values()))
                        if broadcasts_per_step(zero, degree)
                        else 0.0
                    ),
                    slowest=timed.slowest,
                    # The optimizer step stays out of the DP's cost: the step pays the
                    # slowest stage's once, a max of its own, which the pipeline proxy adds.
                    optimizer=params * owned * optimizer_per_param_s,
                    num_groups=len(leaders),
                    devices=tuple(classes),
                    kinds=tuple(kinds),
                    shares=tuple(timed.share[device] for device in classes),
                    even_shards=rules.even_shards or zero.replicated,
                )
            )
    return settings


def _member_passes(
    compute: dict[DeviceType, tuple[Ranges, Ranges]],
    collectives: dict[DeviceType, tuple[Ranges | float, Ranges | float]],
    *,
    inputs_s: dict[DeviceType, float],
    weights_s: dict[DeviceType, Ranges] | None,
    receives: tuple[bool, bool],
) -> tuple[dict[DeviceType, Ranges], dict[DeviceType, Ranges]]:
    """Each GPU type's member pass, forward and backward, over every range: its compute
    and what ``member_comm_s`` adds (its input broadcast where the stage ``receives`` an
    activation, a gradient; the weights' where ``weights_s``, per-pass ZeRO)."""
    forward, backward = {}, {}
    for device, (compute_forward, compute_backward) in compute.items():
        weights = 0.0 if weights_s is None else weights_s[device]
        forward[device] = compute_forward + member_comm_s(
            collectives_s=collectives[device][0],
            input_broadcast_s=inputs_s.get(device, 0.0) * receives[0],
            weights_broadcast_s=weights,
        )
        backward[device] = compute_backward + member_comm_s(
            collectives_s=collectives[device][1],
            input_broadcast_s=inputs_s.get(device, 0.0) * receives[1],
            weights_broadcast_s=weights,
        )
    return forward, backward


def _priced_zero_modes(
    zero_modes: tuple[ZeroMode, ...], *, num_groups: int
) -> tuple[ZeroMode, ...]:
    """The ZeRO modes worth pricing for a stage of ``num_groups`` data-parallel ranks: all
    of ``zero_modes`` but NONE where ZeRO-1 is among them and the group has two ranks or
    more. ZeRO-1 then takes every range NONE could: its passes are the same (neither
    moves anything during them), its sync is the same (a reduce-scatter and an all-gather
    over even shards price exactly as the all-reduce, ``cost.comm``), its memory is no
    more at any shard fraction (only the optimizer state differs, sharded), so it fits
    with at least NONE's in-flight budget and in no more round trips, and its optimizer
    step is shorter, which wins every tie (``_cheapest``). Pricing NONE as well only made
    pairs that never win. The exact build still tries NONE (``stage_builder``): there the
    shards are uneven, and ZeRO-1's collectives can be slower than an all-reduce."""
    if num_groups < 2 or ZeroMode.OPTIMIZER not in zero_modes:
        return zero_modes
    return tuple(zero for zero in zero_modes if zero is not ZeroMode.NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Passes:
    """A stage's passes under one recompute setting and one per-pass traffic, for every
    range, and what follows from them: the busiest rank's time, each GPU type's share."""

    busy: Ranges
    slowest: Ranges  # one micro-batch through the stage on its slowest rank
    micro_batches: dict[DeviceType, Ranges]  # each rank's, from its speed share
    share: dict[DeviceType, Ranges | float]  # of the stage's micro-batches, each rank's


def _passes(
    forward: dict[DeviceType, Ranges],
    backward: dict[DeviceType, Ranges],
    classes: Counter[DeviceType],
    *,
    before_forward_s: Ranges,
    during_backward_s: Ranges,
    num_micro_batches: float,
) -> _Passes:
    pass_of = {
        d: sum(
            overlapped_passes_s(
                forward_s=forward[d],
                backward_s=backward[d],
                before_forward_s=before_forward_s,
                during_backward_s=during_backward_s,
            )
        )
        for d in classes
    }
    rate = np.zeros(before_forward_s.shape)
    for device, count in classes.items():
        rate += count / pass_of[device]
    busy = _makespan(pass_of, classes, num_micro_batches, continuous=num_micro_batches / rate)
    micro_batches: dict[DeviceType, Ranges] = {}
    shares: dict[DeviceType, Ranges | float] = {}
    for device in classes:
        share = 1.0 / pass_of[device] / rate  # a rank's share (nan: invalid)
        micro_batches[device] = np.maximum(1.0, np.ceil(num_micro_batches * share))
        shares[device] = share
    return _Passes(
        busy=busy,
        slowest=np.maximum.reduce([pass_of[d] for d in classes]),
        micro_batches=micro_batches,
        share=shares,
    )


def _in_lockstep(timed: _Passes, classes: Counter[DeviceType], *, per_rank: float) -> _Passes:
    """``timed`` with every rank running ``per_rank`` micro-batches in lockstep: each pass
    lasts as long as the slowest rank's."""
    share = 1.0 / sum(classes.values())
    return _Passes(
        busy=per_rank * timed.slowest,
        slowest=timed.slowest,
        micro_batches={d: np.full(timed.slowest.shape, per_rank) for d in classes},
        share=dict.fromkeys(classes, share),
    )


@functools.lru_cache(maxsize=64)
def _params(model: ModelSpec, degree: int, layout: TensorLayout) -> Ranges:
    """Parameters a rank of a stage of each layer range stores (``stage_params_matrix``),
    at tensor-parallel ``degree`` in ``layout``."""
    return read_only_ranges(
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
    return read_only_ranges(embedding), read_only_ranges(head)


@functools.lru_cache(maxsize=64)
def _blocks(model: ModelSpec) -> Ranges:
    """Transformer blocks in each layer range (read-only)."""
    prefix = prefix_sums([float(layer.kind is LayerKind.BLOCK) for layer in model.layers])
    return read_only_ranges(prefix[None, :] - prefix[:, None])


@functools.lru_cache(maxsize=256)
def _broadcast_ranges(
    model: ModelSpec, *, degree: int, layout: TensorLayout, dtype: Dtype, link: Link
) -> Ranges:
    """The leader's broadcasts of the whole weights of every layer range
    (``cost.replica_broadcast.layer_broadcasts_s``, summed; read-only)."""
    prefix = prefix_sums(
        list(layer_broadcasts_s(model, degree=degree, layout=layout, dtype=dtype, link=link))
    )
    return read_only_ranges(prefix[None, :] - prefix[:, None])


@functools.lru_cache(maxsize=1024)
def _pass_ranges(
    model: ModelSpec, *, shape: PassShape, curve: EfficiencyCurve
) -> tuple[Ranges, Ranges]:
    """Forward and backward time of every layer range in passes of ``shape``,
    prefix[b] - prefix[a] (the same for every stage of these GPUs, so computed once)."""
    times = pass_times(model, shape=shape, curve=curve)
    forward, backward = (
        read_only_ranges(prefix[None, :] - prefix[:, None])
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
    micro-batches in flight (read-only)."""
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


# One entry per (GPU type, micro-batch size, recompute, degree, ZeRO mode, neighbours)
# a search prices, over 1,000 in a large cluster of six types: all of them kept.
@functools.lru_cache(maxsize=8192)
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
    bytes with no micro-batch in flight) in place of the latter. The same for every stage
    of these GPUs, so computed once (read-only)."""
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
    return read_only_ranges(free), read_only_ranges(per_in_flight), read_only_ranges(sharded)
