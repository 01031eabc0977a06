"""One block's forward and backward, kernel by kernel, beside the cost model's terms.

The open question of the cost model's fidelity is where piebald's prices and a real step
part: the GEMMs at their shapes, flash attention, the memory-bound kernels, or the time
between kernels.
This runs the runtime's own block (``build_stage_part``) under ``torch.profiler``, sorts
the device time into those classes by kernel name (on a CPU: the ATen ops' own time), and
prints them beside the terms ``EfficiencyCurve.terms`` prices the same passes with
(``cost.compute``: GEMMs, attention, memory-bound traffic, launches), then the kernels
that took longest.

    python3 benchmarks/kernel_breakdown.py [--model llama-3-8b] [--seq-len 8192]
        [--micro-batch-size 1] [--device cuda|cpu] [--iterations 5]

On a GPU the device is its catalog entry (``profiler.device_map``), priced in bf16; on a
CPU the rates ``profile compute`` measures, in fp32 (and the "kernels" are every ATen op
with time of its own, so their count says little there). The wall time is measured under
the profiler, which adds a little to every op. ``benchmarks/device_check.py`` runs it on a
lent GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from piebald.cost.compute import DEFAULT_CURVE, PassTerms, forward_work
from piebald.cost.pass_shape import PassShape
from piebald.profiler.measure_compute import detect_device
from piebald.runtime.dtypes import TORCH_DTYPES
from piebald.runtime.models.stage_part import build_stage_part
from piebald.specs.devices import Dtype
from piebald.specs.job import JobSpec
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute

# Kernel names by class, lower-cased substrings; attention is looked for first (a flash
# kernel's name may hold "gemm"-like words too). On a CPU the names are ATen ops.
ATTENTION = ("flash", "fmha", "attention", "scaled_dot_product", "sdpa")
GEMM = ("gemm", "cutlass", "xmma", "nvjet", "cublas", "wgmma", "aten::mm", "aten::addmm",
        "aten::bmm", "aten::baddbmm")  # fmt: skip
CLASSES = ("GEMM", "attention", "memory-bound and other")


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """Per forward + backward pass: device time by class, kernels run, wall time."""

    by_class_s: dict[str, float]
    kernels: float
    wall_s: float
    top: list[tuple[str, float, float]]  # (name, seconds per pass, calls per pass)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args(argv)
    model = load_model(args.model)
    dtype = Dtype.BF16 if args.device == "cuda" else Dtype.FP32
    # The catalog entry of this GPU, or this CPU's measured rates.
    device = detect_device(torch.device(args.device), dtype).device_type(dtype)
    block = next(layer for layer in model.layers if layer.kind is LayerKind.BLOCK)
    shape = PassShape.for_job(
        JobSpec(global_batch_size=args.micro_batch_size, seq_len=args.seq_len, precision=dtype),
        device=device,
        micro_batch_size=args.micro_batch_size,
        recompute=Recompute.NONE,
    )
    work = forward_work(block, shape=shape)
    priced = {
        "forward": DEFAULT_CURVE.terms(work=work, device=device, dtype=dtype),
        "backward": DEFAULT_CURVE.terms(work=work.backward(), device=device, dtype=dtype),
    }
    measured = measure(model, block.index, args=args, dtype=dtype)
    print(
        f"{model.name} block, {args.micro_batch_size} x {args.seq_len} tokens, {dtype.value}, "
        f"on {device.name} ({args.device}); forward + backward, {args.iterations} iterations"
    )
    report(measured, priced, priced_kernels=3 * work.kernels)
    return 0


def measure(model: ModelSpec, index: int, *, args: argparse.Namespace, dtype: Dtype) -> Measured:
    """Profile ``args.iterations`` forward + backward passes of layer ``index``."""
    device = torch.device(args.device)
    torch_dtype = TORCH_DTYPES[dtype]
    part = build_stage_part(
        model, layer_start=index, layer_end=index + 1, dtype=torch_dtype, device=device
    )
    part.train()
    shape = (args.micro_batch_size, args.seq_len, model.arch.hidden_size)
    inputs = torch.randn(shape, device=device, dtype=torch_dtype, requires_grad=True)
    gradient = torch.randn(shape, device=device, dtype=torch_dtype)

    def step() -> None:
        inputs.grad = None
        part.zero_grad(set_to_none=True)
        part(inputs).backward(gradient)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):  # warm-up: allocator, kernel selection
        step()
    synchronize()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(args.iterations):
            step()
        synchronize()
        wall_s = (time.perf_counter() - started) / args.iterations
    return classify(prof.events(), on_cuda=device.type == "cuda", wall_s=wall_s, n=args.iterations)


def classify(events: Iterable[object], *, on_cuda: bool, wall_s: float, n: int) -> Measured:
    """Device time by class of the kernels (on a CPU: ATen ops, their own time)."""
    by_class: dict[str, float] = defaultdict(float)
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    kernels = 0.0
    for event in events:
        name = str(getattr(event, "name", ""))
        if on_cuda:
            if not _is_kernel(event):
                continue
            seconds = _self_device_us(event) / 1e6
        else:
            if not name.startswith("aten::"):
                continue
            seconds = float(getattr(event, "self_cpu_time_total", 0.0)) / 1e6
            if seconds <= 0:
                continue
        kernels += 1
        by_class[_class_of(name)] += seconds
        per_name[name][0] += seconds
        per_name[name][1] += 1
    top = sorted(per_name.items(), key=lambda item: -item[1][0])[:15]
    return Measured(
        by_class_s={c: by_class[c] / n for c in CLASSES},
        kernels=kernels / n,
        wall_s=wall_s,
        top=[(name, seconds / n, calls / n) for name, (seconds, calls) in top],
    )


def _is_kernel(event: object) -> bool:
    kind = getattr(event, "device_type", None)
    return kind is not None and "CUDA" in str(kind)


def _self_device_us(event: object) -> float:
    for attribute in ("self_device_time_total", "self_cuda_time_total", "device_time_total"):
        value = getattr(event, attribute, None)
        if value:
            return float(value)
    return 0.0


def _class_of(name: str) -> str:
    lower = name.lower()
    if any(part in lower for part in ATTENTION):
        return "attention"
    if any(part in lower for part in GEMM):
        return "GEMM"
    return "memory-bound and other"


def report(measured: Measured, priced: dict[str, PassTerms], *, priced_kernels: float) -> None:
    """The table: measured against priced, per class, then the longest kernels."""

    def both(term: Callable[[PassTerms], float]) -> float:
        return term(priced["forward"]) + term(priced["backward"])

    rows = [
        ("GEMM", measured.by_class_s["GEMM"], both(lambda t: t.gemm_s)),
        ("attention", measured.by_class_s["attention"], both(lambda t: t.attention_s)),
        (
            "memory-bound and other",
            measured.by_class_s["memory-bound and other"],
            both(lambda t: t.stream_s),
        ),
    ]
    busy_s = sum(row[1] for row in rows)
    rows.append(
        ("between kernels (wall - busy)", measured.wall_s - busy_s, both(lambda t: t.fixed_s))
    )
    rows.append(("wall", measured.wall_s, both(lambda t: t.total_s)))
    print("| term | measured ms | priced ms | measured / priced |")
    print("|---|---:|---:|---:|")
    for name, got_s, price_s in rows:
        ratio = f"{got_s / price_s:.2f}" if price_s > 0 else "-"
        print(f"| {name} | {got_s * 1e3:.3f} | {price_s * 1e3:.3f} | {ratio} |")
    print(
        f"\nkernels per forward + backward: {measured.kernels:.0f} measured, "
        f"{priced_kernels:.0f} priced (the backward counts twice the forward's)"
    )
    print("\n| longest kernels | ms per pass | calls per pass | class |")
    print("|---|---:|---:|---|")
    for name, seconds, calls in measured.top:
        short = name if len(name) < 90 else name[:87] + "..."
        print(f"| {short} | {seconds * 1e3:.3f} | {calls:.0f} | {_class_of(name)} |")


if __name__ == "__main__":
    sys.exit(main())
