"""Compute-time model: the roofline efficiency curve, layer passes and the optimizer step.

Every expected value is worked out by hand from the formulas in ``piebald.cost.compute``
and ``piebald.specs.model`` on a small architecture and a made-up device with round numbers.
"""

from __future__ import annotations

import pytest

from piebald.cost.compute import (
    EfficiencyCurve,
    layer_backward_time_s,
    layer_forward_time_s,
    optimizer_step_time_s,
)
from piebald.cost.pass_shape import PassShape
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import Optimizer
from piebald.specs.model import Family, LayerKind, LayerSpec, ModelArch, ModelSpec

# A made-up GPU with round numbers: 1 TFLOP/s bf16, 0.5 TFLOP/s fp32, 1 TB/s of HBM.
DEVICE = DeviceType(
    name="round",
    memory_bytes=100e9,
    bf16_flops=1e12,
    fp16_flops=1e12,
    fp32_flops=0.5e12,
    memory_bandwidth_bytes_per_s=1e12,
)
CURVE = EfficiencyCurve(max_fraction=0.5, bandwidth_fraction=0.8, half_saturation_s=1e-5)

# h = 64, 4 query heads of 16, 2 kv heads of 16 (kv width 32), f = 128, V = 100.
ARCH = ModelArch(
    family=Family.LLAMA,
    num_blocks=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    ffn_hidden_size=128,
    vocab_size=100,
    max_seq_len=64,
    tie_embeddings=False,
)
MODEL = ModelSpec(name="hand", arch=ARCH)
EMBEDDING, BLOCK, _, HEAD = MODEL.layers
SEQ_LEN = 32
MICRO_BATCH = 2
TOKENS = MICRO_BATCH * SEQ_LEN  # 64

# Block matmul weights: Q and O (2 h q_width) + K and V (2 h kv_width) + gate/up/down (3 h f).
BLOCK_WEIGHTS = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128  # 8192 + 4096 + 24576 = 36864
BLOCK_FLOPS_PER_TOKEN = 2 * BLOCK_WEIGHTS + 4 * SEQ_LEN * 64  # 73728 + 8192 = 81920
HEAD_FLOPS_PER_TOKEN = 2 * 100 * 64  # 12800: the LM head matmul, no attention


def _forward_s(
    layer: LayerSpec,
    *,
    device: DeviceType = DEVICE,
    dtype: Dtype = Dtype.BF16,
    micro_batch_size: int = MICRO_BATCH,
    curve: EfficiencyCurve = CURVE,
) -> float:
    return layer_forward_time_s(
        layer,
        shape=PassShape(
            device=device,
            dtype=dtype,
            micro_batch_size=micro_batch_size,
            seq_len=SEQ_LEN,
            recompute=False,
        ),
        curve=curve,
    )


def _backward_s(layer: LayerSpec, *, recompute: bool) -> float:
    return layer_backward_time_s(
        layer,
        shape=PassShape(
            device=DEVICE,
            dtype=Dtype.BF16,
            micro_batch_size=MICRO_BATCH,
            seq_len=SEQ_LEN,
            recompute=recompute,
        ),
        curve=CURVE,
    )


def test_compute_bound_time_is_flops_over_sustained_peak_plus_constant() -> None:
    # 1e12 FLOPs at 0.5 x 100 TFLOP/s = 0.02 s; 1e9 bytes at 0.8 x 1 TB/s = 1.25 ms.
    time_s = CURVE.time_s(
        flops=1e12, num_bytes=1e9, peak_flops=100e12, memory_bandwidth_bytes_per_s=1e12
    )
    assert time_s == pytest.approx(0.02 + 1e-5, rel=1e-12)


def test_memory_bound_time_is_bytes_over_sustained_bandwidth_plus_constant() -> None:
    # 1e9 FLOPs = 20 us of compute; 1e10 bytes at 0.8 TB/s = 12.5 ms.
    time_s = CURVE.time_s(
        flops=1e9, num_bytes=1e10, peak_flops=100e12, memory_bandwidth_bytes_per_s=1e12
    )
    assert time_s == pytest.approx(0.0125 + 1e-5, rel=1e-12)


def test_no_work_takes_no_time() -> None:
    assert (
        CURVE.time_s(flops=0, num_bytes=0, peak_flops=1e12, memory_bandwidth_bytes_per_s=1e12) == 0
    )


