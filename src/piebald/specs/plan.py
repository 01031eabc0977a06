"""The Plan: the one contract between planner, simulator, runtime and reports.

A plan is self-contained: it embeds the cluster, model and job it was made for. It holds
ordered stages; each stage has a contiguous layer range ``[start, end)`` and the ranks of
its data-parallel group, and per rank a micro-batch size, a number of micro-batches and a
shard fraction of the stage's training state. ``routes[j]`` is the rank that micro-batch j
visits in each stage. Micro-batch j holds the ``micro_batch_size`` sequences (of the rank
it visits first) that follow micro-batch j-1 in the global batch.

A stage of tensor-parallel degree t > 1 (Megatron-LM, Shoeybi et al. 2019) lists its ranks
as consecutive runs of t, each run a *tensor group* inside one node that splits every
block's weights t ways and runs the same micro-batches together. The group's first rank,
its *leader*, stands for it in ``routes``; every member carries the group's micro-batch
size and count, and a 1/t share of the group's fraction of the training state (so the
fractions of a stage still sum to 1). The stage's data-parallel groups run over tensor
groups: the members at one position of every group. What a group splits besides its
blocks' heads and MLP width is the stage's ``tensor_layout`` (``specs.tensor_layout``:
piebald's planner makes ``sequence``, its runtime runs that and ``blocks``; the
vocabulary layouts price runs of other systems as they ran).

Construction validates everything against the embedded cluster and model; errors name the
field (``stages[1].shard_fraction``) so a hand-edited plan file is easy to fix.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from piebald.errors import SpecError
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec, check_job_fits_model
from piebald.specs.model import ModelArch, ModelSpec
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

__all__ = [
    "PLAN_VERSION",
    "TENSOR_PARALLEL_DEGREES",
    "CalibratedCurve",
    "CostInputs",
    "MeasuredActivation",
    "MeasuredLayerTime",
    "MeasuredLink",
    "Plan",
    "Prediction",
    "Recompute",
    "RunnerUp",
    "Schedule",
    "Stage",
    "ZeroMode",
    "round_robin_routes",
    "tensor_degree_fits",
    "tensor_groups_inside_nodes",
    "tensor_split_problem",
    "weighted_round_robin",
]

PLAN_VERSION = 1
FRACTION_TOLERANCE = 1e-6
TENSOR_PARALLEL_DEGREES = (1, 2, 4, 8)


class Schedule(StrEnum):
    GPIPE = "gpipe"  # all forwards, then all backwards
    ONE_F_ONE_B = "1f1b"  # warmup forwards, steady one-forward-one-backward, cooldown


class ZeroMode(StrEnum):
    """How a stage's data-parallel group holds its training state (ZeRO, Rajbhandari 2020).

    What each mode means is decided here only, by which of the three states it shards
    (:attr:`shards_optimizer`, :attr:`shards_gradients`, :attr:`shards_weights`); every
    other property follows from those, and the cost model, the simulator, the planner and
    the runtime read the properties, never the mode's name.

    Under NONE and OPTIMIZER gradients are accumulated over a step's micro-batches before
    they are reduced, once (Zorse's pipeline-efficient ZeRO). GRADIENTS and FULL keep only
    their shard of the gradients, so they reduce-scatter every layer's gradients as its
    backward pass ends; FULL keeps only its shard of the parameters, so it gathers every
    layer's parameters before each pass (the next layer's while one computes) and releases
    them after, never holding the stage's whole weights (runtime ``LayerStream``). The
    ranks of such a stage meet inside every pass: they run equal numbers of micro-batches
    (of their own sizes) in one pass pattern.

    Each property is computed once per mode, then stored on it (the planner reads them in
    its inner loops).
    """

    NONE = "none"  # replicated; all-reduce gradients once per step
    OPTIMIZER = "optimizer"  # ZeRO-1: optimizer state sharded; reduce-scatter + all-gather
    GRADIENTS = "gradients"  # ZeRO-2: + gradients sharded; reduce-scatter per layer and pass
    FULL = "full"  # ZeRO-3: + parameters sharded, gathered per layer for each pass

    @functools.cached_property
    def shards_optimizer(self) -> bool:
        """Whether each rank keeps only its shard of the optimizer state (fp32 master
        weights and moments), and steps only that shard."""
        return self is not ZeroMode.NONE

    @functools.cached_property
    def shards_gradients(self) -> bool:
        """Whether each rank keeps only its shard of the gradient accumulator."""
        return self in (ZeroMode.GRADIENTS, ZeroMode.FULL)

    @functools.cached_property
    def shards_weights(self) -> bool:
        """Whether each rank keeps only its shard of the weights between passes."""
        return self is ZeroMode.FULL

    @functools.cached_property
    def replicated(self) -> bool:
        """Whether nothing is sharded: every rank holds and steps the whole state."""
        return not (self.shards_optimizer or self.shards_gradients or self.shards_weights)

    @functools.cached_property
    def gathers_per_pass(self) -> bool:
        """Whether every layer's parameters are gathered before each pass through it (its
        weights are sharded at rest)."""
        return self.shards_weights

    @functools.cached_property
    def reduces_per_pass(self) -> bool:
        """Whether every layer's gradients are reduce-scattered as each backward pass
        through it ends (only a shard of them is kept, so they cannot accumulate whole)."""
        return self.shards_gradients

    @functools.cached_property
    def per_pass(self) -> bool:
        """Whether the stage's ranks meet in collectives inside every pass (layer by
        layer), so they must run their passes in lockstep."""
        return self.gathers_per_pass or self.reduces_per_pass

    @functools.cached_property
    def step_end_all_reduce(self) -> bool:
        """Whether the accumulated gradients are all-reduced at the step's end (every rank
        steps the whole optimizer state, so it needs the whole sum)."""
        return not self.shards_optimizer

    @functools.cached_property
    def step_end_reduce_scatter(self) -> bool:
        """Whether the accumulated gradients are reduce-scattered onto their owners at the
        step's end (the optimizer state is sharded, the gradients were not reduced per
        pass)."""
        return self.shards_optimizer and not self.reduces_per_pass

    @functools.cached_property
    def step_end_all_gather(self) -> bool:
        """Whether the updated parameters are all-gathered after the optimizer step (each
        rank updated its shard, and the weights stay whole between passes)."""
        return self.shards_optimizer and not self.shards_weights


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    layer_start: int
    layer_end: int  # exclusive
    ranks: tuple[int, ...]
    micro_batch_size: tuple[int, ...]
    num_micro_batches: tuple[int, ...]
    shard_fraction: tuple[float, ...]
    zero: ZeroMode = ZeroMode.NONE
    recompute: Recompute = Recompute.NONE
    # Per rank, the most micro-batches whose activations it holds at once under 1F1B (the
    # planner lowers it below the Little's-law budget where that does not fit memory, paying
    # in round trips). None: the Little's-law budget, ``cost.in_flight.in_flight_micro_batches``.
    max_in_flight: tuple[int, ...] | None = None
    # Ranks per tensor group (consecutive in ``ranks``, inside one node); 1: no tensor
    # parallelism.
    tensor_parallel_degree: int = 1
    # What else its tensor groups split (``specs.tensor_layout``); ``blocks`` at degree 1.
    tensor_layout: TensorLayout = TensorLayout.BLOCKS

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start

    @property
    def tensor_groups(self) -> tuple[tuple[int, ...], ...]:
        """The stage's tensor groups, in order: consecutive runs of its degree."""
        t = self.tensor_parallel_degree
        return tuple(self.ranks[i : i + t] for i in range(0, len(self.ranks), t))

    @property
    def leaders(self) -> tuple[int, ...]:
        """The first rank of every tensor group: the ranks routes name (all of them at
        degree 1)."""
        return self.ranks[:: self.tensor_parallel_degree]

    def leader_of(self, rank: int) -> int:
        """The leader of ``rank``'s tensor group."""
        t = self.tensor_parallel_degree
        return self.ranks[self.ranks.index(rank) // t * t]

    def data_parallel_group(self, rank: int) -> tuple[int, ...]:
        """The ranks ``rank`` shares its slice of the training state with: the members at
        its position of every tensor group (the whole stage at degree 1)."""
        t = self.tensor_parallel_degree
        return self.ranks[self.ranks.index(rank) % t :: t]

    @property
    def group_micro_batches(self) -> tuple[int, ...]:
        """Micro-batches per step of every tensor group (its leader's count; every rank's
        at degree 1): a group runs as one rank of the pipeline."""
        return self.num_micro_batches[:: self.tensor_parallel_degree]

    @property
    def num_sequences(self) -> int:
        """Sequences the stage trains per step (a tensor group's members share theirs)."""
        sizes = self.micro_batch_size[:: self.tensor_parallel_degree]
        return sum(m * b for m, b in zip(self.group_micro_batches, sizes, strict=True))


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What the cost model predicts for one optimizer step of the plan."""

    step_time_s: float
    tokens_per_s: float
    peak_memory_bytes: Mapping[int, float]  # by rank


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerUp:
    """A plan the planner priced but did not choose, for ``piebald explain``."""

    description: str
    tokens_per_s: float
    step_time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredLayerTime:
    """A per-layer time the plan was priced with that came from a profile, not a formula."""

    device: str
    layer_kind: str
    signature: str  # the profile's layer signature (piebald.profiler.keys)
    seq_len: int
    dtype: str
    micro_batch_size: int
    source: str  # "measured", "interpolated" between sizes, or "extrapolated" beyond them
    forward_s: float
    backward_s: float
    backward_recompute_s: float | None  # None: not measured (not a block)
    backward_selective_s: float | None = None  # likewise, and in plans made before it was


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredActivation:
    """Activation bytes the plan's memory was priced with that came from a profile: what
    one micro-batch keeps through one layer of this kind for its backward, per rank of
    this device type and micro-batch size (``piebald.cost.memory``)."""

    device: str
    layer_kind: str
    signature: str  # the profile's layer signature (piebald.profiler.keys)
    seq_len: int
    dtype: str
    micro_batch_size: int
    source: str  # "measured", "interpolated" between sizes, or "extrapolated" beyond them
    activation_bytes: float
    activation_recompute_bytes: float | None  # None: not measured (not a block)
    activation_selective_bytes: float | None = None  # likewise, and in older plans


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibratedCurve:
    """The efficiency curve a device type's layers of one kind were priced with in one pass
    (forward or backward), fitted to its measurements (piebald.profiler.calibrate)."""

    device: str
    layer_kind: str
    pass_kind: str
    max_fraction: float
    bandwidth_fraction: float
    half_saturation_s: float
    embedding_table_passes: float = 0.0
    overlap: float = 1.0  # of compute and memory time: 1 the roofline's max, 0 their sum


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredLink:
    """A link priced from a network profile: alpha-beta fitted to measured transfers."""

    between: tuple[str, str]  # node group names
    scope: str  # "intra-node" or "inter-node"
    latency_s: float
    bandwidth_bytes_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CostInputs:
    """Which numbers behind a plan were measured, with their values, and the profile DB
    they came from, so the plan can be explained from its file alone."""

    profile_db: str
    profile_db_digest: str  # sha256 over the DB's file names and contents
    layer_times: tuple[MeasuredLayerTime, ...] = ()
    curves: tuple[CalibratedCurve, ...] = ()
    links: tuple[MeasuredLink, ...] = ()
    activations: tuple[MeasuredActivation, ...] = ()  # older plans: none (memory analytic)

    @property
    def measured_nothing(self) -> bool:
        """Whether the DB measured none of the plan's GPU types, layers or links (the plan
        was then priced by the analytic model alone)."""
        return not (self.layer_times or self.curves or self.links or self.activations)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    cluster: ClusterSpec
    model: ModelSpec
    job: JobSpec
    stages: tuple[Stage, ...]
    routes: tuple[tuple[int, ...], ...]
    schedule: Schedule = Schedule.ONE_F_ONE_B
    predicted: Prediction | None = None
    upper_bound_tokens_per_s: float | None = None
    notes: tuple[str, ...] = ()
    runners_up: tuple[RunnerUp, ...] = ()
    cost_inputs: CostInputs | None = None  # None: priced by the analytic model alone
    # Steps between checkpoints, where chosen (``piebald plan --checkpoint-every``: given,
    # or Young/Daly's interval from a failure rate, ``cost.failure``); None: not chosen
    # (older plans too).
    checkpoint_every_steps: int | None = None
    version: int = PLAN_VERSION
    stage_of_rank: Mapping[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_plan(self)
        object.__setattr__(
            self,
            "stage_of_rank",
            {rank: index for index, stage in enumerate(self.stages) for rank in stage.ranks},
        )

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def used_ranks(self) -> tuple[int, ...]:
        return tuple(rank for stage in self.stages for rank in stage.ranks)

    @property
    def idle_ranks(self) -> tuple[int, ...]:
        used = set(self.used_ranks)
        return tuple(gpu.rank for gpu in self.cluster.gpus if gpu.rank not in used)

    def micro_batch_sizes(self) -> tuple[int, ...]:
        """Size of every micro-batch, in route order (set by the first stage's rank)."""
        first = self.stages[0]
        size_of = dict(zip(first.ranks, first.micro_batch_size, strict=True))
        return tuple(size_of[route[0]] for route in self.routes)


def weighted_round_robin(counts: Sequence[int]) -> list[int]:
    """Interleave indices so index i appears counts[i] times, spread evenly.

    Smooth weighted round robin (as in nginx): every turn each index gains its count, the
    richest takes the turn and pays the total. Each index's turns land within two of its
    periods (total / count) of each other, first and last within one period of the ends.
    Equal counts reduce to plain round robin.

    >>> weighted_round_robin([2, 1, 1])
    [0, 1, 2, 0]
    """
    total = sum(counts)
    active = [count for count in counts if count]
    if active and all(count == active[0] for count in active):
        indices = [i for i, count in enumerate(counts) if count]
        return indices * active[0]
    weights = np.asarray(counts, dtype=np.int64)
    current = np.zeros(len(counts), dtype=np.int64)
    order: list[int] = []
    for _ in range(total):
        current += weights
        # argmax takes the first maximum: ties go to the lower index.
        best = int(np.argmax(current))
        current[best] -= total
        order.append(best)
    return order


def round_robin_routes(stages: Sequence[Stage]) -> tuple[tuple[int, ...], ...]:
    """Routes that visit each stage's tensor groups (by their leaders) as often as their
    micro-batch counts, interleaved by :func:`weighted_round_robin`; the stages must agree
    on the number of micro-batches."""
    orders = [
        [stage.leaders[i] for i in weighted_round_robin(stage.group_micro_batches)]
        for stage in stages
    ]
    return tuple(zip(*orders, strict=True))


def _fail(field_name: str, value: object, expected: str) -> SpecError:
    return SpecError(source="plan", field=field_name, value=value, expected=expected)


def _validate_stage(
    plan: Plan, index: int, stage: Stage, expected_start: int, seen: set[int]
) -> None:
    where = f"stages[{index}]"
    if stage.layer_start != expected_start or stage.layer_end <= stage.layer_start:
        raise _fail(
            f"{where}.layers",
            [stage.layer_start, stage.layer_end],
            f"[{expected_start}, end) with end > {expected_start}: stages cover the "
            "layers contiguously, in order",
        )
    if not stage.ranks:
        raise _fail(f"{where}.ranks", list(stage.ranks), "at least one rank")
    for rank in stage.ranks:
        if not 0 <= rank < plan.cluster.num_gpus:
            raise _fail(
                f"{where}.ranks",
                rank,
                f"a rank of cluster {plan.cluster.name!r} (0..{plan.cluster.num_gpus - 1})",
            )
        if rank in seen:
            raise _fail(f"{where}.ranks", rank, "each rank in at most one stage, once")
        seen.add(rank)
    for name in ("micro_batch_size", "num_micro_batches", "shard_fraction"):
        values = getattr(stage, name)
        if len(values) != len(stage.ranks):
            raise _fail(
                f"{where}.{name}",
                list(values),
                f"{len(stage.ranks)} values, one per rank of the stage",
            )
    _validate_tensor_groups(plan, where, stage)
    batch = plan.job.global_batch_size
    # Bounded above too: a rank without micro-batches still has its size priced.
    if any(not 1 <= size <= batch for size in stage.micro_batch_size):
        raise _fail(
            f"{where}.micro_batch_size",
            list(stage.micro_batch_size),
            f"sizes from 1 to the global batch ({batch})",
        )
    if any(count < 0 for count in stage.num_micro_batches):
        raise _fail(f"{where}.num_micro_batches", list(stage.num_micro_batches), "counts >= 0")
    if stage.num_sequences != plan.job.global_batch_size:
        raise _fail(
            f"{where}.num_micro_batches",
            list(stage.num_micro_batches),
            f"micro-batches x sizes summing to the global batch "
            f"{plan.job.global_batch_size} (they sum to {stage.num_sequences})",
        )
    fractions = stage.shard_fraction
    if any(not math.isfinite(f) or f < 0 for f in fractions) or not math.isclose(
        sum(fractions), 1.0, abs_tol=FRACTION_TOLERANCE
    ):
        raise _fail(
            f"{where}.shard_fraction", list(fractions), "non-negative fractions summing to 1"
        )
    _validate_in_flight(plan, where, stage)
    _validate_lockstep(plan, where, stage)
    if stage.zero.replicated and len(set(fractions)) > 1:
        raise _fail(
            f"{where}.shard_fraction",
            list(fractions),
            "equal fractions when zero is 'none' (nothing is sharded)",
        )


def tensor_split_problem(arch: ModelArch, degree: int) -> str | None:
    """Why a block of ``arch`` cannot be split ``degree`` ways (heads, key/value heads
    and the MLP width split evenly), or None where it can."""
    if degree not in TENSOR_PARALLEL_DEGREES:
        return f"one of {list(TENSOR_PARALLEL_DEGREES)}"
    for name, width in (
        ("attention heads", arch.num_heads),
        ("key/value heads", arch.num_kv_heads),
        ("MLP width", arch.ffn_hidden_size),
    ):
        if width % degree:
            return f"a degree dividing the model's {name} ({width})"
    return None


def tensor_groups_inside_nodes(cluster: ClusterSpec, ranks: Sequence[int], degree: int) -> bool:
    """Whether ``ranks``, cut into consecutive runs of ``degree``, leave every run inside
    one node."""
    if len(ranks) % degree:
        return False
    return all(
        len({cluster.gpus[rank].node_index for rank in ranks[start : start + degree]}) == 1
        for start in range(0, len(ranks), degree)
    )


def tensor_degree_fits(
    cluster: ClusterSpec,
    arch: ModelArch,
    ranks: Sequence[int],
    degree: int,
    *,
    layout: TensorLayout,
    seq_len: int,
) -> bool:
    """Whether a stage of ``ranks`` can run ``arch``'s blocks at tensor-parallel
    ``degree`` in ``layout``: the model splits that many ways, the ranks form whole
    tensor groups inside nodes, and a layout that splits the sequence cuts ``seq_len``
    into equal chunks (always at degree 1)."""
    return degree == 1 or (
        tensor_split_problem(arch, degree) is None
        and tensor_groups_inside_nodes(cluster, ranks, degree)
        and not (layout.splits_sequence and seq_len % degree)
    )


def _validate_tensor_groups(plan: Plan, where: str, stage: Stage) -> None:
    """Tensor groups split heads and the MLP width evenly, sit inside one node (their
    collectives run every layer, on the node's link) and run as one: their members carry
    equal micro-batch sizes, counts, shard fractions and in-flight budgets."""
    t = stage.tensor_parallel_degree
    if t == 1:
        if stage.tensor_layout is not TensorLayout.BLOCKS:
            raise _fail(
                f"{where}.tensor_layout",
                stage.tensor_layout.value,
                f"'{TensorLayout.BLOCKS.value}' at tensor_parallel_degree 1 (nothing to split)",
            )
        return
    problem = tensor_split_problem(plan.model.arch, t)
    if problem is not None:
        raise _fail(f"{where}.tensor_parallel_degree", t, problem)
    if len(stage.ranks) % t:
        raise _fail(
            f"{where}.ranks",
            list(stage.ranks),
            f"a multiple of tensor_parallel_degree {t} ranks (whole tensor groups)",
        )
    per_rank = {
        "micro_batch_size": stage.micro_batch_size,
        "num_micro_batches": stage.num_micro_batches,
        "shard_fraction": stage.shard_fraction,
        "max_in_flight": stage.max_in_flight or (),
    }
    for start in range(0, len(stage.ranks), t):
        group = stage.ranks[start : start + t]
        if not tensor_groups_inside_nodes(plan.cluster, group, t):
            raise _fail(
                f"{where}.ranks",
                list(group),
                f"tensor group of {t} ranks inside one node (consecutive ranks of a node)",
            )
        for name, values in per_rank.items():
            members = values[start : start + t]
            if members and any(
                not math.isclose(value, members[0], rel_tol=1e-9) for value in members
            ):
                raise _fail(
                    f"{where}.{name}",
                    list(values),
                    f"equal values across each tensor group (ranks {list(group)})",
                )


def _validate_lockstep(plan: Plan, where: str, stage: Stage) -> None:
    """A ZeRO-2/3 stage of several ranks gathers and reduce-scatters layer by layer inside
    every pass, so its ranks run the same passes together: equal micro-batch counts, and
    one pass pattern. One stage alternates forward and backward on every rank, and GPipe
    runs all forwards then all backwards; a 1F1B pipeline orders each rank's passes by
    when its inputs arrive, which differs between ranks, so it is not allowed there."""
    if not stage.zero.per_pass or len(stage.leaders) == 1:  # one data-parallel rank
        return
    counts = stage.num_micro_batches
    if len(set(counts)) > 1 or counts[0] < 1:
        raise _fail(
            f"{where}.num_micro_batches",
            list(counts),
            f"equal counts of at least 1 under zero {stage.zero.value!r} (its ranks gather "
            "and reduce-scatter layer by layer in lockstep)",
        )
    if plan.num_stages > 1 and plan.schedule is not Schedule.GPIPE:
        raise _fail(
            f"{where}.zero",
            stage.zero.value,
            "'none' or 'optimizer' for a stage of several ranks in a 1f1b pipeline (or "
            "schedule 'gpipe'): per-pass ZeRO needs the stage's ranks in lockstep",
        )


def _validate_in_flight(plan: Plan, where: str, stage: Stage) -> None:
    budget = stage.max_in_flight
    if budget is None:
        return
    if plan.schedule is not Schedule.ONE_F_ONE_B:
        raise _fail(
            f"{where}.max_in_flight",
            list(budget),
            f"no in-flight budget with schedule {plan.schedule.value!r} (only 1f1b has one)",
        )
    if len(budget) != len(stage.ranks):
        raise _fail(
            f"{where}.max_in_flight", list(budget), f"{len(stage.ranks)} values, one per rank"
        )
    for value, count in zip(budget, stage.num_micro_batches, strict=True):
        if not min(1, count) <= value <= count:
            raise _fail(
                f"{where}.max_in_flight",
                list(budget),
                f"per rank 1..its micro-batches {list(stage.num_micro_batches)} "
                "(0 for a rank without any)",
            )


def _validate_routes(plan: Plan) -> None:
    first = plan.stages[0]
    num_routes = sum(first.group_micro_batches)
    if len(plan.routes) != num_routes:
        raise _fail(
            "routes", f"{len(plan.routes)} routes", f"one route per micro-batch ({num_routes})"
        )
    for index, stage in enumerate(plan.stages):
        visits = dict.fromkeys(stage.leaders, 0)
        for j, route in enumerate(plan.routes):
            if len(route) != plan.num_stages or route[index] not in visits:
                raise _fail(
                    f"routes[{j}]",
                    list(route),
                    f"one rank per stage, the one of stage {index} in {list(stage.leaders)}"
                    + (" (tensor-group leaders)" if stage.tensor_parallel_degree > 1 else ""),
                )
            visits[route[index]] += 1
        counts = stage.group_micro_batches
        if tuple(visits.values()) != counts:
            raise _fail(
                f"stages[{index}].num_micro_batches",
                list(stage.num_micro_batches),
                f"the number of routes through each rank ({list(visits.values())})",
            )


def validate_plan(plan: Plan) -> None:
    """Raise :class:`SpecError` naming the first field that is inconsistent."""
    if plan.version != PLAN_VERSION:
        raise _fail("version", plan.version, f"plan format version {PLAN_VERSION}")
    if not plan.stages:
        raise _fail("stages", [], "at least one stage")
    seen: set[int] = set()
    start = 0
    for index, stage in enumerate(plan.stages):
        _validate_stage(plan, index, stage, start, seen)
        start = stage.layer_end
    if start != plan.model.num_layers:
        raise _fail(
            f"stages[{len(plan.stages) - 1}].layers",
            [plan.stages[-1].layer_start, start],
            f"the last stage to end at the model's {plan.model.num_layers} layers",
        )
    sizes = {size for stage in plan.stages for size in stage.micro_batch_size}
    if plan.num_stages > 1 and len(sizes) > 1:
        raise _fail(
            "stages[*].micro_batch_size",
            sorted(sizes),
            "one micro-batch size in a multi-stage plan (a micro-batch keeps its size "
            "along its route)",
        )
    _validate_routes(plan)
    every = plan.checkpoint_every_steps
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise _fail("checkpoint_every_steps", every, "a whole number of steps >= 1, or absent")
    try:
        check_job_fits_model(plan.job, plan.model)
    except SpecError as error:
        raise _fail("job.seq_len", plan.job.seq_len, error.expected) from None
