"""GPU types: peak FLOP/s, memory and memory bandwidth, and the built-in catalog.

The catalog is data (``catalog.yaml`` beside this file, each figure cited there); user
clusters may add their own types with the same fields. Which dtype a device really trains
in is decided here once: bf16 if asked for and supported, else fp16 with loss scaling if
that is faster than fp32 (not on a P40), else fp32.

Beside its peaks a type says how much of them a transformer block's kernels sustain, per
dtype: ``matmul_efficiency`` is the fraction of the dense 16-bit (bf16 and fp16: the same
tensor cores) peak its GEMMs reach, ``attention_efficiency`` the fraction its fused
attention reaches, and ``fp32_matmul_efficiency`` / ``fp32_attention_efficiency`` the same
for the fp32 peak. The catalog's are fitted to measured block times and cite them
(``catalog.yaml``; ``profiler/block_fit.py``). A faster GPU does not reach the same fraction
of its peak, and the fraction depends on the dtype on one card (the fp32 peak of Ampere and
Ada workstation cards counts a dual-issue rate GEMMs never reach; PyTorch's fp16 GEMMs on a
P100 run no faster than its fp32 ones), which is much of why GPUs train at other ratios
than their peaks'.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any

import yaml

from piebald.errors import SpecError
from piebald.specs.fields import Fields

__all__ = [
    "ATTENTION_SHARE_OF_MATMUL",
    "BLOCK_SHARE_OF_BENCHMARK_GEMM",
    "DEFAULT_MATMUL_EFFICIENCY",
    "EFFICIENCY_FIELDS",
    "MAX_BANDWIDTH_FRACTION",
    "DeviceType",
    "Dtype",
    "builtin_catalog",
    "parse_device_type",
]

TFLOPS = 1e12
MAX_TFLOPS = 1e6  # one EFLOP/s per device: anything above is a typo
# The share of a best-shape GEMM benchmark's rate a transformer block's GEMMs reach,
# measured on the A100s (their block fit over [MAMF]; catalog.yaml [ZorseA100];
# benchmarks/block_times.py --check holds it): how a type is priced whose only
# measurement is such a benchmark, or `piebald profile compute`'s large GEMM.
BLOCK_SHARE_OF_BENCHMARK_GEMM = 0.843
# A type without a measured attention efficiency reaches this share of its GEMM
# efficiency: A100's ratio (FlashAttention-2 0.575 of peak against GEMMs' 0.869,
# catalog.yaml [AzureA100]); the block fit's prior too.
ATTENTION_SHARE_OF_MATMUL = 0.66
# A calibrated effective bandwidth over a device's measured copy rate may exceed 1: a CPU's
# small layers stream from cache, not memory (the analytic GPU fraction stays 0.8).
MAX_BANDWIDTH_FRACTION = 16.0


class Dtype(StrEnum):
    """Training precision: the dtype of compute (weights and activations in matmuls)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def num_bytes(self) -> int:
        return 4 if self is Dtype.FP32 else 2


