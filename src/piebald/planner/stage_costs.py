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
w = ceil(n / rho) fit (closed-form bounds, then bisection, all ranges at once), its busy
time stretched by rho over Little's round trips in ``cost_s`` so the split steers away
from it, and rho in ``rounds`` for the pipeline proxy's round-trip bound.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
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
    cost_s: Matrix  # busy (x extra round trips) + sync per step for [a, b); inf: no fit
    busy_s: Matrix  # the busiest rank's compute over the step
    pass_s: Matrix  # one micro-batch through the stage on its slowest rank
    sync_s: Matrix  # the end-of-step data-parallel collectives (part of cost_s)
    optimizer_s: Matrix  # the stage's optimizer step (not part of cost_s)
    # Round trips per step a lowered in-flight budget forces; 0 where Little's fits.
    rounds: Matrix


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
    wire = float(job.precision.num_bytes)  # weights and gradients travel in this width
    params = stage_params_matrix(model)
    profile = ring_profile(cluster, ranks)
    comm_of = {zero: _affine_comm(profile, len(ranks), zero) for zero in rules.zero_modes}
    # The optimizer step is memory-bound and linear in the parameters a rank owns.
    optimizer_per_param_s = max(
        optimizer_step_time_s(num_params=1.0, device=d, optimizer=job.optimizer, curve=curve)
        for d in classes
    )
    settings: list[_Setting] = []
    for recompute in rules.recompute:
        forward: dict[DeviceType, Matrix] = {}
        backward: dict[DeviceType, Matrix] = {}
        for device in classes:
            forward[device], backward[device] = _pass_matrices(
                model,
                device=device,
                dtype=device.training_dtype(job.precision),
                micro_batch_size=micro_batch_size,
                seq_len=job.seq_len,
                recompute=recompute,
                curve=curve,
            )
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
            kinds = []
            for device, count in classes.items():
                share = 1.0 / pass_of[device] / rate  # a rank's share (nan: invalid)
                micro_batches = np.maximum(1.0, np.ceil(num_micro_batches * share))
                fixed, per_in_flight, sharded = _memory_matrices(
                    model,
                    job=job,
                    device=device,
                    zero=zero,
                    recompute=recompute,
                    micro_batch_size=micro_batch_size,
                    neighbors=neighbors,
                    curve=curve,
                )
                kinds.append(
                    _Kind(
                        count=count,
                        free_bytes=device.memory_bytes - fixed,
                        per_in_flight_bytes=per_in_flight,
                        sharded_bytes=sharded,
                        micro_batches=micro_batches,
                        little=np.maximum(
                            1.0, np.minimum(micro_batches, np.ceil(ranks_to_end * share))
                        ),
                    )
                )
            memory = _Memory(
                kinds=kinds,
                even_shards=rules.even_shards or zero is ZeroMode.NONE,
                num_ranks=len(ranks),
            )
            owned = 1.0 if zero is ZeroMode.NONE else 1.0 / len(ranks)
            settings.append(
                _Setting(
                    busy=busy,
                    sync=np.where(params > 0, sync_a + sync_b * on_wire, 0.0),
                    slowest=np.maximum.reduce([pass_of[d] for d in classes]),
                    # The optimizer step stays out of the DP's cost: the step pays the
                    # slowest stage's once, a max of its own, which the pipeline proxy adds.
                    optimizer=params * owned * optimizer_per_param_s,
                    memory=memory,
                    fits_little=valid & memory.fits(None),
                )
            )
    best = np.full((size, size), np.inf)
    best_busy = np.full((size, size), np.inf)
    best_pass = np.full((size, size), np.inf)
    best_sync = np.zeros((size, size))
    best_optimizer = np.zeros((size, size))
    best_rounds = np.zeros((size, size))

    def keep(setting: _Setting, cost: Matrix, rounds: Matrix | float) -> None:
        nonlocal best, best_busy, best_pass, best_sync, best_optimizer, best_rounds
        better = cost < best
        best = np.where(better, cost, best)
        best_busy = np.where(better, setting.busy, best_busy)
        best_pass = np.where(better, setting.slowest, best_pass)
        best_sync = np.where(better, setting.sync, best_sync)
        best_optimizer = np.where(better, setting.optimizer, best_optimizer)
        best_rounds = np.where(better, rounds, best_rounds)

    # Little's in-flight budget wherever some setting fits with it ...
    for setting in settings:
        keep(setting, np.where(setting.fits_little, setting.busy + setting.sync, np.inf), 0.0)
    # ... and a shrunk budget (more round trips) only where none does.
    none_fit = valid & np.isinf(best)
    if np.any(none_fit):
        for setting in settings:
            stretch, rounds = setting.memory.shrunk(
                none_fit, busy=setting.busy, sync=setting.sync, beat=best
            )
            keep(setting, setting.busy * stretch + setting.sync, rounds)
    return StageCost(
        cost_s=best,
        busy_s=best_busy,
        pass_s=best_pass,
        sync_s=best_sync,
        optimizer_s=best_optimizer,
        rounds=best_rounds,
    )


