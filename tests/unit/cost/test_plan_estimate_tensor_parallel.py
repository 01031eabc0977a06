"""The plan estimate of tensor-parallel stages against closed forms and counts.

- A stage's data-parallel sync runs over one of its data-parallel groups (the members at
  one position of every tensor group) on the rank's slice: the ring closed form
  (n-1)(alpha + S/(n B E)), S the slice's parameters in bf16 padded to the largest share
  (t times a plan fraction); groups crossing nodes share each NIC t ways.
- The in-flight budgets count tensor groups: a tensor-parallel plan's leaders hold what
  the same plan with each group collapsed onto its leader (degree 1) holds.
- Memory: a rank at degree 2 keeps the stage's parameters less half of every block's
  matmul weights (the only split parameters), so its weights, gradients and optimizer
  state shrink by that ratio, worked out from the architecture's widths.
"""

from __future__ import annotations

import dataclasses

import pytest

from piebald.cost.comm import BUS_EFFICIENCY
from piebald.cost.compute import optimizer_step_time_s
from piebald.cost.in_flight import stage_in_flight
from piebald.cost.memory import bytes_per_param, plan_rank_memory
from piebald.cost.plan_estimate import estimate_plan
from piebald.specs.devices import Dtype
from piebald.specs.job import Optimizer
from piebald.specs.plan import Plan, ZeroMode
from piebald.specs.presets import load_model
from piebald.specs.tensor_layout import TensorLayout
from tensor_plans import TWO_H100_NODES, collapsed, tp_plan, tp_stage, two_node_plan

E = BUS_EFFICIENCY


def _slice_bytes(plan: Plan, degree: int) -> float:
    model = plan.model
    return model.stage_params(0, model.num_layers, tensor_parallel_degree=degree) * 2.0


def test_the_sync_of_a_tp2_dp2_stage_runs_over_one_data_parallel_group() -> None:
    # Group (0, 1) holds 0.6 of the state, group (2, 3) 0.4: shares 0.6 and 0.4 of a slice.
    stage = dataclasses.replace(
        tp_stage(
            layers=(0, 14), ranks=range(4), degree=2, num_micro_batches=2, zero=ZeroMode.OPTIMIZER
        ),
        shard_fraction=(0.3, 0.3, 0.2, 0.2),
    )
    plan = tp_plan("gpt2", [stage])
    link = TWO_H100_NODES.link_between(0, 2)
    padded = 2 * 0.6 * _slice_bytes(plan, 2)  # n = 2 ranks, the largest share 0.6
    one_way_s = link.latency_s + padded / (2 * link.bandwidth_bytes_per_s * E)
    estimate = estimate_plan(plan)
    assert estimate.stages[0].sync_s == pytest.approx(2 * one_way_s, rel=1e-12)  # RS + AG
    owned = 0.6 * plan.model.stage_params(0, 14, tensor_parallel_degree=2)
    assert estimate.stages[0].optimizer_s == pytest.approx(
        optimizer_step_time_s(
            num_params=owned, device=TWO_H100_NODES.device_of(0), optimizer=plan.job.optimizer
        ),
        rel=1e-12,
    )


def test_data_parallel_groups_across_nodes_share_each_nic_t_ways() -> None:
    # Tensor groups (0, 1) on node 0 and (8, 9) on node 1: data-parallel groups (0, 8) and
    # (1, 9) both cross the nodes' NICs at once.
    plan = tp_plan(
        "gpt2", [tp_stage(layers=(0, 14), ranks=(0, 1, 8, 9), degree=2, num_micro_batches=2)]
    )
    link = TWO_H100_NODES.link_between(0, 8)
    shared_bandwidth = link.bandwidth_bytes_per_s / 2
    all_reduce_s = 2 * (link.latency_s + _slice_bytes(plan, 2) / (2 * shared_bandwidth * E))
    assert estimate_plan(plan).stages[0].sync_s == pytest.approx(all_reduce_s, rel=1e-12)


def test_in_flight_budgets_and_round_trips_count_tensor_groups() -> None:
    plan = two_node_plan("gpt2", cut=7, num_micro_batches=16)
    one_per_group = collapsed(plan)
    for index, stage in enumerate(plan.stages):
        budgets = stage_in_flight(plan, index)
        t = stage.tensor_parallel_degree
        assert budgets[::t] == stage_in_flight(one_per_group, index)
        assert all(budgets[i] == budgets[i - i % t] for i in range(len(budgets)))
    rounds = [[trip.rounds for trip in s.round_trips] for s in estimate_plan(plan).stages]
    assert rounds == [
        [trip.rounds for trip in s.round_trips] for s in estimate_plan(one_per_group).stages
    ]


@pytest.mark.parametrize("zero", [ZeroMode.NONE, ZeroMode.OPTIMIZER])
def test_a_tp2_rank_keeps_the_parameters_less_half_of_the_block_matmuls(zero: ZeroMode) -> None:
    model = load_model("llama-3-8b")
    arch = model.arch
    h, q, kv, f = arch.hidden_size, arch.q_width, arch.kv_width, arch.ffn_hidden_size
    matmul_per_block = 2 * h * q + 2 * h * kv + 3 * h * f  # Q and O, K and V, the MLP's three
    expected_ratio = (model.num_params - arch.num_blocks * matmul_per_block / 2) / model.num_params

    def one_stage(degree: int, num_groups: int) -> Plan:
        ranks = range(degree * num_groups)
        stage = tp_stage(
            layers=(0, model.num_layers),
            ranks=ranks,
            degree=degree,
            num_micro_batches=4 // num_groups,
            zero=zero,
        )
        return tp_plan(model, [stage])

    # What a group keeps whole (norms, embedding, head): its leader owns their sharded
    # state, its other members none of it (``runtime.distributed.group_layout``).
    whole = sum(layer.num_whole_params for layer in model.layers_at(2, TensorLayout.SEQUENCE))
    _, _, optimizer_bytes = bytes_per_param(dtype=Dtype.BF16, optimizer=Optimizer.ADAMW)
    for num_groups in (1, 2):
        plain = plan_rank_memory(
            one_stage(1, num_groups), stage_index=0, position=0, num_in_flight=1
        )
        leader, member = (
            plan_rank_memory(
                one_stage(2, num_groups), stage_index=0, position=position, num_in_flight=1
            )
            for position in (0, 1)
        )
        for part in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
            assert getattr(leader, part) == pytest.approx(
                expected_ratio * getattr(plain, part), rel=1e-9
            ), part
        assert member.weights_bytes == leader.weights_bytes
        assert member.gradients_bytes == leader.gradients_bytes
        owned = 2 / (2 * num_groups)  # a leader's share: its group's fractions
        replica_saves = whole * optimizer_bytes * owned if zero.shards_optimizer else 0.0
        assert member.optimizer_bytes == pytest.approx(
            leader.optimizer_bytes - replica_saves, rel=1e-9
        )
        assert member.total_bytes <= leader.total_bytes < plain.total_bytes
        # The estimate reports that memory for the rank (its budget: one in flight here).
        peaks = estimate_plan(one_stage(2, num_groups)).prediction().peak_memory_bytes
        assert peaks[1] < estimate_plan(one_stage(1, num_groups)).prediction().peak_memory_bytes[0]
