"""Compute time of a layer on a device: a roofline with a saturating efficiency curve.

A layer pass of ``w`` FLOPs moving ``q`` bytes takes, with
``c = w / (peak * max_fraction)`` and ``m = q / (memory_bandwidth * bandwidth_fraction)``,

    t = max(c, m) + (1 - overlap) * min(c, m) + half_saturation_s

With ``overlap = 1`` (the default) the first term is the roofline (Williams et al. 2009)
with the best sustained fraction of the dense peak: memory traffic hides entirely behind
compute or the reverse. A processor that does not hide one behind the other -- a CPU core
streaming a layer's weights through a GEMM with few rows, or running its elementwise
kernels one after another -- pays part of the shorter time as well (``overlap = 0``: the
sum). The constant is the time lost to kernel launches and small tiles. Written as an
efficiency, the compute-bound case is ``max_fraction * w / (w + w_half)`` with
``w_half = peak * max_fraction * half_saturation_s``: small kernels reach a small fraction
of peak, large ones approach ``max_fraction``. Profiles calibrate these numbers per device
(``piebald.profiler.calibrate``).

A measured profile enters through the object passed as ``curve``: a subclass
(``piebald.profiler.compute_model.ProfiledCurve``) answers :meth:`EfficiencyCurve.measured_time_s`
with measured times and :meth:`EfficiencyCurve.for_device` with a per-device calibrated
curve; the plain curve answers "not measured" and itself, so the analytic path is unchanged.
The same object carries measured activation memory to ``piebald.cost.memory``
(:meth:`EfficiencyCurve.measured_activation_bytes`), so every consumer of a layer's time
and of its activations sees one source of measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from piebald.cost.pass_shape import PassShape
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import Optimizer
from piebald.specs.model import LayerKind, LayerSpec

__all__ = [
    "EfficiencyCurve",
    "PassKind",
    "layer_backward_time_s",
    "layer_forward_time_s",
    "optimizer_step_time_s",
]


class PassKind(StrEnum):
    """The passes a layer is timed in (measured or modelled)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_RECOMPUTE = "backward_recompute"  # the forward run again, then the backward


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyCurve:
    # Large transformer GEMMs sustain 55-70% of dense peak; end-to-end MFU of well-tuned
    # runs is ~40-55% (PaLM 46%, Llama 3 38-43%), the gap being communication and bubbles.
    max_fraction: float = 0.6
    bandwidth_fraction: float = 0.8  # streaming kernels reach ~80% of HBM bandwidth
    half_saturation_s: float = 30e-6  # ~10-15 kernel launches per layer pass
    # Passes over the whole embedding table a backward makes: PyTorch's dense embedding
    # gradient zero-fills the table-sized gradient and accumulates it into .grad. The
    # analytic default leaves it out (0); calibration fits it where measured.
    embedding_table_passes: float = 0.0
    # Fraction of the shorter of compute and memory time hidden behind the longer: 1 is
    # the roofline (GPUs overlap loads with math); calibration fits it per device.
    overlap: float = 1.0

    def __post_init__(self) -> None:
        if not (0 < self.max_fraction <= 1 and 0 < self.bandwidth_fraction <= 1):
            raise ValueError(f"efficiency fractions must be in (0, 1]: {self}")
        if self.half_saturation_s < 0:
            raise ValueError(f"half_saturation_s = {self.half_saturation_s}; expected >= 0")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap = {self.overlap}; expected a fraction in [0, 1]")
        if self.embedding_table_passes < 0:
            raise ValueError(
                f"embedding_table_passes = {self.embedding_table_passes}; expected >= 0"
            )

    def time_s(
        self,
        *,
        flops: float,
        num_bytes: float,
        peak_flops: float,
        memory_bandwidth_bytes_per_s: float,
    ) -> float:
        if flops == 0 and num_bytes == 0:
            return 0.0
        compute_s = flops / (peak_flops * self.max_fraction)
        memory_s = num_bytes / (memory_bandwidth_bytes_per_s * self.bandwidth_fraction)
        exposed_s = (1.0 - self.overlap) * min(compute_s, memory_s)  # 0 on the roofline
        return max(compute_s, memory_s) + exposed_s + self.half_saturation_s

    def measured_time_s(
        self, layer: LayerSpec, *, shape: PassShape, kind: PassKind
    ) -> float | None:
        """A measured time for this pass (``kind``, not ``shape.recompute``, says which),
        or None: the analytic curve has no measurements."""
        return None

    def measured_activation_bytes(self, layer: LayerSpec, *, shape: PassShape) -> float | None:
        """Measured bytes one micro-batch keeps through ``layer`` for its backward, or None:
        the analytic curve has none (``cost.memory`` then uses the model's per-token bytes)."""
        return None

    def for_device(
        self,
        device: DeviceType,
        *,
        layer_kind: LayerKind | None = None,
        pass_kind: PassKind | None = None,
        layer: LayerSpec | None = None,
    ) -> EfficiencyCurve:
        """The curve to price ``device`` with; a profile may hold one calibrated per device
        type, layer kind and pass (a block's kernels saturate differently from a gather),
        and per measured ``layer`` (its own fixed per-pass time)."""
        return self