def _range_matrix(prefix: npt.NDArray[np.float64]) -> Matrix:
    """[a, b] -> prefix[b] - prefix[a] where a < b, inf elsewhere (read-only)."""
    size = len(prefix)
    valid = np.arange(size)[:, None] < np.arange(size)[None, :]
    result: Matrix = np.where(valid, prefix[None, :] - prefix[:, None], np.inf)
    result.setflags(write=False)
    return result


@functools.lru_cache(maxsize=1024)
def _pass_matrices(
    model: ModelSpec,
    *,
    device: DeviceType,
    dtype: Dtype,
    micro_batch_size: int,
    seq_len: int,
    recompute: bool,
    curve: EfficiencyCurve,
) -> tuple[Matrix, Matrix]:
    """Forward and backward time of every layer range on ``device`` (the same for every
    stage of these GPUs, so computed once)."""
    times = pass_times(
        model,
        device=device,
        dtype=dtype,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        recompute=recompute,
        curve=curve,
    )
    return _range_matrix(times.forward_prefix_s), _range_matrix(times.backward_prefix_s)


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


@functools.lru_cache(maxsize=1024)
def _memory_matrices(
    model: ModelSpec,
    *,
    job: JobSpec,
    device: DeviceType,
    zero: ZeroMode,
    recompute: bool,
    micro_batch_size: int,
    neighbors: int,
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
            curve=curve,
        )
        for in_flight in (0, 1)
    )
    fixed, sharded = (np.asarray(x, dtype=np.float64) for x in empty)
    per_in_flight = np.asarray(one[0], dtype=np.float64) - fixed
    for matrix in (fixed, per_in_flight, sharded):
        matrix.setflags(write=False)
    return fixed, per_in_flight, sharded