def test_efficiency_rises_with_work_towards_max_fraction() -> None:
    peak = 100e12
    w_half = peak * CURVE.max_fraction * CURVE.half_saturation_s  # 5e8 FLOPs
    efficiencies = []
    for flops in (1e6, 1e8, w_half, 1e10, 1e12, 1e14):
        time_s = CURVE.time_s(
            flops=flops, num_bytes=0, peak_flops=peak, memory_bandwidth_bytes_per_s=1e12
        )
        efficiency = flops / (time_s * peak)
        # Closed form of the docstring: max_fraction * w / (w + w_half).
        assert efficiency == pytest.approx(0.5 * flops / (flops + w_half), rel=1e-9)
        efficiencies.append(efficiency)
    assert efficiencies == sorted(efficiencies)
    assert efficiencies[2] == pytest.approx(0.25)  # half of max_fraction at w_half
    assert 0.5 * 0.999 < efficiencies[-1] < 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_fraction": 0.0},
        {"max_fraction": 1.5},
        {"bandwidth_fraction": 0.0},
        {"bandwidth_fraction": 1.01},
        {"half_saturation_s": -1e-6},
    ],
)
def test_curve_rejects_out_of_range_numbers(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EfficiencyCurve(**kwargs)


def test_layer_flops_follow_the_documented_formula() -> None:
    assert BLOCK.kind is LayerKind.BLOCK
    assert BLOCK.forward_flops_per_token(seq_len=SEQ_LEN) == BLOCK_FLOPS_PER_TOKEN == 81920
    assert HEAD.forward_flops_per_token(seq_len=SEQ_LEN) == HEAD_FLOPS_PER_TOKEN


def test_block_forward_time_by_hand() -> None:
    # 81920 FLOPs/token x 64 tokens = 5242880 FLOPs at 0.5 x 1 TFLOP/s = 10.48576 us.
    # Bytes: 36992 params x 2 + 1936 activation bytes/token x 64 = 197888 B -> 0.25 us.
    compute_s = 81920 * 64 / (0.5 * 1e12)
    time_s = _forward_s(BLOCK)
    assert compute_s == pytest.approx(10.48576e-6)
    assert time_s == pytest.approx(compute_s + 1e-5, rel=1e-12)


def test_block_forward_in_fp32_uses_the_fp32_peak() -> None:
    time_s = _forward_s(BLOCK, dtype=Dtype.FP32)
    assert time_s == pytest.approx(81920 * 64 / (0.5 * 0.5e12) + 1e-5, rel=1e-12)


def test_forward_bytes_set_the_time_on_a_slow_memory_device() -> None:
    slow = DeviceType(
        name="slow-memory",
        memory_bytes=1e9,
        bf16_flops=1e15,
        fp16_flops=1e15,
        fp32_flops=1e15,
        memory_bandwidth_bytes_per_s=1e6,
    )
    # Weights read once (Llama block: 36864 matmul + 2 x 64 norm = 36992 params, 2 B each)
    # plus the activations written once, what the block keeps for its backward in 16 bits:
    # 8h + 4a + 8 fp32 bytes and 4h + 2q + 2kv + 4f values (= 2456 B/token).
    kept = (8 * 64 + 4 * 4 + 8) + 2 * (4 * 64 + 2 * 64 + 2 * 32 + 4 * 128)
    assert kept == 2456
    num_bytes = 36992 * 2 + kept * TOKENS
    time_s = _forward_s(BLOCK, device=slow)
    assert time_s == pytest.approx(num_bytes / (0.8 * 1e6) + 1e-5, rel=1e-12)


def test_embedding_lookup_is_a_memory_bound_gather() -> None:
    # No FLOPs: it reads one 2h-byte row per token and writes it out, at the memory
    # bandwidth's sustained fraction, plus the launch constant; backward moves twice that.
    moved = 2 * EMBEDDING.output_bytes_per_token * TOKENS
    forward_s = moved / (DEVICE.memory_bandwidth_bytes_per_s * CURVE.bandwidth_fraction)
    assert EMBEDDING.forward_flops_per_token(seq_len=SEQ_LEN) == 0
    assert _forward_s(EMBEDDING) == pytest.approx(forward_s + CURVE.half_saturation_s)
    assert _backward_s(EMBEDDING, recompute=True) == pytest.approx(
        2 * forward_s + CURVE.half_saturation_s
    )


@pytest.mark.parametrize("layer_name", ["block", "head"])
def test_backward_is_twice_the_forward_work(layer_name: str) -> None:
    layer = BLOCK if layer_name == "block" else HEAD
    flops_per_token = BLOCK_FLOPS_PER_TOKEN if layer_name == "block" else HEAD_FLOPS_PER_TOKEN
    compute_s = flops_per_token * TOKENS / (0.5 * 1e12)
    backward_s = _backward_s(layer, recompute=False)
    # One pass of twice the FLOPs: one launch constant, not two.
    assert backward_s == pytest.approx(2 * compute_s + 1e-5, rel=1e-12)


def test_recompute_adds_one_forward_to_a_block_backward() -> None:
    compute_s = BLOCK_FLOPS_PER_TOKEN * TOKENS / (0.5 * 1e12)
    backward_s = _backward_s(BLOCK, recompute=True)
    assert backward_s == pytest.approx((2 * compute_s + 1e-5) + (compute_s + 1e-5), rel=1e-12)


def test_recompute_does_not_touch_the_head() -> None:
    with_recompute = _backward_s(HEAD, recompute=True)
    assert with_recompute == _backward_s(HEAD, recompute=False)
    assert with_recompute == pytest.approx(2 * 12800 * 64 / 0.5e12 + 1e-5, rel=1e-12)


def test_forward_time_scales_with_tokens_when_compute_bound() -> None:
    no_constant = EfficiencyCurve(max_fraction=0.5, bandwidth_fraction=0.8, half_saturation_s=0)
    one = _forward_s(BLOCK, micro_batch_size=1, curve=no_constant)
    four = _forward_s(BLOCK, micro_batch_size=4, curve=no_constant)
    assert four == pytest.approx(4 * one, rel=1e-12)


@pytest.mark.parametrize(
    ("optimizer", "bytes_per_param"), [(Optimizer.ADAMW, 30), (Optimizer.SGD, 14)]
)
def test_optimizer_step_streams_its_bytes_per_param(
    optimizer: Optimizer, bytes_per_param: int
) -> None:
    # 1e6 params x bytes/param at 0.8 x 1 TB/s: AdamW 37.5 us, SGD 17.5 us; no launch constant.
    time_s = optimizer_step_time_s(num_params=1e6, device=DEVICE, optimizer=optimizer, curve=CURVE)
    assert time_s == pytest.approx(1e6 * bytes_per_param / 0.8e12, rel=1e-12)
    expected_us = {Optimizer.ADAMW: 37.5, Optimizer.SGD: 17.5}[optimizer]
    assert time_s == pytest.approx(expected_us * 1e-6, rel=1e-12)


def test_optimizer_step_of_nothing_is_free() -> None:
    assert optimizer_step_time_s(num_params=0, device=DEVICE, optimizer=Optimizer.ADAMW) == 0.0
