"""A rank's pass through a tensor-parallel stage against closed forms.

- A stage of one tensor group of t ranks: each micro-batch's pass on a rank is its slice's
  compute (``pass_times`` at degree t in the stage's layout) plus the block all-reduces, 2
  per block and pass, each the ring closed form 2 (t-1)(alpha + S/(t B E)) over the node's
  link with S the micro-batch's activation (b s h values in bf16), and sequence parallel
  half of one more each way (the output gathered, the input's gradient gathered); the step
  is the passes plus the optimizer step of the slice (a data-parallel group of one syncs
  nothing).
- The leader's broadcast of a received input is alpha per hop plus S / B on the node's link,
  in the forward of every stage but the first and the backward of every stage but the last.
- A block's compute at degree 2: exactly half of degree 1 on a device whose memory is free
  (GEMM and attention FLOPs split evenly), and within 12% of half on real GPUs, where the
  whole-width memory-bound kernels (norms, residual adds) and the kernel launches stay.
- A vocabulary-parallel layout adds an all-reduce of the micro-batch's activation in the
  forward of the stage holding the embedding and one in the backward of the stage holding
  the head; a sequence-parallel one half of one, each way, at either end (a reduce-scatter
  or an all-gather); ``blocks`` adds nothing.
"""

from __future__ import annotations

import dataclasses

import pytest

from piebald.cost.comm import BUS_EFFICIENCY
from piebald.cost.compute import EfficiencyCurve, optimizer_step_time_s
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.rank_pass import plan_rank_pass
from piebald.specs.devices import Dtype, builtin_catalog
from piebald.specs.model import LayerKind
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout
from tensor_plans import TWO_H100_NODES, tp_plan, tp_stage

SEQ_LEN = 1024


def _activation_bytes(plan_micro_batch: int, hidden: int) -> float:
    return plan_micro_batch * SEQ_LEN * hidden * Dtype.BF16.num_bytes


@pytest.mark.parametrize(
    ("layout", "edges"), [(TensorLayout.BLOCKS, 0.0), (TensorLayout.SEQUENCE, 0.5)]
)
@pytest.mark.parametrize("degree", [2, 4, 8])
def test_one_tensor_group_passes_are_slice_compute_plus_block_all_reduces(
    degree: int, layout: TensorLayout, edges: float
) -> None:
    model = load_model("llama-3-8b")
    m, size = 3, 2
    plan = tp_plan(
        model,
        [
            tp_stage(
                layers=(0, model.num_layers),
                ranks=range(degree),
                degree=degree,
                num_micro_batches=m,
                micro_batch_size=size,
                layout=layout,
            )
        ],
        seq_len=SEQ_LEN,
    )
    device = TWO_H100_NODES.device_of(0)
    shape = PassShape(
        device=device,
        dtype=Dtype.BF16,
        micro_batch_size=size,
        seq_len=SEQ_LEN,
        recompute=Recompute.NONE,
        tensor_parallel_degree=degree,
        tensor_layout=layout,
    )
    compute_s = pass_times(model, shape=shape).pass_s(0, model.num_layers)
    link = TWO_H100_NODES.link_between(0, 1)
    message = _activation_bytes(size, model.arch.hidden_size)
    all_reduce_s = (
        2
        * (degree - 1)
        * (link.latency_s + message / (degree * link.bandwidth_bytes_per_s * BUS_EFFICIENCY))
    )
    blocks = model.arch.num_blocks
    # Two per block, forward and backward, and the edges'.
    tensor_s = 2 * (blocks * 2 + edges) * all_reduce_s
    one = plan_rank_pass(plan, stage_index=0, position=degree - 1)
    assert one.pass_s == pytest.approx(compute_s + tensor_s, rel=1e-12)
    assert one.tensor.forward_s == pytest.approx(tensor_s / 2, rel=1e-12)
    estimate = estimate_plan(plan)
    for rank in range(degree):
        assert estimate.stages[0].compute_s[rank] == pytest.approx(
            m * (compute_s + tensor_s), rel=1e-12
        )
    slice_params = model.stage_params(0, model.num_layers, tensor_parallel_degree=degree)
    optimizer_s = optimizer_step_time_s(
        num_params=slice_params, device=device, optimizer=plan.job.optimizer
    )
    assert estimate.stages[0].sync_s == 0.0
    assert estimate.step_time_s == pytest.approx(m * (compute_s + tensor_s) + optimizer_s, rel=1e-9)