@dataclass(frozen=True, slots=True, kw_only=True)
class _Kind:
    """The ranks of one GPU type in a stage, over every layer range (or a subset of them)."""

    count: int
    free_bytes: Matrix  # memory less everything but activations
    per_in_flight_bytes: Matrix
    sharded_bytes: Matrix  # per unit of shard fraction
    micro_batches: Matrix  # each rank's, from its speed share
    little: Matrix  # Little's in-flight budget

    def at(self, where: npt.NDArray[np.bool_]) -> _Kind:
        return _Kind(
            count=self.count,
            free_bytes=self.free_bytes[where],
            per_in_flight_bytes=self.per_in_flight_bytes[where],
            sharded_bytes=self.sharded_bytes[where],
            micro_batches=self.micro_batches[where],
            little=self.little[where],
        )

    def budget(self, rounds: Matrix | None) -> Matrix:
        """In flight under Little's budget (None) or the fewest for ``rounds`` round trips
        (``cost.memory.in_flight_for_rounds``)."""
        if rounds is None:
            return self.little
        return np.maximum(1.0, np.minimum(self.little, np.ceil(self.micro_batches / rounds)))

    def most_in_flight(self, reserved_bytes: Matrix | float) -> Matrix:
        """The most micro-batches in flight that leave ``reserved_bytes`` free."""
        room = (self.free_bytes - reserved_bytes) / self.per_in_flight_bytes
        return np.where(self.per_in_flight_bytes > 0, np.floor(room), np.inf)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Memory:
    """Whether a stage's ranks fit: with even shards each on its own, otherwise each on its
    own and the free memory of all ranks together holds the sharded state (water-filling
    succeeds)."""

    kinds: list[_Kind]
    even_shards: bool
    num_ranks: int

    def at(self, where: npt.NDArray[np.bool_]) -> _Memory:
        return _Memory(
            kinds=[k.at(where) for k in self.kinds],
            even_shards=self.even_shards,
            num_ranks=self.num_ranks,
        )

    def fits(self, rounds: Matrix | None) -> npt.NDArray[np.bool_]:
        """Where every rank fits holding Little's budget (None) or that of ``rounds``."""
        return self._fits(lambda kind: kind.budget(rounds))

    def fits_one(self) -> npt.NDArray[np.bool_]:
        """Where every rank fits holding one micro-batch in flight (the most round trips)."""
        return self._fits(lambda kind: 1.0)

    def _fits(self, budget: Callable[[_Kind], Matrix | float]) -> npt.NDArray[np.bool_]:
        all_fit = np.ones(self.kinds[0].free_bytes.shape, dtype=bool)
        shard_capacity = np.zeros(all_fit.shape)  # sum of free / sharded bytes
        for kind in self.kinds:
            free = kind.free_bytes - budget(kind) * kind.per_in_flight_bytes
            if self.even_shards:
                all_fit &= free >= kind.sharded_bytes / self.num_ranks
            else:
                all_fit &= free >= 0
                shard_capacity += kind.count * np.where(
                    kind.sharded_bytes > 0, free / kind.sharded_bytes, np.inf
                )
        if not self.even_shards:
            all_fit &= shard_capacity >= 1.0
        return all_fit

    def little_rounds(self) -> Matrix:
        """Round trips Little's budget needs: 1F1B finishes w micro-batches per trip."""
        rounds: Matrix = np.maximum.reduce(
            [np.ceil(k.micro_batches / k.little) for k in self.kinds]
        )
        return rounds

    def round_bounds(self) -> tuple[Matrix, Matrix]:
        """(rho_low, rho_high): no fewer round trips fit than rho_low, and rho_high fit
        where anything does. Each rank on its own needs w <= W (the most in flight its
        memory holds), exactly rho >= ceil(n / W); with uneven shards the ranks together
        also need sum_k t_k w_k <= S (t_k: a micro-batch's share of the sharded capacity,
        S: the capacity left over one whole state), and n / rho <= w <= n / rho + 1."""
        little = self.little_rounds()
        low = little
        for kind in self.kinds:
            reserved = kind.sharded_bytes / self.num_ranks if self.even_shards else 0.0
            most = kind.most_in_flight(reserved)
            alone = np.where(kind.little > most, np.ceil(kind.micro_batches / most), 0.0)
            low = np.maximum(low, np.where(most >= 1, alone, np.inf))
        if self.even_shards:
            return low, low
        spare = -np.ones(low.shape)  # S
        per_rounds = np.zeros(low.shape)  # sum_k t_k n_k
        per_extra = np.zeros(low.shape)  # sum_k t_k
        for kind in self.kinds:
            sharded = np.where(kind.sharded_bytes > 0, kind.sharded_bytes, np.inf)
            weight = kind.count * kind.per_in_flight_bytes / sharded
            spare += kind.count * kind.free_bytes / sharded
            per_rounds += weight * kind.micro_batches
            per_extra += weight
        high = np.maximum(
            low,
            np.where(spare > per_extra, np.ceil(per_rounds / (spare - per_extra)), np.inf),
        )
        low = np.maximum(low, np.where(spare > 0, np.ceil(per_rounds / spare), np.inf))
        return low, np.maximum(low, high)

    def shrunk(
        self, where: npt.NDArray[np.bool_], *, busy: Matrix, sync: Matrix, beat: Matrix
    ) -> tuple[Matrix, Matrix]:
        """(rho over Little's round trips, rho) for the ranges ``where`` Little's budget
        does not fit, at the fewest round trips rho that fit; (inf, 0) where none fit or
        where even the lower bound's stretch cannot ``beat`` the given cost."""
        stretch = np.full(busy.shape, np.inf)
        rounds = np.zeros(busy.shape)
        # A stretch is at least 1, and one micro-batch in flight per rank must fit.
        where = where & (busy + sync < beat)
        if np.any(where):
            where &= self.fits_one()
        if not np.any(where):
            return stretch, rounds
        # From here on only those ranges, as flat arrays.
        part = self.at(where)
        most = np.maximum.reduce([k.micro_batches for k in part.kinds])
        little = part.little_rounds()
        low, high = part.round_bounds()
        # Where even the fewest round trips that might fit cannot win, look no closer.
        hopeless = busy[where] * low / little + sync[where] >= beat[where]
        high = np.minimum(high, most)
        fits_low = part.fits(low)
        high = np.where(hopeless | fits_low, low, np.where(part.fits(high), high, most))
        low = np.where(fits_low, low, low + 1)
        # Bisection: memory only falls as the round trips grow; high always fits.
        while np.any(low < high):
            middle = np.floor((low + high) / 2)
            fits = part.fits(middle)
            open_ = low < high
            high = np.where(open_ & fits, middle, high)
            low = np.where(open_ & ~fits, middle + 1, low)
        stretch[where] = np.where(hopeless, np.inf, high / little)
        rounds[where] = np.where(hopeless, 0.0, high)
        return stretch, rounds


@dataclass(frozen=True, slots=True, kw_only=True)
class _Setting:
    """One (recompute, ZeRO mode) of a stage, priced for every layer range."""

    busy: Matrix
    sync: Matrix
    slowest: Matrix
    optimizer: Matrix
    memory: _Memory
    fits_little: npt.NDArray[np.bool_]
