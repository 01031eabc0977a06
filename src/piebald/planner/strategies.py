"""The strategies piebald searches: its own full plan space and the baselines, each a
restriction of that space (docs/design.md section 7), all scored by the same cost model.

A baseline here is what that system can express, "as modelled": its runtime's own kernels
and overheads are not modelled, only its choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from piebald.planner.partition import split_layers, uniform_bounds
from piebald.planner.stage_builder import StageRules
from piebald.specs.plan import TENSOR_PARALLEL_DEGREES, ZeroMode
from piebald.specs.recompute import RECOMPUTE_BY_FRUGALITY, Recompute

__all__ = [
    "BASELINES",
    "PIEBALD",
    "STRATEGIES",
    "Strategy",
    "with_recompute",
    "with_tensor_parallel",
    "with_zero_mode",
]

_NOT_SHARDED = (ZeroMode.NONE,)
_DISTRIBUTED_OPTIMIZER = (ZeroMode.NONE, ZeroMode.OPTIMIZER)
_TENSOR_PARALLEL = TENSOR_PARALLEL_DEGREES  # Megatron-style tensor groups inside a node


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    name: str
    description: str
    max_stages: int = 64
    uniform_layers: bool = False  # equal layer counts per stage (Megatron, Sailor, Holmes)
    equal_stage_sizes: bool = False  # every stage has the same number of GPUs (Megatron)
    type_homogeneous_stages: bool = False  # a stage holds one GPU type (Metis)
    domain_stages: bool = False  # a stage never spans two NIC classes or sites (Holmes)
    grid_drop: bool = False  # may drop the slowest GPUs to form a p x d grid (Megatron)
    allow_idle_groups: bool = False  # may leave whole node groups idle (piebald)
    # One tensor-parallel degree for every stage (Megatron's --tensor-model-parallel-size),
    # searched over the degrees its stage rules allow.
    uniform_tensor_parallel: bool = False
    per_rank_micro_batch: bool = False  # own micro-batch size per GPU, one-stage plans
    # Run the baseline searches first and let their plans compete (clusters up to this many
    # GPUs; beyond, planning time matters more than the guarantee).
    seed_with_baselines_up_to: int = 0
    stage_rules: StageRules = field(default_factory=StageRules)
    # Selective recompute is in ``stage_rules`` but searched on clusters up to this many
    # GPUs only, unless asked for (``plan --recompute``): it is a third setting to price
    # for every stage, a third more planning time at 1,024 GPUs for plans no faster there
    # (the docs' planning-time results).
    selective_recompute_up_to: int | None = None

    def for_cluster_of(self, num_gpus: int) -> Strategy:
        """The strategy as the search runs it on ``num_gpus`` GPUs (unrestricted by the
        user): without selective recompute beyond ``selective_recompute_up_to``."""
        limit = self.selective_recompute_up_to
        modes = self.stage_rules.recompute
        if limit is None or num_gpus <= limit or Recompute.SELECTIVE not in modes:
            return self
        kept = tuple(mode for mode in modes if mode is not Recompute.SELECTIVE)
        if not kept:
            return self
        return replace(self, stage_rules=replace(self.stage_rules, recompute=kept))

    def seeds_with_baselines(self, num_gpus: int) -> bool:
        """Whether the baseline searches run first on a cluster of ``num_gpus``."""
        return num_gpus <= self.seed_with_baselines_up_to

    def split_layers(
        self, costs: Sequence[npt.NDArray[np.float64]], *, num_layers: int
    ) -> tuple[float, tuple[int, ...]]:
        """(the slowest stage's cost, layer bounds) over stages with cost matrices
        ``costs`` (``partition.split_layers``): the bottleneck DP's split, or the even split
        where the strategy fixes it (inf where a stage does not fit)."""
        if not self.uniform_layers:
            return split_layers(costs)
        bounds = uniform_bounds(num_layers, len(costs))
        return max(
            float(c[a, b]) for c, a, b in zip(costs, bounds, bounds[1:], strict=False)
        ), bounds

    @property
    def moves_layer_bounds(self) -> bool:
        """Whether the layer split may move off what the DP chose (the proxy's polish)."""
        return not self.uniform_layers

    def mixes_micro_batch_sizes(self, num_stages: int) -> bool:
        """Whether a plan of ``num_stages`` may give each GPU its own micro-batch size."""
        return self.per_rank_micro_batch and num_stages == 1


PIEBALD = Strategy(
    name="piebald",
    description="asymmetric stages, mixed types, uneven layers, per-GPU micro-batches and "
    "sizes, uneven shards, ZeRO mode, recompute (none, selective, full) and tensor "
    "parallelism per stage, idle "
    "groups when faster",
    allow_idle_groups=True,
    per_rank_micro_batch=True,
    seed_with_baselines_up_to=16,
    stage_rules=StageRules(
        recompute=RECOMPUTE_BY_FRUGALITY, tensor_parallel_degrees=_TENSOR_PARALLEL
    ),
    selective_recompute_up_to=256,
)

BASELINES: tuple[Strategy, ...] = (
    Strategy(
        name="megatron",
        description="uniform layers, equal DP degree per stage, equal micro-batches, "
        "one tensor-parallel degree, slowest GPUs dropped to form a grid (Megatron-LM)",
        uniform_layers=True,
        equal_stage_sizes=True,
        grid_drop=True,
        uniform_tensor_parallel=True,
        stage_rules=StageRules(
            zero_modes=_DISTRIBUTED_OPTIMIZER,
            even_shards=True,
            equal_micro_batches=True,
            tensor_parallel_degrees=_TENSOR_PARALLEL,
        ),
    ),
    Strategy(
        name="zero-even",
        description="one data-parallel group, equal batch, even shards (DeepSpeed ZeRO, FSDP)",
        max_stages=1,
        stage_rules=StageRules(even_shards=True, equal_micro_batches=True),
    ),
    Strategy(
        name="cephalo",
        description="one data-parallel group, per-GPU batch and micro-batch size, uneven "
        "shards by memory (Cephalo)",
        max_stages=1,
        per_rank_micro_batch=True,
    ),
    Strategy(
        name="poplar",
        description="one data-parallel group, per-GPU batch, even shards, ZeRO stage "
        "searched (Poplar)",
        max_stages=1,
        per_rank_micro_batch=True,
        stage_rules=StageRules(even_shards=True),
    ),
    Strategy(
        name="metis",
        description="pipeline of type-homogeneous stages, uneven layers, tensor "
        "parallelism, no ZeRO (Metis)",
        type_homogeneous_stages=True,
        stage_rules=StageRules(
            zero_modes=_NOT_SHARDED, even_shards=True, tensor_parallel_degrees=_TENSOR_PARALLEL
        ),
    ),
    Strategy(
        name="sailor",
        description="uniform layers, stages of mixed GPU types with per-GPU batch, tensor "
        "parallelism (Sailor)",
        uniform_layers=True,
        stage_rules=StageRules(
            zero_modes=_DISTRIBUTED_OPTIMIZER,
            even_shards=True,
            tensor_parallel_degrees=_TENSOR_PARALLEL,
        ),
    ),
    Strategy(
        name="holmes",
        description="stages follow NIC classes and sites, uniform layers, equal batch, "
        "tensor parallelism (Holmes)",
        uniform_layers=True,
        domain_stages=True,
        stage_rules=StageRules(
            zero_modes=_DISTRIBUTED_OPTIMIZER,
            even_shards=True,
            equal_micro_batches=True,
            tensor_parallel_degrees=_TENSOR_PARALLEL,
        ),
    ),
    Strategy(
        name="zorse",
        description="asymmetric stages, mixed types, per-GPU micro-batch counts, one "
        "micro-batch size, even shards, pipeline-efficient ZeRO, recompute on (Zorse)",
        stage_rules=StageRules(
            zero_modes=(ZeroMode.OPTIMIZER,), recompute=(Recompute.FULL,), even_shards=True
        ),
    ),
)

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (PIEBALD, *BASELINES)}


def with_zero_mode(strategy: Strategy, zero: ZeroMode | None) -> Strategy | None:
    """``strategy`` with every stage in ZeRO mode ``zero`` (``plan --zero``), unchanged for
    None, and None where the strategy cannot express that mode (Metis has no ZeRO)."""
    if zero is None:
        return strategy
    if zero not in strategy.stage_rules.zero_modes:
        return None
    return replace(strategy, stage_rules=replace(strategy.stage_rules, zero_modes=(zero,)))


def with_recompute(strategy: Strategy, modes: tuple[Recompute, ...] | None) -> Strategy | None:
    """``strategy`` with its stages' recompute chosen among ``modes`` only (``plan
    --recompute``), on clusters of any size; unchanged for None, and None where the
    strategy cannot express one of them (Zorse always recomputes; no baseline recomputes
    selectively)."""
    if modes is None:
        return strategy
    if not set(modes) <= set(strategy.stage_rules.recompute):
        return None
    ordered = tuple(mode for mode in RECOMPUTE_BY_FRUGALITY if mode in modes)
    rules = replace(strategy.stage_rules, recompute=ordered)
    return replace(strategy, stage_rules=rules, selective_recompute_up_to=None)


def with_tensor_parallel(strategy: Strategy, degree: int | None) -> Strategy | None:
    """``strategy`` with every stage at tensor-parallel ``degree`` (``plan
    --tensor-parallel``), unchanged for None, and None where the strategy cannot express
    that degree (the baselines without tensor parallelism, above 1)."""
    if degree is None:
        return strategy
    if degree not in strategy.stage_rules.tensor_parallel_degrees:
        return None
    rules = replace(strategy.stage_rules, tensor_parallel_degrees=(degree,))
    return replace(strategy, stage_rules=rules)
