"""Fit a GPU type's sustained fractions of its peaks to measured transformer-block times.

The catalog's ``matmul_efficiency`` / ``attention_efficiency`` (and their fp32 twins) say
how much of a GPU's dense peak a block's GEMMs and its fused attention sustain
(``specs/devices.py``). This module finds them from measured block times: for every
(GPU type, dtype) two fractions, and for the measuring protocol the weight traffic it adds
per parameter and pass (:class:`ProtocolTraffic`), shared by every GPU type, so that the
cost model's own pricing of the block (``cost.compute``: GEMMs, attention, memory-bound
kernels, launches) plus that traffic at the device's bandwidth matches the measurements.

Least squares on log(predicted / measured) of each forward and each backward (scipy
``least_squares``, trust-region reflective, bounded), with a prior that pulls each
attention fraction towards ``ATTENTION_SHARE_OF_MATMUL`` of its GEMM fraction: at short
sequences attention is a few percent of a block, and there the data cannot tell the two
apart. Nothing is fitted per point: a (GPU type, dtype) pair has its two fractions over all
its sequence lengths and micro-batch sizes, and the protocol's four byte counts hold for all.

The fit prices a pass as ``gemm / e_m + attention / e_a + rest``, the terms of
:meth:`EfficiencyCurve.terms` at fractions of 1; that is the cost model's time where the
GEMMs are compute-bound, which :func:`predicted_times_s` (the cost model itself, with the
fitted device) lets a caller check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from piebald.cost.compute import (
    DEFAULT_CURVE,
    forward_work,
    layer_backward_time_s,
    layer_forward_time_s,
)
from piebald.cost.pass_shape import PassShape
from piebald.specs.devices import ATTENTION_SHARE_OF_MATMUL, DeviceType, Dtype
from piebald.specs.model import LayerSpec
from piebald.specs.recompute import Recompute

__all__ = [
    "BlockFit",
    "BlockTime",
    "Fractions",
    "ProtocolTraffic",
    "fit_block_times",
    "predicted_times_s",
    "with_fractions",
]

# Residual per e-fold between a fitted attention fraction and its share of the GEMM
# fraction: one row's worth, so it holds attention where the data cannot see it (a few
# percent of a 7B block at 512 tokens) and yields to a misfit across many rows.
_PRIOR_WEIGHT = 1.0
_MIN_FRACTION = 1e-3
_MAX_BYTES_PER_PARAM = 64.0  # more than a pass could move per parameter


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockTime:
    """One measured forward and backward of one micro-batch through one block."""

    device: DeviceType
    dtype: Dtype
    layer: LayerSpec
    seq_len: int
    micro_batch_size: int
    forward_s: float
    backward_s: float

    @property
    def shape(self) -> PassShape:
        return PassShape(
            device=self.device,
            dtype=self.dtype,
            micro_batch_size=self.micro_batch_size,
            seq_len=self.seq_len,
            recompute=Recompute.NONE,
        )

    @property
    def key(self) -> tuple[str, Dtype]:
        """The (GPU type, dtype) whose fractions this time measures."""
        return (self.device.name, self.dtype)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolTraffic:
    """Weight traffic a measuring protocol adds beyond piebald's runtime, in bytes per
    block parameter per pass, read and written at the device's streaming bandwidth: e.g.
    autocast over fp32 parameters casts every weight to 16 bits in each forward (read 4,
    write 2) and casts and accumulates its fp32 gradient in each backward."""

    forward_16bit: float = 0.0
    backward_16bit: float = 0.0
    forward_fp32: float = 0.0
    backward_fp32: float = 0.0

    def bytes_per_param(self, *, dtype: Dtype, backward: bool) -> float:
        if dtype is Dtype.FP32:
            return self.backward_fp32 if backward else self.forward_fp32
        return self.backward_16bit if backward else self.forward_16bit

    def time_s(
        self, *, layer: LayerSpec, device: DeviceType, dtype: Dtype, backward: bool
    ) -> float:
        bandwidth = device.memory_bandwidth_bytes_per_s * DEFAULT_CURVE.bandwidth_fraction
        num_bytes = self.bytes_per_param(dtype=dtype, backward=backward) * layer.num_params
        return num_bytes / bandwidth


@dataclass(frozen=True, slots=True, kw_only=True)
class Fractions:
    """The fractions of a (GPU type, dtype)'s dense peak a block's kernels sustain."""

    matmul: float
    attention: float
    num_times: int  # measured block times they were fitted to


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockFit:
    fractions: Mapping[tuple[str, Dtype], Fractions]
    traffic: ProtocolTraffic


def with_fractions(device: DeviceType, fit: BlockFit) -> DeviceType:
    """``device`` with the fractions ``fit`` found for it (16-bit ones from fp16 or bf16
    times, fp32 ones from fp32 times); the others as they were."""
    out = device
    for (name, dtype), found in fit.fractions.items():
        if name != device.name:
            continue
        if dtype is Dtype.FP32:
            out = replace(
                out, fp32_matmul_efficiency=found.matmul, fp32_attention_efficiency=found.attention
            )
        else:
            out = replace(out, matmul_efficiency=found.matmul, attention_efficiency=found.attention)
    return out


def predicted_times_s(time: BlockTime, *, traffic: ProtocolTraffic) -> tuple[float, float]:
    """The cost model's forward and backward of ``time``'s pass on its device as it is
    (``with_fractions`` first to price with a fit), plus the protocol's traffic."""
    shape, layer = time.shape, time.layer
    return (
        layer_forward_time_s(layer, shape=shape)
        + traffic.time_s(layer=layer, device=time.device, dtype=time.dtype, backward=False),
        layer_backward_time_s(layer, shape=shape)
        + traffic.time_s(layer=layer, device=time.device, dtype=time.dtype, backward=True),
    )


