"""The relative speed of GPU types, as the cost model sees them: what the layer split follows.

A heterogeneous plan gives each GPU type layers in proportion to how fast it runs them, so
the ratio of two types' predicted speeds matters more than either speed. For one model
(default llama-3-8b, sequence 2048, micro-batch 1, no recompute) this prints, per catalog
GPU, the dtype it trains in, its dense peak, the sustained fractions the catalog gives it,
its predicted tokens/s -- the planner's standalone throughput of one GPU
(``planner.bounds``): one forward and backward through the whole model, no communication,
0 where a layer's activations do not fit -- and its speed relative to an A100-80GB, beside
the published per-GPU throughput ratios of benchmarks/published.yaml where both GPU types
trained the same model the same way.

    .venv/bin/python benchmarks/gpu_speeds.py [--model llama-3-8b] [--seq-len 2048]
        [--micro-batch-size 1]
"""

from __future__ import annotations

import argparse
import sys

from piebald.planner.bounds import gpu_upper_bound_tokens_per_s
from piebald.specs.devices import Dtype, builtin_catalog
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model
from published_points import catalog_gpu_name, load_points

REFERENCE = "A100-80GB"
# Pairs of published points that trained one model the same way on two GPU types:
# (label, faster point, slower point).
PUBLISHED_PAIRS = (
    ("llama-3-8b, torchtitan FSDP", "tt-8b-8gpu-fsdp-eager", "tt-a100-8b-64gpu-fsdp"),
    ("MPT-7b, llm-foundry FSDP", "mpt-7b-8xh100", "mpt-7b-8xa100-80"),
    ("MPT-13b, llm-foundry FSDP", "mpt-13b-8xh100", "mpt-13b-8xa100-80"),
)


def tokens_per_s(gpu: str, *, model_name: str, seq_len: int, micro_batch_size: int) -> float:
    """The planner's standalone throughput of one GPU (``planner.bounds``) over micro-batches
    up to ``micro_batch_size``: one forward and backward through the whole model."""
    job = JobSpec(global_batch_size=micro_batch_size, seq_len=seq_len)
    return gpu_upper_bound_tokens_per_s(
        builtin_catalog()[gpu], model=load_model(model_name), job=job
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument(
        "--micro-batch-size", type=int, default=1, help="the largest micro-batch to try"
    )
    args = parser.parse_args(argv)
    speeds = {
        gpu: tokens_per_s(
            gpu,
            model_name=args.model,
            seq_len=args.seq_len,
            micro_batch_size=args.micro_batch_size,
        )
        for gpu in builtin_catalog()
    }
    reference = speeds[REFERENCE]
    print(
        f"{args.model}, sequence {args.seq_len}, micro-batch {args.micro_batch_size}, "
        "bf16 where supported (else fp16, else fp32), one GPU, compute only:\n"
    )
    print(
        "| GPU | dtype | dense peak TFLOP/s | GEMM fraction | attention fraction | "
        f"predicted tokens/s | vs {REFERENCE} |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for gpu, speed in sorted(speeds.items(), key=lambda item: -item[1]):
        device = builtin_catalog()[gpu]
        dtype = device.training_dtype(Dtype.BF16)
        print(
            f"| {gpu} | {dtype.value} | {device.peak_flops(dtype) / 1e12:,.1f} | "
            f"{device.sustained_matmul_efficiency(dtype):.2f} | "
            f"{device.sustained_attention_efficiency(dtype):.2f} | "
            f"{speed:,.0f} | {speed / reference:.2f} |"
        )
    points = {point.point_id: point for point in load_points()}
    print("\nPublished per-GPU throughput ratios (benchmarks/published.yaml) beside the model's:\n")
    print("| runs | GPUs | measured ratio | predicted ratio (this table's shape) |")
    print("|---|---|---:|---:|")
    for label, fast_id, slow_id in PUBLISHED_PAIRS:
        fast, slow = points[fast_id], points[slow_id]
        measured = fast.measured_tokens_per_s_per_gpu / slow.measured_tokens_per_s_per_gpu
        fast_gpu = catalog_gpu_name(fast.gpu_name) or fast.gpu_name
        slow_gpu = catalog_gpu_name(slow.gpu_name) or slow.gpu_name
        predicted = speeds[fast_gpu] / speeds[slow_gpu]
        print(
            f"| {label} ({fast_id} / {slow_id}) | {fast_gpu} / {slow_gpu} | "
            f"{measured:.2f} | {predicted:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