# A type without a measured GEMM efficiency in a dtype: the median of the catalog's fitted
# block efficiencies in that dtype (catalog.yaml [ZorseFit]; benchmarks/block_times.py
# --check, run by the tests, holds the two equal).
DEFAULT_MATMUL_EFFICIENCY = {Dtype.BF16: 0.55, Dtype.FP16: 0.55, Dtype.FP32: 0.67}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceType:
    """One GPU type, as PyTorch sees one device."""

    name: str
    memory_bytes: float
    bf16_flops: float
    fp16_flops: float
    fp32_flops: float
    memory_bandwidth_bytes_per_s: float
    # Measured fractions of the dense peak (None: not measured, piebald's assumption):
    matmul_efficiency: float | None = None  # GEMMs in bf16 / fp16
    attention_efficiency: float | None = None  # fused attention in bf16 / fp16
    fp32_matmul_efficiency: float | None = None  # GEMMs in fp32
    fp32_attention_efficiency: float | None = None  # attention in fp32

    def __post_init__(self) -> None:
        assert self.memory_bytes > 0 and self.memory_bandwidth_bytes_per_s > 0, self
        assert self.fp32_flops > 0 and self.fp16_flops >= 0 and self.bf16_flops >= 0, self
        for fraction in (
            self.matmul_efficiency,
            self.attention_efficiency,
            self.fp32_matmul_efficiency,
            self.fp32_attention_efficiency,
        ):
            assert fraction is None or 0 < fraction <= 1, self

    def measured_matmul_efficiency(self, dtype: Dtype) -> float | None:
        """The GEMM efficiency measured in ``dtype`` (None: not measured)."""
        return self.fp32_matmul_efficiency if dtype is Dtype.FP32 else self.matmul_efficiency

    def measured_attention_efficiency(self, dtype: Dtype) -> float | None:
        """The attention efficiency measured in ``dtype`` (None: not measured)."""
        if dtype is Dtype.FP32:
            return self.fp32_attention_efficiency
        return self.attention_efficiency

    def sustained_matmul_efficiency(self, dtype: Dtype) -> float:
        """The GEMM efficiency in ``dtype``, or piebald's default where none was measured."""
        measured = self.measured_matmul_efficiency(dtype)
        return DEFAULT_MATMUL_EFFICIENCY[dtype] if measured is None else measured

    def sustained_attention_efficiency(self, dtype: Dtype) -> float:
        """The attention efficiency in ``dtype``, or the assumed share of the GEMMs'."""
        measured = self.measured_attention_efficiency(dtype)
        if measured is not None:
            return measured
        return self.sustained_matmul_efficiency(dtype) * ATTENTION_SHARE_OF_MATMUL

    @property
    def bf16_supported(self) -> bool:
        return self.bf16_flops > 0

    def training_dtype(self, requested: Dtype) -> Dtype:
        """The dtype this device computes in when the job asks for ``requested``."""
        if requested is Dtype.BF16 and self.bf16_supported:
            return Dtype.BF16
        if requested in (Dtype.BF16, Dtype.FP16) and self.fp16_flops > self.fp32_flops:
            return Dtype.FP16
        return Dtype.FP32

    def peak_flops(self, dtype: Dtype) -> float:
        """Dense peak FLOP/s in ``dtype`` (0 where unsupported)."""
        return {
            Dtype.BF16: self.bf16_flops,
            Dtype.FP16: self.fp16_flops,
            Dtype.FP32: self.fp32_flops,
        }[dtype]

    def training_peak_flops(self, requested: Dtype) -> float:
        """Dense peak FLOP/s in the dtype this device trains in for a ``requested`` job."""
        return self.peak_flops(self.training_dtype(requested))


EFFICIENCY_FIELDS = (
    "matmul_efficiency",
    "attention_efficiency",
    "fp32_matmul_efficiency",
    "fp32_attention_efficiency",
)
_DEVICE_FIELDS = (
    "name",
    "memory",
    "bf16_tflops",
    "fp16_tflops",
    "fp32_tflops",
    "memory_bandwidth",
    *EFFICIENCY_FIELDS,
)


def parse_device_type(fields: Fields) -> DeviceType:
    """A device type from its YAML fields (the same for the catalog and custom types)."""
    fields.reject_unknown(_DEVICE_FIELDS)

    def tflops(name: str, default: float | None = None) -> float:
        number = fields.number(
            name, default=default, maximum=MAX_TFLOPS, strictly_positive=default is None
        )
        return number * TFLOPS

    def fraction(name: str) -> float | None:
        return fields.optional_number(name, strictly_positive=True, maximum=1.0)

    return DeviceType(
        name=fields.string("name"),
        memory_bytes=fields.size_bytes("memory"),
        bf16_flops=tflops("bf16_tflops", default=0.0),
        fp16_flops=tflops("fp16_tflops", default=0.0),
        fp32_flops=tflops("fp32_tflops"),
        memory_bandwidth_bytes_per_s=fields.rate_bytes_per_s("memory_bandwidth"),
        matmul_efficiency=fraction("matmul_efficiency"),
        attention_efficiency=fraction("attention_efficiency"),
        fp32_matmul_efficiency=fraction("fp32_matmul_efficiency"),
        fp32_attention_efficiency=fraction("fp32_attention_efficiency"),
    )


def device_types_from(fields: Fields, name: str) -> dict[str, DeviceType]:
    """The list ``name`` of device types, keyed by name; duplicates are an error."""
    types: dict[str, DeviceType] = {}
    for entry in fields.sub_list(name, default_empty=True):
        device = parse_device_type(entry)
        if device.name in types:
            raise entry.error("name", device.name, "a name not already used in this list")
        types[device.name] = device
    return types


@functools.cache
def builtin_catalog() -> dict[str, DeviceType]:
    """The built-in catalog, keyed by name (read once from ``catalog.yaml``)."""
    text = resources.files("piebald.specs").joinpath("catalog.yaml").read_text("utf-8")
    data: Any = yaml.safe_load(text)
    catalog = device_types_from(Fields(data, source="catalog.yaml"), "gpu_types")
    if not catalog:
        raise SpecError(
            source="catalog.yaml", field="gpu_types", value=None, expected="at least one GPU type"
        )
    return catalog
