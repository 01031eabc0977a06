"""Memory model of one rank: bytes per parameter, ZeRO sharding, activations in flight.

Expected bytes are worked out by hand for a small Llama-style model from the accounting in
the docstring of ``piebald.cost.memory`` (Megatron distributed optimizer, ZeRO stages,
Korthikanti et al. activation bytes).
"""

from __future__ import annotations

import dataclasses

import pytest

from piebald.cost.memory import (
    GIB,
    RECEIVES_POSTED,
    STEP_CHUNK_ELEMENTS,
    MemoryBreakdown,
    adamw_temporary_elements,
    bytes_per_param,
    framework_reserve_bytes,
    rank_memory,
)
from piebald.cost.pass_shape import PassShape
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import Optimizer
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.recompute import Recompute

DEVICE = DeviceType(
    name="round",
    memory_bytes=100e9,
    bf16_flops=1e12,
    fp16_flops=1e12,
    fp32_flops=0.5e12,
    memory_bandwidth_bytes_per_s=1e12,
)
RESERVE = GIB + 0.05 * 100e9  # 1 GiB of context plus 5% of capacity

# h = 64, q width 64, kv width 32, f = 128, a = 4 heads, V = 100; layers: emb, 2 blocks, head.
MODEL = ModelSpec(
    name="hand",
    arch=ModelArch(
        family=Family.LLAMA,
        num_blocks=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=128,
        vocab_size=100,
        max_seq_len=64,
        tie_embeddings=False,
    ),
)
BLOCK_PARAMS = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64  # 36992
TWO_BLOCKS = 2 * BLOCK_PARAMS  # layers [1, 3)
# Kept per token (docs/activation_bytes.md): fp32/int64 bytes + values x dtype bytes.
BLOCK_FIXED = 8 * 64 + 4 * 4 + 8  # two fp32 norm inputs and rstds, log-sum-exp: 536
BLOCK_VALUES = 4 * 64 + 2 * 64 + 2 * 32 + 4 * 128  # norms, q/k/v/out, SwiGLU: 960
BLOCK_BF16 = BLOCK_FIXED + 2 * BLOCK_VALUES  # 2456
HEAD_BF16 = (4 * 64 + 4 + 4 * 100 + 8) + 2 * 2 * 64  # norm, fp32 log-softmax, labels: 924
MLP_BACKWARD = 2 * 128 * 64 * 2  # two [tokens, f] bf16 gradients in a block's backward
# A middle stage's boundary tensor, [tokens, h] in bf16: its input (a received leaf) and
# its output (the backward's root) per micro-batch in flight, and one gradient on its way
# back to the previous stage among the working buffers.
BOUNDARY = 64 * 64 * 2
LOSS_BACKWARD = 8 * 100 * 64  # two [tokens, V] fp32 gradients in the loss's backward


def _blocks_memory(
    *,
    zero: ZeroMode = ZeroMode.NONE,
    shard_fraction: float = 1.0,
    dtype: Dtype = Dtype.BF16,
    optimizer: Optimizer = Optimizer.ADAMW,
    micro_batch_size: int = 2,
    seq_len: int = 32,
    num_in_flight: int = 3,
    recompute: Recompute = Recompute.NONE,
    num_neighbor_stages: int = 0,
    layer_start: int = 1,
    layer_end: int = 3,
    wire_dtype: Dtype | None = None,
    group_shares: tuple[float, ...] | None = None,
    receive_share: float | None = None,
) -> MemoryBreakdown:
    return rank_memory(
        MODEL,
        layer_start=layer_start,
        layer_end=layer_end,
        shape=PassShape(
            device=DEVICE,
            dtype=dtype,
            micro_batch_size=micro_batch_size,
            seq_len=seq_len,
            recompute=recompute,
        ),
        optimizer=optimizer,
        zero=zero,
        shard_fraction=shard_fraction,
        num_in_flight=num_in_flight,
        num_neighbor_stages=num_neighbor_stages,
        wire_dtype=wire_dtype,
        group_shares=group_shares,
        receive_share=receive_share,
    )