@pytest.mark.parametrize("degree", [2, 4])
def test_a_received_input_is_broadcast_inside_the_receiving_group(degree: int) -> None:
    model = load_model("gpt2")
    cut = 7
    plan = tp_plan(
        model,
        [
            tp_stage(layers=(0, cut), ranks=range(degree), degree=degree, num_micro_batches=2),
            tp_stage(
                layers=(cut, model.num_layers),
                ranks=range(8, 8 + degree),
                degree=degree,
                num_micro_batches=2,
            ),
        ],
        seq_len=SEQ_LEN,
    )
    link = TWO_H100_NODES.link_between(8, 9)
    broadcast_s = (degree - 1) * link.latency_s + _activation_bytes(
        1, model.arch.hidden_size
    ) / link.bandwidth_bytes_per_s
    first = plan_rank_pass(plan, stage_index=0, position=1)
    last = plan_rank_pass(plan, stage_index=1, position=0)
    # The first stage reads its rows on every member; the last one's gradient starts from
    # its own loss, whole on every member.
    assert first.broadcast_forward_s == 0.0
    assert first.broadcast_backward_s == pytest.approx(broadcast_s, rel=1e-12)
    assert last.broadcast_forward_s == pytest.approx(broadcast_s, rel=1e-12)
    assert last.broadcast_backward_s == 0.0
    assert last.forward_s == pytest.approx(
        last.compute_forward_s + last.tensor.forward_s + broadcast_s, rel=1e-12
    )


def _block_pass_s(model_name: str, device_name: str, degree: int, curve: EfficiencyCurve) -> float:
    model = load_model(model_name)
    device = builtin_catalog()[device_name]
    if curve.kernel_s == 0.0:  # the compute-only device: memory traffic costs nothing
        device = dataclasses.replace(device, memory_bandwidth_bytes_per_s=1e30)
    shape = PassShape(
        device=device,
        dtype=Dtype.BF16,
        micro_batch_size=2,
        seq_len=4096,
        recompute=Recompute.NONE,
        tensor_parallel_degree=degree,
    )
    block = next(i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK)
    return pass_times(model, shape=shape, curve=curve).pass_s(block, block + 1)


@pytest.mark.parametrize("device", ["A100-80GB", "H100-SXM"])
def test_a_block_at_degree_two_costs_about_half_per_rank(device: str) -> None:
    compute_only = EfficiencyCurve(kernel_s=0.0)
    exact = _block_pass_s("llama-3-70b", device, 2, compute_only)
    assert exact == pytest.approx(_block_pass_s("llama-3-70b", device, 1, compute_only) / 2)
    ratio = _block_pass_s("llama-3-70b", device, 2, EfficiencyCurve()) / _block_pass_s(
        "llama-3-70b", device, 1, EfficiencyCurve()
    )
    assert 0.5 < ratio < 0.5 * 1.12


@pytest.mark.parametrize(
    ("layout", "first_ends", "last_ends"),
    [
        # (forward, backward) all-reduces at the edges, first stage and last stage; an
        # all-gather or reduce-scatter is half of one
        (TensorLayout.BLOCKS, (0.0, 0.0), (0.0, 0.0)),
        (TensorLayout.VOCABULARY, (1.0, 0.0), (0.0, 1.0)),
        # the output gathered (forward), the input's gradient gathered (backward)
        (TensorLayout.SEQUENCE, (0.5, 0.5), (0.5, 0.5)),
        # ... and the embedding's reduce-scatter, the head's gradient's reduce-scatter
        (TensorLayout.VOCABULARY_SEQUENCE, (1.0, 0.5), (0.5, 1.0)),
    ],
)
def test_the_embedding_and_head_meet_their_group_as_the_layout_splits_them(
    layout: TensorLayout, first_ends: tuple[float, float], last_ends: tuple[float, float]
) -> None:
    model = load_model("gpt2")
    degree, cut, size = 4, 7, 2
    stages = [
        tp_stage(
            layers=layers,
            ranks=ranks,
            degree=degree,
            num_micro_batches=2,
            micro_batch_size=size,
            layout=layout,
        )
        for layers, ranks in (((0, cut), range(degree)), ((cut, model.num_layers), range(8, 12)))
    ]
    plan = tp_plan(model, stages, seq_len=SEQ_LEN)
    link = TWO_H100_NODES.link_between(0, 1)
    message = _activation_bytes(size, model.arch.hidden_size)
    all_reduce_s = (
        2
        * (degree - 1)
        * (link.latency_s + message / (degree * link.bandwidth_bytes_per_s * BUS_EFFICIENCY))
    )
    for index, (forward, backward) in enumerate((first_ends, last_ends)):
        start, end = stages[index].layer_start, stages[index].layer_end
        blocks_s = (
            2
            * all_reduce_s
            * sum(1 for layer in model.layers[start:end] if layer.kind is LayerKind.BLOCK)
        )
        one = plan_rank_pass(plan, stage_index=index, position=1)
        assert one.tensor.forward_s == pytest.approx(blocks_s + forward * all_reduce_s, rel=1e-12)
        assert one.tensor.backward_s == pytest.approx(blocks_s + backward * all_reduce_s, rel=1e-12)
