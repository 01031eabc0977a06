"""GPU types: peak FLOP/s, memory and memory bandwidth, and the built-in catalog.

The catalog is data (``catalog.yaml`` beside this file, each figure cited there); user
clusters may add their own types with the same fields. Which dtype a device really trains
in is decided here once: bf16 if asked for and supported, else fp16 with loss scaling if
that is faster than fp32 (not on a P40), else fp32.

Beside its peaks a type says how much of them real kernels sustain: ``matmul_efficiency``
is the fraction of the dense peak large GEMMs reach (the "maximum achievable matmul FLOPS"
measured per GPU, cited in the catalog), ``attention_efficiency`` the fraction fused
(flash) attention reaches. Both are data, not fits: a faster GPU does not reach the same
fraction of its peak (H100 0.80 of its GEMM peak and 0.33 in flash attention, A100 0.87
and 0.58), which is much of why it trains less than its FLOP/s ratio faster.
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
    "DEFAULT_MATMUL_EFFICIENCY",
    "MAX_BANDWIDTH_FRACTION",
    "DeviceType",
    "Dtype",
    "builtin_catalog",
    "parse_device_type",
]

TFLOPS = 1e12
MAX_TFLOPS = 1e6  # one EFLOP/s per device: anything above is a typo
# A type without a measured GEMM efficiency: the middle of the measured data-centre NVIDIA
# parts (A100 SXM 0.87, A100 PCIe 0.81, H100 SXM 0.80, GH200 0.84; catalog.yaml [MAMF]).
DEFAULT_MATMUL_EFFICIENCY = 0.8
# A type without a measured flash-attention efficiency reaches this share of its GEMM
# efficiency: A100's measured ratio (FlashAttention-2 0.575 of peak against GEMMs' 0.869,
# catalog.yaml [AzureA100]), the generation whose attention kernels most GPUs run.
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
    matmul_efficiency: float | None = None  # large GEMMs
    attention_efficiency: float | None = None  # flash attention

    def __post_init__(self) -> None:
        assert self.memory_bytes > 0 and self.memory_bandwidth_bytes_per_s > 0, self
        assert self.fp32_flops > 0 and self.fp16_flops >= 0 and self.bf16_flops >= 0, self
        for fraction in (self.matmul_efficiency, self.attention_efficiency):
            assert fraction is None or 0 < fraction <= 1, self

    @property
    def sustained_matmul_efficiency(self) -> float:
        """The measured GEMM efficiency, or piebald's default where none was measured."""
        if self.matmul_efficiency is not None:
            return self.matmul_efficiency
        return DEFAULT_MATMUL_EFFICIENCY

    @property
    def sustained_attention_efficiency(self) -> float:
        """The measured flash-attention efficiency, or the assumed share of the GEMMs'."""
        if self.attention_efficiency is not None:
            return self.attention_efficiency
        return self.sustained_matmul_efficiency * ATTENTION_SHARE_OF_MATMUL

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


_DEVICE_FIELDS = (
    "name",
    "memory",
    "bf16_tflops",
    "fp16_tflops",
    "fp32_tflops",
    "memory_bandwidth",
    "matmul_efficiency",
    "attention_efficiency",
)


def parse_device_type(fields: Fields) -> DeviceType:
    """A device type from its YAML fields (the same for the catalog and custom types)."""
    fields.reject_unknown(_DEVICE_FIELDS)

    def tflops(name: str, default: float | None = None) -> float:
        number = fields.number(
            name, default=default, maximum=MAX_TFLOPS, strictly_positive=default is None
        )
        return number * TFLOPS

    return DeviceType(
        name=fields.string("name"),
        memory_bytes=fields.size_bytes("memory"),
        bf16_flops=tflops("bf16_tflops", default=0.0),
        fp16_flops=tflops("fp16_tflops", default=0.0),
        fp32_flops=tflops("fp32_tflops"),
        memory_bandwidth_bytes_per_s=fields.rate_bytes_per_s("memory_bandwidth"),
        matmul_efficiency=fields.optional_number(
            "matmul_efficiency", strictly_positive=True, maximum=1.0
        ),
        attention_efficiency=fields.optional_number(
            "attention_efficiency", strictly_positive=True, maximum=1.0
        ),
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
