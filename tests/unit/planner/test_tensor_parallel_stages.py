"""The planner's tensor-parallel stages: priced as the estimate prices them, in the layout the
runtime runs.

- ``stage_cost``'s matrices (every layer range at once) price a member's pass exactly as
  ``cost.rank_pass`` prices it at one range: the slice's compute in the ``sequence``
  layout, the block collectives and the stage's edges (``cost.tensor_comm``), and the
  leader's broadcast of a received input. One formula, so the layer split and the exact
  build agree; checked for every range of a middle stage, where every term is there.
- ``build_stage`` makes sequence-parallel stages at degree > 1, whose plan the estimate
  prices as the build did (``blocks`` at degree 1).
- Degrees that do not divide the job's sequence are not offered: sequence parallelism cuts
  it into t equal chunks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from piebald.cost.comm import ring_profile
from piebald.cost.compute import DEFAULT_CURVE
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.rank_pass import input_broadcast_s, rank_pass
from piebald.planner.stage_builder import StageChoice, StageRules, build_stage
from piebald.planner.stage_costs import StageCost, stage_cost
from piebald.planner.stage_settings import stage_settings
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout
from tensor_plans import TWO_H100_NODES

RANKS = tuple(range(8))  # node 0
ONE_SETTING = StageRules(zero_modes=(ZeroMode.NONE,), recompute=(Recompute.NONE,))


@pytest.mark.parametrize(("model_name", "degree"), [("gpt2", 2), ("llama-3-8b", 4)])
def test_the_stage_matrices_price_a_members_pass_as_rank_pass_does(
    model_name: str, degree: int
) -> None:
    model = load_model(model_name)
    job = JobSpec(global_batch_size=16, seq_len=1024)
    rules = StageRules(
        zero_modes=ONE_SETTING.zero_modes,
        recompute=ONE_SETTING.recompute,
        tensor_parallel_degrees=(degree,),
    )
    cost = _stage_cost(
        TWO_H100_NODES,
        model=model,
        job=job,
        ranks=RANKS,
        micro_batch_size=1,
        stage_index=1,
        num_stages=3,
        rules=rules,
        curve=DEFAULT_CURVE,
        ranks_to_end=16,
    )
    shape = PassShape.for_job(
        job,
        device=TWO_H100_NODES.device_of(0),
        micro_batch_size=1,
        recompute=Recompute.NONE,
        tensor_parallel_degree=degree,
        tensor_layout=TensorLayout.SEQUENCE,
    )
    group = RANKS[:degree]
    times = pass_times(model, shape=shape)
    ring = ring_profile(TWO_H100_NODES, group)
    broadcast_s = input_broadcast_s(TWO_H100_NODES, group, model=model, job=job, micro_batch_size=1)
    checked = 0
    for start in range(model.num_layers):
        for end in range(start + 1, model.num_layers + 1):
            if not np.isfinite(cost.pass_s[start, end]):
                continue  # does not fit (none of the ranges here; a guard)
            expected = rank_pass(
                model,
                start=start,
                end=end,
                shape=shape,
                times=times,
                ring=ring,
                broadcast_s=broadcast_s,
                receives_activation=True,
                receives_gradient=True,
            )
            assert cost.pass_s[start, end] == pytest.approx(expected.pass_s, rel=1e-9), (
                start,
                end,
            )
            checked += 1
    assert checked == model.num_layers * (model.num_layers + 1) // 2


@pytest.mark.parametrize("degree", [1, 2, 4])
def test_built_stages_are_sequence_parallel_above_degree_one(degree: int) -> None:
    choice = _whole_model_stage(
        load_model("gpt2"), JobSpec(global_batch_size=16, seq_len=1024), degree=degree
    )
    assert choice is not None
    stage = choice.stage
    assert stage.tensor_parallel_degree == degree
    expected = TensorLayout.SEQUENCE if degree > 1 else TensorLayout.BLOCKS
    assert stage.tensor_layout is expected


def test_degrees_that_do_not_divide_the_sequence_are_not_offered() -> None:
    model = load_model("gpt2")
    job = JobSpec(global_batch_size=16, seq_len=1022)  # 2 divides it, 4 does not
    for degree, fits in ((2, True), (4, False)):
        choice = _whole_model_stage(model, job, degree=degree)
        assert (choice is not None) is fits
        cost = _stage_cost(
            TWO_H100_NODES,
            model=model,
            job=job,
            ranks=RANKS,
            micro_batch_size=1,
            stage_index=0,
            num_stages=1,
            rules=StageRules(tensor_parallel_degrees=(degree,)),
            curve=DEFAULT_CURVE,
            ranks_to_end=len(RANKS),
        )
        assert bool(np.isfinite(cost.cost_s[0, model.num_layers])) is fits


def _whole_model_stage(model: ModelSpec, job: JobSpec, *, degree: int) -> StageChoice | None:
    """Every layer on node 0's eight H100s at tensor-parallel ``degree``, built exactly."""
    return build_stage(
        TWO_H100_NODES,
        model=model,
        job=job,
        ranks=RANKS,
        layer_start=0,
        layer_end=model.num_layers,
        micro_batch_sizes=(1,) * len(RANKS),
        stage_index=0,
        num_stages=1,
        widths=(len(RANKS),),
        rules=StageRules(tensor_parallel_degrees=(degree,)),
    )


def _stage_cost(cluster: ClusterSpec, *, ranks_to_end: int, **settings: Any) -> StageCost:
    """The stage's matrices, every range priced (``stage_cost`` prices a range where first
    asked), its settings priced first (``stage_settings``)."""
    cost = stage_cost(stage_settings(cluster, **settings), ranks_to_end=ranks_to_end)
    cost.ensure_below(math.inf)
    return cost