@pytest.mark.parametrize(
    ("dtype", "optimizer", "expected"),
    [
        (Dtype.BF16, Optimizer.ADAMW, (2, 4, 12)),
        (Dtype.FP16, Optimizer.ADAMW, (2, 4, 12)),
        (Dtype.FP32, Optimizer.ADAMW, (4, 4, 8)),
        (Dtype.BF16, Optimizer.SGD, (2, 4, 4)),
        (Dtype.FP32, Optimizer.SGD, (4, 4, 0)),
    ],
)
def test_bytes_per_param_table(
    dtype: Dtype, optimizer: Optimizer, expected: tuple[int, int, int]
) -> None:
    assert bytes_per_param(dtype=dtype, optimizer=optimizer) == expected


def test_framework_reserve_is_one_gib_plus_five_percent() -> None:
    assert framework_reserve_bytes(DEVICE) == pytest.approx(2**30 + 5e9, rel=1e-12)


def test_model_parameter_counts_used_below() -> None:
    assert MODEL.stage_params(1, 3) == TWO_BLOCKS == 73984
    assert MODEL.layers[1].activation_bytes_per_token(dtype_bytes=2) == BLOCK_BF16


# Per ZeRO mode: (weights, gradients, optimizer) divisors, the working buffers during the
# passes, and those at the step's end, for a shard fraction of 1/4, 16-bit compute and a
# 16-bit wire. The largest layer here is one block of L = 36992 parameters, which is also
# the step's chunk.
L = 36992
# The step's reduce-scatter rounds (unknown group: an even pair): a wire buffer and a
# receive buffer of one chunk, and the rank's sum of its part (half a chunk).
REDUCE_ROUNDS = 2.5 * L * 2
# A layer's reduce-scatter during the passes (ZeRO-2/3, even pair): the wire buffer, what
# the rank receives (2 ranks x half) and its sum (half): 2.5 layers.
PASS_REDUCE = 2.5 * L * 2
_ZERO_CASES = {
    # during the passes, a block's MLP backward; at the step's end the reduce-scatter or
    # AdamW's fp32 temporaries: replicated, the rank steps both blocks in two chunks (a
    # chunk's sqrt(v) and quotient beside the previous chunk's quotient)
    ZeroMode.NONE: ((1, 1, 1), MLP_BACKWARD + BOUNDARY, max(REDUCE_ROUNDS, 3 * L * 4)),
    # sharded, a quarter of the stage (half a chunk): its sqrt(v) and quotient
    ZeroMode.OPTIMIZER: (
        (1, 1, 0.25),
        MLP_BACKWARD + BOUNDARY,
        max(REDUCE_ROUNDS, 2 * (L / 2) * 4),
    ),
    # reducing a block's gradient right after its backward outweighs its MLP backward;
    # one bucket per layer, a quarter of each stepped
    ZeroMode.GRADIENTS: (
        (1, 0.25, 0.25),
        max(MLP_BACKWARD, PASS_REDUCE) + BOUNDARY,
        2 * (L / 4) * 4,
    ),
    # no 16-bit weights at rest (the fp32 master shard is the copy); computing holds two
    # gathered blocks in 16 bits, reducing one gathered block and the reduce-scatter buffers
    ZeroMode.FULL: (
        (0, 0.25, 0.25),
        max(2 * L * 2 + MLP_BACKWARD, L * 2 + PASS_REDUCE) + BOUNDARY,
        2 * (L / 4) * 4,
    ),
}


