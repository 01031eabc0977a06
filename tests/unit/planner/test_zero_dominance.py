"""ZeRO-1 takes every layer range a replicated stage (ZeRO none) could, so the DP does not
price NONE beside it (``stage_settings._priced_zero_modes``).

The oracle is each mode priced alone over every range, on stages of several GPU types,
at several depths, micro-batch sizes and tensor-parallel degrees, with memory tight
enough that some ranges fit only with fewer micro-batches in flight (shrunk budgets).
Wherever NONE fits, ZeRO-1 fits in no more round trips, costs the same (within the tie
rule's 1e-9) or less, and steps a shorter optimizer; and the stage priced with both
modes allowed is exactly the stage priced with ZeRO-1 alone.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cluster_builders import cluster as _cluster
from cluster_builders import group as _group
from piebald.cost.compute import DEFAULT_CURVE
from piebald.planner.stage_builder import ALL_ZERO_MODES, StageRules
from piebald.planner.stage_costs import StageCost, stage_cost
from piebald.planner.stage_settings import _priced_zero_modes, stage_settings
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.presets import load_model

CLUSTER = _cluster(
    "three-types",
    _group("h", "H100-SXM", 4, count=1, nic=("infiniband", "400Gb/s")),
    _group("a", "A100-40GB", 4, count=1, nic=("infiniband", "200Gb/s")),
    _group("v", "V100-16GB", 4, count=1, nic=("ethernet", "25Gb/s")),
)
MODEL = load_model("llama-3.2-3b")
JOB = JobSpec(global_batch_size=512, seq_len=4096)


def _priced(
    cluster: ClusterSpec,
    model: ModelSpec,
    *,
    ranks: tuple[int, ...],
    zero_modes: tuple[ZeroMode, ...],
    degree: int,
    size: int,
    index: int,
    depth: int,
    ranks_to_end: int,
) -> StageCost:
    rules = StageRules(zero_modes=zero_modes, tensor_parallel_degrees=(degree,))
    settings = stage_settings(
        cluster,
        model=model,
        job=JOB,
        ranks=ranks,
        micro_batch_size=size,
        stage_index=index,
        num_stages=depth,
        rules=rules,
        curve=DEFAULT_CURVE,
    )
    cost = stage_cost(settings, ranks_to_end=ranks_to_end)
    cost.ensure_below(math.inf)
    return cost


# (ranks, tensor-parallel degree, micro-batch size, stage index, depth, ranks to the end)
CASES = [
    ((0, 1, 2, 3, 4, 5, 6, 7), 1, 1, 0, 3, 64),  # H100s and A100s, first of three
    ((4, 5, 6, 7, 8, 9, 10, 11), 2, 2, 1, 3, 40),  # A100s and V100s, middle, TP 2
    ((8, 9, 10, 11), 1, 1, 0, 4, 60),  # V100s, first of four
    ((8, 9, 10, 11), 1, 2, 1, 4, 60),  # V100s, middle, larger micro-batches
]


@pytest.mark.parametrize("case", CASES, ids=[f"ranks{c[0][0]}-{c[0][-1]}-tp{c[1]}" for c in CASES])
def test_zero_one_takes_every_range_none_could(case: tuple) -> None:
    ranks, degree, size, index, depth, ranks_to_end = case
    common = dict(
        ranks=ranks,
        degree=degree,
        size=size,
        index=index,
        depth=depth,
        ranks_to_end=ranks_to_end,
    )
    none = _priced(CLUSTER, MODEL, zero_modes=(ZeroMode.NONE,), **common)
    zero_one = _priced(CLUSTER, MODEL, zero_modes=(ZeroMode.OPTIMIZER,), **common)
    both = _priced(CLUSTER, MODEL, zero_modes=(ZeroMode.NONE, ZeroMode.OPTIMIZER), **common)
    valid = np.triu(np.ones(none.cost_s.shape, dtype=bool), k=1)
    fits = valid & np.isfinite(none.cost_s)
    # Each case is memory-tight: ranges NONE fits only with a shrunk in-flight budget
    # (more round trips), and ranges only ZeRO-1 fits.
    assert (none.rounds[fits] > 0).any()
    assert (np.isfinite(zero_one.cost_s) & ~np.isfinite(none.cost_s) & valid).any()
    assert np.all(np.isfinite(zero_one.cost_s[fits]))
    assert np.all(zero_one.cost_s[fits] <= none.cost_s[fits] * (1 + 1e-9))
    assert np.all(zero_one.rounds[fits] <= none.rounds[fits])
    assert np.all(zero_one.optimizer_s[fits] < none.optimizer_s[fits])
    for name in ("cost_s", "busy_s", "pass_s", "sync_s", "optimizer_s", "rounds"):
        np.testing.assert_array_equal(getattr(both, name)[valid], getattr(zero_one, name)[valid])


def test_none_is_priced_where_nothing_dominates_it() -> None:
    # A group of one rank (ZeRO-1 shards nothing there), or rules without ZeRO-1.
    both = (ZeroMode.NONE, ZeroMode.OPTIMIZER)
    assert _priced_zero_modes(both, num_groups=1) == both
    assert _priced_zero_modes((ZeroMode.NONE,), num_groups=8) == (ZeroMode.NONE,)
    assert _priced_zero_modes(ALL_ZERO_MODES, num_groups=2) == tuple(
        zero for zero in ALL_ZERO_MODES if zero is not ZeroMode.NONE
    )