def _unit_terms(time: BlockTime) -> np.ndarray:
    """Per pass (forward, backward): GEMM seconds, attention seconds and the rest at
    fractions of 1, and the protocol's seconds per byte per parameter."""
    unit = replace(
        time.device,
        matmul_efficiency=1.0,
        attention_efficiency=1.0,
        fp32_matmul_efficiency=1.0,
        fp32_attention_efficiency=1.0,
    )
    forward = forward_work(time.layer, shape=time.shape)
    per_byte = ProtocolTraffic(
        forward_16bit=1.0, backward_16bit=1.0, forward_fp32=1.0, backward_fp32=1.0
    )
    rows = []
    for backward, work in ((False, forward), (True, forward.backward())):
        terms = DEFAULT_CURVE.terms(work=work, device=unit, dtype=time.dtype)
        protocol = per_byte.time_s(
            layer=time.layer, device=time.device, dtype=time.dtype, backward=backward
        )
        rows.append([terms.gemm_s, terms.attention_s, terms.stream_s + terms.fixed_s, protocol])
    return np.array(rows)


def fit_block_times(times: Sequence[BlockTime]) -> BlockFit:
    """The fractions of every (GPU type, dtype) in ``times`` and the protocol's traffic
    (module docstring). Raises ValueError on no times or a non-positive one."""
    if not times:
        raise ValueError("no block times to fit")
    if any(t.forward_s <= 0 or t.backward_s <= 0 for t in times):
        raise ValueError("block times must be > 0")
    keys = sorted({t.key for t in times})
    index = np.array([keys.index(t.key) for t in times])
    terms = np.stack([_unit_terms(t) for t in times])  # (times, pass, term)
    measured = np.array([[t.forward_s, t.backward_s] for t in times])
    # Which protocol byte count each pass takes: 0/1 forward 16-bit/fp32, 2/3 backward.
    fp32 = np.array([t.dtype is Dtype.FP32 for t in times], dtype=int)
    slot = np.stack([fp32, 2 + fp32], axis=1)
    num_keys = len(keys)

    def predicted(params: np.ndarray) -> np.ndarray:
        protocol = params[:4][slot]
        log_fractions = params[4:].reshape(num_keys, 2)[index]
        gemm = terms[:, :, 0] * np.exp(-log_fractions[:, [0]])
        attention = terms[:, :, 1] * np.exp(-log_fractions[:, [1]])
        total: np.ndarray = gemm + attention + terms[:, :, 2] + terms[:, :, 3] * protocol
        return total

    def residuals(params: np.ndarray) -> np.ndarray:
        fit = np.log(predicted(params) / measured).ravel()
        log_fractions = params[4:].reshape(num_keys, 2)
        prior = log_fractions[:, 1] - log_fractions[:, 0] - math.log(ATTENTION_SHARE_OF_MATMUL)
        return np.concatenate([fit, _PRIOR_WEIGHT * prior])

    start = np.concatenate(
        [
            np.full(4, 4.0),
            np.tile([math.log(0.6), math.log(0.6 * ATTENTION_SHARE_OF_MATMUL)], num_keys),
        ]
    )
    lower = np.concatenate([np.zeros(4), np.full(2 * num_keys, math.log(_MIN_FRACTION))])
    upper = np.concatenate([np.full(4, _MAX_BYTES_PER_PARAM), np.zeros(2 * num_keys)])
    solution = least_squares(residuals, start, bounds=(lower, upper), method="trf")
    params = solution.x
    counts = np.bincount(index, minlength=num_keys)
    fractions = {
        key: Fractions(
            matmul=float(math.exp(params[4 + 2 * k])),
            attention=float(math.exp(params[5 + 2 * k])),
            num_times=int(counts[k]),
        )
        for k, key in enumerate(keys)
    }
    traffic = ProtocolTraffic(
        forward_16bit=float(params[0]),
        forward_fp32=float(params[1]),
        backward_16bit=float(params[2]),
        backward_fp32=float(params[3]),
    )
    return BlockFit(fractions=fractions, traffic=traffic)