@pytest.mark.parametrize("zero", list(ZeroMode))
def test_state_and_working_bytes_per_zero_mode(zero: ZeroMode) -> None:
    (weight_f, grad_f, optim_f), passes, step_end = _ZERO_CASES[zero]
    memory = _blocks_memory(zero=zero, shard_fraction=0.25)
    assert memory.weights_bytes == pytest.approx(73984 * 2 * weight_f, rel=1e-12)
    assert memory.gradients_bytes == pytest.approx(73984 * 4 * grad_f, rel=1e-12)
    assert memory.optimizer_bytes == pytest.approx(73984 * 12 * optim_f, rel=1e-12)
    assert memory.pass_working_bytes == pytest.approx(passes, rel=1e-12)
    assert memory.step_end_bytes == pytest.approx(step_end, rel=1e-12)
    assert memory.reserve_bytes == pytest.approx(RESERVE, rel=1e-12)
    # 3 micro-batches in flight x 64 tokens x 2 blocks; layer-by-layer passes (ZeRO-2/3)
    # also keep the 16-bit output of the first block for its backward (64 x h x 2 bytes).
    islands = 3 * 64 * 64 * 2 if zero.per_pass else 0
    ends = 3 * 2 * BOUNDARY  # each micro-batch's input and output
    assert memory.activations_bytes == pytest.approx(
        3 * 64 * 2 * BLOCK_BF16 + islands + ends, rel=1e-12
    )
    assert memory.state_bytes == pytest.approx(
        memory.weights_bytes + memory.gradients_bytes + memory.optimizer_bytes
    )
    # The step's end comes after the passes: the larger of the two is the peak's.
    assert memory.working_bytes == pytest.approx(max(passes, step_end), rel=1e-12)
    assert memory.total_bytes == pytest.approx(
        memory.state_bytes + memory.activations_bytes + memory.working_bytes + RESERVE,
        rel=1e-12,
    )


def test_the_peak_puts_the_step_end_beside_the_state_alone() -> None:
    """At the step's end no activations are left: the peak is the larger of the two
    moments, which ``total_bytes`` (affine in the micro-batches in flight) bounds."""
    for in_flight in (0, 1, 3):
        memory = _blocks_memory(num_in_flight=in_flight)
        passes = memory.activations_bytes + memory.pass_working_bytes
        assert memory.peak_bytes == pytest.approx(
            memory.state_bytes + max(passes, memory.step_end_bytes) + RESERVE, rel=1e-12
        )
        assert memory.peak_bytes <= memory.total_bytes
    # With none in flight the step end is the larger moment here, and both agree.
    empty = _blocks_memory(num_in_flight=0)
    assert empty.step_end_bytes > empty.pass_working_bytes
    assert empty.peak_bytes == pytest.approx(empty.total_bytes, rel=1e-12)


@pytest.mark.parametrize("share", [0.25, 0.5, 0.75])
def test_a_layer_reduce_scatter_receives_group_size_times_the_share(share: float) -> None:
    """ZeRO-2: reducing a block, the rank holds the block's wire buffer, what it receives
    (2 ranks x ``share`` of the block) and its sum (``share``); even shares by default."""
    base = _blocks_memory(zero=ZeroMode.GRADIENTS, shard_fraction=share)
    memory = _blocks_memory(
        zero=ZeroMode.GRADIENTS,
        shard_fraction=share,
        group_shares=(share, 1 - share),
        receive_share=share,
    )
    reducing = (1 + 3 * share) * L * 2
    assert memory.pass_working_bytes == pytest.approx(
        max(MLP_BACKWARD, reducing) + BOUNDARY, rel=1e-12
    )
    assert base.pass_working_bytes == pytest.approx(
        max(MLP_BACKWARD, PASS_REDUCE) + BOUNDARY, rel=1e-12
    )