DEFAULT_CURVE = EfficiencyCurve()


def _forward_bytes(layer: LayerSpec, *, tokens: int, dtype: Dtype) -> float:
    """Bytes a forward pass moves: weights read once, activations written once. The
    embedding only gathers one table row per token and writes it out."""
    if layer.kind is LayerKind.EMBEDDING:
        return 2.0 * layer.output_bytes_per_token * tokens * dtype.num_bytes / 2
    weights = layer.num_params + layer.num_tied_params
    kept = layer.activation_bytes_per_token(dtype_bytes=dtype.num_bytes) * tokens
    return weights * dtype.num_bytes + kept


def layer_forward_time_s(
    layer: LayerSpec, *, shape: PassShape, curve: EfficiencyCurve = DEFAULT_CURVE
) -> float:
    """Forward time of one micro-batch of ``shape`` through ``layer`` (``shape.recompute``
    does not change a forward pass)."""
    measured = curve.measured_time_s(layer, shape=shape, kind=PassKind.FORWARD)
    if measured is not None:
        return measured
    device, dtype = shape.device, shape.dtype
    analytic = curve.for_device(
        device, layer_kind=layer.kind, pass_kind=PassKind.FORWARD, layer=layer
    )
    tokens = shape.num_tokens
    flops = layer.forward_flops_per_token(seq_len=shape.seq_len) * tokens
    return analytic.time_s(
        flops=flops,
        num_bytes=_forward_bytes(layer, tokens=tokens, dtype=dtype),
        peak_flops=device.peak_flops(dtype),
        memory_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s,
    )


def layer_backward_time_s(
    layer: LayerSpec, *, shape: PassShape, curve: EfficiencyCurve = DEFAULT_CURVE
) -> float:
    """Backward time: 2x the forward FLOPs and bytes (input and weight gradients), plus a
    repeated forward when the layer's activations were recomputed (``shape.recompute``,
    blocks only)."""
    recomputed = shape.recompute and layer.kind is LayerKind.BLOCK
    measured = curve.measured_time_s(
        layer,
        shape=shape,
        kind=PassKind.BACKWARD_RECOMPUTE if recomputed else PassKind.BACKWARD,
    )
    if measured is not None:
        return measured
    device, dtype = shape.device, shape.dtype
    analytic = curve.for_device(
        device, layer_kind=layer.kind, pass_kind=PassKind.BACKWARD, layer=layer
    )
    tokens = shape.num_tokens
    flops = 2.0 * layer.forward_flops_per_token(seq_len=shape.seq_len) * tokens
    num_bytes = 2.0 * _forward_bytes(layer, tokens=tokens, dtype=dtype)
    if layer.kind is LayerKind.EMBEDDING:
        num_bytes += analytic.embedding_table_passes * layer.num_params * dtype.num_bytes
    backward_s = analytic.time_s(
        flops=flops,
        num_bytes=num_bytes,
        peak_flops=device.peak_flops(dtype),
        memory_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s,
    )
    if recomputed:
        backward_s += layer_forward_time_s(layer, shape=shape, curve=curve)
    return backward_s


# Bytes the update touches per owned parameter, reads plus writes. AdamW: fp32 master, m
# and v read and written (24), fp32 gradient read (4), 16-bit weight written (2); SGD:
# master read and written (8), gradient read (4), weight written (2).
_OPTIMIZER_BYTES_PER_PARAM = {Optimizer.ADAMW: 30.0, Optimizer.SGD: 14.0}


def optimizer_step_time_s(
    *,
    num_params: float,
    device: DeviceType,
    optimizer: Optimizer,
    curve: EfficiencyCurve = DEFAULT_CURVE,
) -> float:
    """The optimizer update of ``num_params`` owned parameters: memory-bound."""
    if num_params <= 0:
        return 0.0
    num_bytes = num_params * _OPTIMIZER_BYTES_PER_PARAM[optimizer]
    bandwidth_fraction = curve.for_device(device).bandwidth_fraction
    return num_bytes / (device.memory_bandwidth_bytes_per_s * bandwidth_fraction)
