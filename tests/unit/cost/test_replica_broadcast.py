"""The leader's broadcast of the weights a tensor group holds whole, priced as the runtime
runs it (``cost.replica_broadcast``): under ZeRO-3 before every pass, under ZeRO-2 once per
step after the gather, under ZeRO none and 1 never; and the planner's stage matrices and
its exact build price it as the plan estimate does.

The oracle is the closed form from the model's layers and the node's link: for each layer
with weights its group holds whole (the embedding and head of the ``sequence`` layout, the
blocks' norms), alpha per hop plus the layer's bytes over the link.
"""

from __future__ import annotations

import math

import pytest

from piebald.cost.compute import DEFAULT_CURVE
from piebald.cost.data_parallel import plan_stage_comm
from piebald.cost.rank_pass import plan_rank_pass
from piebald.planner.stage_builder import StageRules, build_stage
from piebald.planner.stage_costs import stage_cost
from piebald.planner.stage_settings import stage_settings
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan, ZeroMode
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout
from tensor_plans import TWO_H100_NODES, tp_plan, tp_stage

MODEL = load_model("llama-3.2-1b")  # a vocabulary-sized embedding (tied head), small blocks
DEGREE = 4
RANKS = tuple(range(8))  # node 0: two tensor groups of four


def _expected_s(degree: int) -> float:
    """Every layer's whole weights in bf16, leader to the other members over NVLink."""
    link = TWO_H100_NODES.link_between(0, 1)
    return sum(
        link.latency_s * (degree - 1) + layer.num_whole_params * 2 / link.bandwidth_bytes_per_s
        for layer in MODEL.layers_at(degree, TensorLayout.SEQUENCE)
        if layer.num_whole_params
    )


def _plan(zero: ZeroMode) -> Plan:
    stage = tp_stage(
        layers=(0, MODEL.num_layers), ranks=RANKS, degree=DEGREE, num_micro_batches=2, zero=zero
    )
    return tp_plan(MODEL, [stage])


def test_zero3_passes_and_zero2_steps_broadcast_the_whole_weights() -> None:
    expected = _expected_s(DEGREE)
    # The embedding dominates (the head is tied): a millisecond, not a rounding error.
    assert expected > 1e-4
    passes = {zero: plan_rank_pass(_plan(zero), stage_index=0, position=1) for zero in ZeroMode}
    assert passes[ZeroMode.FULL].weights_broadcast_s == pytest.approx(expected, rel=1e-12)
    for zero in (ZeroMode.NONE, ZeroMode.OPTIMIZER, ZeroMode.GRADIENTS):
        assert passes[zero].weights_broadcast_s == 0.0
    # In both passes, beside the input's broadcast and the block collectives.
    full, one = passes[ZeroMode.FULL], passes[ZeroMode.OPTIMIZER]
    assert full.tensor_forward_s - one.tensor_forward_s == pytest.approx(expected, rel=1e-9)
    assert full.tensor_backward_s - one.tensor_backward_s == pytest.approx(expected, rel=1e-9)
    # ZeRO-2 gathers what ZeRO-1 gathers once per step, then broadcasts the whole weights.
    gather = {zero: plan_stage_comm(_plan(zero), 0).all_gather_s for zero in ZeroMode}
    assert gather[ZeroMode.GRADIENTS] - gather[ZeroMode.OPTIMIZER] == pytest.approx(
        expected, rel=1e-9
    )


def test_degree_one_broadcasts_nothing() -> None:
    stage = tp_stage(
        layers=(0, MODEL.num_layers), ranks=RANKS, degree=1, num_micro_batches=1, zero=ZeroMode.FULL
    )
    assert (
        plan_rank_pass(tp_plan(MODEL, [stage]), stage_index=0, position=0).weights_broadcast_s == 0
    )


@pytest.mark.parametrize("zero", [ZeroMode.GRADIENTS, ZeroMode.FULL])
def test_the_planner_prices_it_as_the_estimate_does(zero: ZeroMode) -> None:
    # One stage of every layer at degree 4 under ZeRO-2 or 3: the DP's matrices and the
    # exact build agree on the pass (ZeRO-3's broadcasts in it) and the sync (ZeRO-2's).
    job = JobSpec(global_batch_size=4, seq_len=1024)
    rules = StageRules(
        zero_modes=(zero,), recompute=(Recompute.NONE,), tensor_parallel_degrees=(DEGREE,)
    )
    common = dict(model=MODEL, job=job, ranks=RANKS, stage_index=0, num_stages=1, rules=rules)
    cost = stage_cost(
        stage_settings(TWO_H100_NODES, micro_batch_size=1, curve=DEFAULT_CURVE, **common),
        ranks_to_end=len(RANKS),
    )
    cost.ensure_below(math.inf)
    built = build_stage(
        TWO_H100_NODES,
        layer_start=0,
        layer_end=MODEL.num_layers,
        micro_batch_sizes=(1,) * len(RANKS),
        widths=(len(RANKS),),
        **common,
    )
    assert built is not None and built.stage.zero is zero
    whole = (0, MODEL.num_layers)
    assert cost.pass_s[whole] == pytest.approx(built.pass_s, rel=1e-9)
    assert cost.sync_s[whole] == pytest.approx(built.sync_s, rel=1e-9)
    # And as the plan estimate prices the built stage: its pass and its step-end sync.
    plan = tp_plan(MODEL, [built.stage])
    comm = plan_stage_comm(plan, 0)
    member = plan_rank_pass(plan, stage_index=0, position=1)
    estimated_pass_s = max(member.forward_s, comm.before_forward_s) + max(
        member.backward_s, comm.during_backward_s
    )
    assert built.pass_s == pytest.approx(estimated_pass_s, rel=1e-9)
    assert built.sync_s == pytest.approx(comm.sync_s, rel=1e-9)