def test_mixed_dtype_group_prices_its_fp32_wire() -> None:
    """A bf16 rank in a group that also holds fp16 ranks reduces and gathers through fp32
    buffers (cost.precision): ZeRO-3's working bytes grow by them."""
    same = _blocks_memory(zero=ZeroMode.FULL, shard_fraction=0.25)
    mixed = _blocks_memory(zero=ZeroMode.FULL, shard_fraction=0.25, wire_dtype=Dtype.FP32)
    # Reducing a layer is the larger moment either way: the reduce-scatter buffers (2.5
    # layers) at 4 bytes instead of 2, and the gathered layer's fp32 wire buffer.
    extra = 2.5 * L * (4 - 2) + L * 4
    assert mixed.pass_working_bytes - same.pass_working_bytes == pytest.approx(extra, rel=1e-12)


def test_the_tied_weight_lives_in_its_own_zero1_buffer() -> None:
    """A stage holding the tied embedding but not the head (a multi-stage plan): the weight
    sits in the tied group's buffer (weights and gradient whole, optimizer state sharded
    half by the stage's fraction), whatever the stage's ZeRO mode."""
    tied_model = ModelSpec(
        name="hand-tied", arch=dataclasses.replace(MODEL.arch, tie_embeddings=True)
    )
    table = 100 * 64  # V x h
    memory = rank_memory(
        tied_model,
        layer_start=0,
        layer_end=2,
        shape=PassShape(
            device=DEVICE,
            dtype=Dtype.BF16,
            micro_batch_size=2,
            seq_len=32,
            recompute=Recompute.NONE,
        ),
        optimizer=Optimizer.ADAMW,
        zero=ZeroMode.FULL,
        shard_fraction=0.25,
        num_in_flight=3,
        num_neighbor_stages=1,
    )
    block = BLOCK_PARAMS
    assert memory.weights_bytes == pytest.approx(table * 2, rel=1e-12)
    assert memory.gradients_bytes == pytest.approx(block * 4 * 0.25 + table * 4, rel=1e-12)
    assert memory.optimizer_bytes == pytest.approx(
        block * 12 * 0.25 + table * 12 * 0.5 * 0.25, rel=1e-12
    )


def test_fp32_zero3_keeps_its_master_shard_as_the_weights() -> None:
    memory = _blocks_memory(zero=ZeroMode.FULL, shard_fraction=0.25, dtype=Dtype.FP32)
    assert memory.weights_bytes == pytest.approx(73984 * 4 * 0.25, rel=1e-12)
    assert memory.optimizer_bytes == pytest.approx(73984 * 8 * 0.25, rel=1e-12)


def test_zero_modes_never_increase_state_memory() -> None:
    states = [_blocks_memory(zero=zero, shard_fraction=0.25).state_bytes for zero in ZeroMode]
    assert states == sorted(states, reverse=True)
    assert states[0] > states[-1]


def test_fp32_sgd_state_and_activations() -> None:
    memory = _blocks_memory(
        zero=ZeroMode.OPTIMIZER, shard_fraction=0.5, dtype=Dtype.FP32, optimizer=Optimizer.SGD
    )
    assert memory.weights_bytes == pytest.approx(73984 * 4)
    assert memory.gradients_bytes == pytest.approx(73984 * 4)
    assert memory.optimizer_bytes == 0.0
    # fp32 doubles the values kept in the training dtype, not the fp32 ones.
    fp32_block = BLOCK_FIXED + 4 * BLOCK_VALUES
    ends = 3 * 2 * 2 * BOUNDARY  # each micro-batch's input and output, in fp32
    assert memory.activations_bytes == pytest.approx(3 * 64 * 2 * fp32_block + ends, rel=1e-12)


@pytest.mark.parametrize(
    ("change", "factor"),
    [({"num_in_flight": 6}, 2), ({"micro_batch_size": 8}, 4), ({"seq_len": 64}, 2)],
)
def test_activations_scale_linearly(change: dict[str, int], factor: int) -> None:
    base = _blocks_memory().activations_bytes
    assert _blocks_memory(**change).activations_bytes == pytest.approx(factor * base, rel=1e-12)


