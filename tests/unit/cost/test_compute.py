"""Compute-time model: the roofline efficiency curve, layer passes and the optimizer step.

Every expected value is worked out by hand from the formulas in ``piebald.cost.compute``,
``piebald.specs.model`` and ``piebald.specs.layer_ops`` on a small architecture and a
made-up device with round numbers.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from piebald.cost.compute import (
    KERNEL_LAUNCH_S,
    EfficiencyCurve,
    PassWork,
    forward_work,
    layer_backward_time_s,
    layer_forward_time_s,
    optimizer_step_time_s,
)
from piebald.cost.pass_shape import PassShape
from piebald.specs.devices import (
    ATTENTION_SHARE_OF_MATMUL,
    MAX_BANDWIDTH_FRACTION,
    DeviceType,
    Dtype,
)
from piebald.specs.job import Optimizer
from piebald.specs.model import Family, LayerKind, LayerSpec, ModelArch, ModelSpec
from piebald.specs.recompute import Recompute

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
            recompute=Recompute.NONE,
        ),
        curve=curve,
    )


def _backward_s(layer: LayerSpec, *, recompute: Recompute) -> float:
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


def _work(**kwargs: float) -> PassWork:
    fields = {
        "matmul_flops": 0.0,
        "attention_flops": 0.0,
        "gemm_bytes": 0.0,
        "stream_bytes": 0.0,
        "kernels": 0.0,
    }
    return PassWork(**(fields | kwargs))


def test_compute_bound_gemms_hide_their_traffic() -> None:
    # 1e12 FLOPs at 0.5 x 1 TFLOP/s = 2 s; 1e9 bytes at 0.8 x 1 TB/s = 1.25 ms, hidden.
    time_s = CURVE.time_s(
        work=_work(matmul_flops=1e12, gemm_bytes=1e9), device=DEVICE, dtype=Dtype.BF16
    )
    assert time_s == pytest.approx(2.0 + 1e-5, rel=1e-12)


def test_memory_bound_gemms_take_their_traffic_time() -> None:
    # 1e9 FLOPs = 2 ms of math; 1e10 bytes at 0.8 TB/s = 12.5 ms.
    time_s = CURVE.time_s(
        work=_work(matmul_flops=1e9, gemm_bytes=1e10), device=DEVICE, dtype=Dtype.BF16
    )
    assert time_s == pytest.approx(0.0125 + 1e-5, rel=1e-12)


def test_attention_streams_and_launches_add_to_the_gemms() -> None:
    # GEMMs 1e9 / 0.5e12 = 2 ms; attention 1e9 FLOPs at the device's attention fraction
    # scaled like its GEMM fraction (default x 0.66 x 0.5 / default = 0.33 of 1 TFLOP/s);
    # 8e8 streamed bytes at 0.8 TB/s = 1 ms; 100 kernels x 4 us = 0.4 ms.
    attention_fraction = ATTENTION_SHARE_OF_MATMUL * 0.5
    assert CURVE.attention_fraction(DEVICE, Dtype.BF16) == pytest.approx(attention_fraction)
    time_s = CURVE.time_s(
        work=_work(matmul_flops=1e9, attention_flops=1e9, stream_bytes=8e8, kernels=100),
        device=DEVICE,
        dtype=Dtype.BF16,
    )
    expected = 2e-3 + 1e9 / (attention_fraction * 1e12) + 1e-3 + 100 * KERNEL_LAUNCH_S + 1e-5
    assert time_s == pytest.approx(expected, rel=1e-12)


def test_the_analytic_curve_takes_the_device_s_measured_efficiencies() -> None:
    measured = replace(DEVICE, matmul_efficiency=0.7, attention_efficiency=0.35)
    curve = EfficiencyCurve()  # the analytic default: no fractions of its own
    assert curve.matmul_fraction(measured, Dtype.BF16) == 0.7
    assert curve.attention_fraction(measured, Dtype.BF16) == 0.35
    time_s = curve.time_s(
        work=_work(matmul_flops=7e11, attention_flops=3.5e11), device=measured, dtype=Dtype.BF16
    )
    assert time_s == pytest.approx(1.0 + 1.0, rel=1e-12)


def test_no_work_takes_no_time() -> None:
    assert CURVE.time_s(work=_work(kernels=10), device=DEVICE, dtype=Dtype.BF16) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_fraction": 0.0},
        {"max_fraction": 1.5},
        {"bandwidth_fraction": 0.0},
        {"bandwidth_fraction": MAX_BANDWIDTH_FRACTION * 1.01},
        {"half_saturation_s": -1e-6},
        {"kernel_s": -1e-6},
    ],
)
def test_curve_rejects_out_of_range_numbers(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EfficiencyCurve(**kwargs)


# The block's forward per token (specs/layer_ops.py, h = q = 64, kv = 32, f = 128):
# GEMM and attention inputs and outputs (3h + q + 2kv) + (q + h) + (2h + 2f) + (f + h)
# + (2q + 2kv) = 1216 values; streamed: 2 x 20h = 2560 fp32 bytes, 2 x 2h + 10 (q + kv)
# + 6h + 5f = 2240 values, and 4h = 256 values cast to fp32 and back (D + 4 bytes each);
# 34 kernels and 8 casts.
BLOCK_GEMM_IO_VALUES = 1216
BLOCK_STREAM_BF16_BYTES = 2560 + 2240 * 2 + 256 * (2 + 4)  # 8576
BLOCK_STREAM_FP32_BYTES = 2560 + 2240 * 4  # 11520: no casts in fp32
BLOCK_KERNELS_BF16, BLOCK_KERNELS_FP32 = 42, 34
BLOCK_PARAMS = 36992  # 36864 matmul weights + two 64-wide norms
ATTENTION_FLOPS = 4 * 64 * (SEQ_LEN + 1) / 2 * TOKENS  # causal: (s + 1) / 2 positions


def _block_forward_by_hand(*, dtype: Dtype, peak: float, bandwidth: float) -> float:
    dtype_bytes = dtype.num_bytes
    stream = BLOCK_STREAM_BF16_BYTES if dtype_bytes == 2 else BLOCK_STREAM_FP32_BYTES
    kernels = BLOCK_KERNELS_BF16 if dtype_bytes == 2 else BLOCK_KERNELS_FP32
    gemm_s = 2 * 36864 * TOKENS / (0.5 * peak)
    traffic_s = (BLOCK_PARAMS + BLOCK_GEMM_IO_VALUES * TOKENS) * dtype_bytes / (0.8 * bandwidth)
    attention_s = ATTENTION_FLOPS / (CURVE.attention_fraction(DEVICE, dtype) * peak)
    stream_s = stream * TOKENS / (0.8 * bandwidth)
    return max(gemm_s, traffic_s) + attention_s + stream_s + kernels * KERNEL_LAUNCH_S + 1e-5


def test_layer_flops_follow_the_documented_formula() -> None:
    assert BLOCK.kind is LayerKind.BLOCK
    assert BLOCK.forward_flops_per_token(seq_len=SEQ_LEN) == BLOCK_FLOPS_PER_TOKEN == 81920
    assert HEAD.forward_flops_per_token(seq_len=SEQ_LEN) == HEAD_FLOPS_PER_TOKEN


@pytest.mark.parametrize("dtype", [Dtype.BF16, Dtype.FP32])
def test_block_forward_time_by_hand(dtype: Dtype) -> None:
    peak = 1e12 if dtype is Dtype.BF16 else 0.5e12
    expected = _block_forward_by_hand(dtype=dtype, peak=peak, bandwidth=1e12)
    assert _forward_s(BLOCK, dtype=dtype) == pytest.approx(expected, rel=1e-12)


def test_gemm_traffic_sets_the_time_on_a_slow_memory_device() -> None:
    slow = replace(DEVICE, name="slow-memory", memory_bandwidth_bytes_per_s=1e6)
    expected = _block_forward_by_hand(dtype=Dtype.BF16, peak=1e12, bandwidth=1e6)
    traffic_s = (BLOCK_PARAMS + BLOCK_GEMM_IO_VALUES * TOKENS) * 2 / 0.8e6
    assert traffic_s > 2 * 36864 * TOKENS / 0.5e12  # the traffic, not the math, bounds it
    assert _forward_s(BLOCK, device=slow) == pytest.approx(expected, rel=1e-12)


def test_embedding_lookup_is_a_memory_bound_gather() -> None:
    # No FLOPs: the int64 id and one 2h-value row per token, read and written (8 + 2h x 2
    # bytes), one kernel; backward moves twice that in twice the kernels.
    moved = (8 + 2 * 64 * 2) * TOKENS
    forward_s = moved / (DEVICE.memory_bandwidth_bytes_per_s * CURVE.bandwidth_fraction)
    assert EMBEDDING.forward_flops_per_token(seq_len=SEQ_LEN) == 0
    fixed_s = CURVE.half_saturation_s
    assert _forward_s(EMBEDDING) == pytest.approx(forward_s + KERNEL_LAUNCH_S + fixed_s)
    assert _backward_s(EMBEDDING, recompute=Recompute.FULL) == pytest.approx(
        2 * forward_s + 2 * KERNEL_LAUNCH_S + fixed_s
    )


@pytest.mark.parametrize("layer_name", ["block", "head"])
def test_backward_is_twice_the_forward_work(layer_name: str) -> None:
    layer = BLOCK if layer_name == "block" else HEAD
    shape = PassShape(
        device=DEVICE, dtype=Dtype.BF16, micro_batch_size=MICRO_BATCH, seq_len=SEQ_LEN,
        recompute=Recompute.NONE,
    )  # fmt: skip
    backward_s = _backward_s(layer, recompute=Recompute.NONE)
    # One pass of twice everything (2.5x the attention): one fixed constant, not two.
    work = forward_work(layer, shape=shape)
    backward = CURVE.time_s(work=work.backward(), device=DEVICE, dtype=Dtype.BF16)
    assert backward_s == pytest.approx(backward, rel=1e-12)
    attention_s = work.attention_flops / (CURVE.attention_fraction(DEVICE, Dtype.BF16) * 1e12)
    assert attention_s == (pytest.approx(ATTENTION_FLOPS / (0.33 * 1e12)) if layer is BLOCK else 0)
    assert backward_s == pytest.approx(2 * _forward_s(layer) - 1e-5 + 0.5 * attention_s)


@pytest.mark.parametrize(
    ("recompute", "weights", "gemm_io", "attention", "kernels"),
    [
        # All but the down projection (64 x 128) and the final add; the attention again.
        (Recompute.FULL, 36864 - 8192, BLOCK_GEMM_IO_VALUES - (128 + 64), True, 42 - 2),
        # K (64 x 32), O (64 x 64) and up (64 x 128) and the memory-bound ops but the final
        # add; Q, V, gate, down and the attention kernel are kept, not launched.
        (Recompute.SELECTIVE, 2048 + 4096 + 8192, (64 + 32) + (64 + 64) + (64 + 128), False, 36),
    ],
)
def test_recompute_adds_what_the_backward_runs_again(
    recompute: Recompute, weights: int, gemm_io: int, attention: bool, kernels: int
) -> None:
    """By hand: the block backward without recompute, plus the rerun priced on the same
    curve (``specs.layer_ops.block_reruns``)."""
    rerun = PassWork(
        matmul_flops=2 * weights * TOKENS,
        attention_flops=ATTENTION_FLOPS if attention else 0.0,
        gemm_bytes=(weights + gemm_io * TOKENS) * 2,
        stream_bytes=(BLOCK_STREAM_BF16_BYTES - 3 * 64 * 2) * TOKENS,  # no final add
        kernels=kernels,
    )
    backward_s = _backward_s(BLOCK, recompute=recompute)
    assert backward_s == pytest.approx(
        _backward_s(BLOCK, recompute=Recompute.NONE)
        + CURVE.time_s(work=rerun, device=DEVICE, dtype=Dtype.BF16),
        rel=1e-12,
    )
    assert _backward_s(BLOCK, recompute=Recompute.NONE) < backward_s


def test_recompute_does_not_touch_the_head() -> None:
    assert _backward_s(HEAD, recompute=Recompute.FULL) == _backward_s(
        HEAD, recompute=Recompute.NONE
    )


def test_forward_time_scales_with_tokens_when_there_is_no_fixed_time() -> None:
    no_constant = EfficiencyCurve(
        max_fraction=0.5, bandwidth_fraction=0.8, half_saturation_s=0, kernel_s=0
    )
    one = _forward_s(HEAD, micro_batch_size=1, curve=no_constant)
    four = _forward_s(HEAD, micro_batch_size=4, curve=no_constant)
    assert four == pytest.approx(4 * one, rel=1e-6)


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