def _adamw_loop_peak(stepped: int, chunk: int) -> int:
    """Torch's single-tensor AdamW over ``stepped`` elements in chunks, followed step by
    step: each chunk makes sqrt(v), then its quotient (after which sqrt(v) dies), while
    the previous chunk's quotient lives on in the loop's variable until replaced."""
    peak, previous = 0, 0
    for start in range(0, stepped, chunk):
        size = min(chunk, stepped - start)
        peak = max(peak, previous + 2 * size)
        previous = size
    return peak


@pytest.mark.parametrize(
    ("stepped", "chunk"), [(1, 7), (7, 7), (8, 7), (10, 7), (14, 7), (15, 7), (100, 7), (3, 1)]
)
def test_adamw_temporaries_follow_the_loop(stepped: int, chunk: int) -> None:
    assert adamw_temporary_elements(stepped_numel=stepped, chunk_numel=chunk) == _adamw_loop_peak(
        stepped, chunk
    )


def _step_end(layer_start: int = 1, layer_end: int = 3) -> float:
    """The step's-end buffers of a replicated stage: the larger of the reduce-scatter's
    rounds (two and a half of its largest layer in 16 bits) and AdamW's fp32 temporaries
    over the whole stage in chunks of that layer; ``STEP_CHUNK_ELEMENTS`` is far above
    these layers."""
    largest = max(layer.num_params for layer in MODEL.layers[layer_start:layer_end])
    assert largest < STEP_CHUNK_ELEMENTS
    stepped = MODEL.stage_params(layer_start, layer_end)
    return max(2.5 * largest * 2, 4.0 * _adamw_loop_peak(stepped, largest))


def test_recompute_keeps_only_each_block_input() -> None:
    memory = _blocks_memory(recompute=Recompute.FULL)
    # 2h = 128 bytes per token per block stay, beside the stage's input and output and the
    # fp32 RoPE tables the checkpoints keep ([s, head_dim] cos and sin, head_dim 16); one
    # block's full activations are rebuilt.
    rope = 32 * 2 * 4 * 16
    assert memory.activations_bytes == pytest.approx(
        3 * (64 * 2 * 128 + 2 * BOUNDARY + rope), rel=1e-12
    )
    recomputed = 64 * BLOCK_BF16 + MLP_BACKWARD  # and its MLP's backward
    assert memory.working_bytes == pytest.approx(max(recomputed + BOUNDARY, _step_end()), rel=1e-12)
    assert memory.activations_bytes < _blocks_memory(recompute=Recompute.NONE).activations_bytes


def test_recompute_does_not_shrink_the_head() -> None:
    # Layers [3, 4): the head alone keeps the same bytes per token either way.
    for recompute in (Recompute.NONE, Recompute.FULL):
        memory = _blocks_memory(layer_start=3, layer_end=4, recompute=recompute)
        # and its input (the last stage sends no output on)
        assert memory.activations_bytes == pytest.approx(3 * (64 * HEAD_BF16 + BOUNDARY), rel=1e-12)
        assert memory.working_bytes == pytest.approx(
            max(LOSS_BACKWARD + BOUNDARY, _step_end(3, 4)), rel=1e-12
        )


@pytest.mark.parametrize("neighbors", [0, 1, 2])
def test_stage_boundary_buffers(neighbors: int) -> None:
    memory = _blocks_memory(num_neighbor_stages=neighbors)
    # A buffer holds a micro-batch's activations, 64 tokens x h x 2 B: per neighbouring
    # stage, the RECEIVES_POSTED receives posted from it, and a gradient sent back (the
    # range does not start at the embedding).
    buffers = neighbors * RECEIVES_POSTED + 1
    assert memory.working_bytes == pytest.approx(
        max(buffers * 64 * 64 * 2 + MLP_BACKWARD, _step_end()), rel=1e-12
    )


def test_no_micro_batches_in_flight_no_activations() -> None:
    assert _blocks_memory(num_in_flight=0).activations_bytes == 0.0
