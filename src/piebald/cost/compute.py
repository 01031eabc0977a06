"""Compute time of a layer pass on a device: its GEMMs, its fused attention, its
memory-bound kernels and its kernel launches, each priced by what limits it.

A forward pass of ``T`` tokens through a layer (its ops from ``specs/layer_ops.py``) takes

    t = max(g, m) + (1 - overlap) * min(g, m) + a + k + n * kernel_s + half_saturation_s

* ``g = matmul_flops / (peak * max_fraction)``: the GEMMs at the fraction of the dense peak
  a block's GEMMs sustain on this device in this dtype
  (``DeviceType.sustained_matmul_efficiency``, fitted to measured block times);
* ``m = (weights + GEMM inputs and outputs) / (bandwidth * bandwidth_fraction)``: the
  GEMMs' own traffic, hidden behind their math on a GPU (``overlap = 1``, the roofline of
  Williams et al. 2009) and not on a CPU core that streams a layer's weights through a
  GEMM of few rows (calibration fits ``overlap`` per device);
* ``a = causal attention FLOPs / (peak * attention fraction)``: fused attention skips
  the masked half of the scores, at the fraction the device's fused attention sustains
  (``DeviceType.sustained_attention_efficiency``; far below the GEMMs' on an H100);
* ``k = memory-bound bytes / (bandwidth * bandwidth_fraction)``: norms, rotary
  embeddings, residual adds, activations and the loss, each its own kernel, overlapping
  nothing -- the term that grows as a GPU's FLOP/s outpace its memory;
* ``n * kernel_s``: the forward's kernel launches, the fixed cost that dominates small
  layers; ``half_saturation_s`` is any further fixed time a calibration measured.

The backward is twice the forward in GEMM FLOPs, bytes and kernels (input and weight
gradients; ``specs/layer_ops.py``) and 2.5x in attention FLOPs (flash attention recomputes
the scores), plus what it runs again of the forward when the layer is recomputed
(``specs.layer_ops.block_reruns``: all but the last matmul under full recompute). MFU
reporting keeps counting the full (non-causal) attention FLOPs, as PaLM does.

A measured profile enters through the object passed as ``curve``: a subclass
(``piebald.cost.profiled_curve.ProfiledCurve``) answers :meth:`EfficiencyCurve.measured_time_s`
with measured times and :meth:`EfficiencyCurve.for_device` with a per-device calibrated
curve; the plain curve answers "not measured" and itself, so the analytic path is unchanged.
The same object carries measured activation memory to ``piebald.cost.memory``
(:meth:`EfficiencyCurve.measured_activation_bytes`), so every consumer of a layer's time
and of its activations sees one source of measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from piebald.cost.pass_shape import PassShape
from piebald.specs.devices import MAX_BANDWIDTH_FRACTION, DeviceType, Dtype
from piebald.specs.job import Optimizer
from piebald.specs.model import LayerKind, LayerSpec
from piebald.specs.recompute import Recompute

__all__ = [
    "KERNEL_LAUNCH_S",
    "EfficiencyCurve",
    "PassKind",
    "PassTerms",
    "PassWork",
    "forward_work",
    "layer_backward_time_s",
    "layer_forward_time_s",
    "optimizer_step_time_s",
    "rerun_work",
]


class PassKind(StrEnum):
    """The passes a layer is timed in (measured or modelled)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_RECOMPUTE = "backward_recompute"  # the forward run again, then the backward
    BACKWARD_SELECTIVE = "backward_selective"  # what selective recompute reruns, then it

    @classmethod
    def recomputed_backward(cls, recompute: Recompute) -> PassKind | None:
        """The backward pass of a block recomputed under ``recompute`` (None: none)."""
        return _RECOMPUTED_BACKWARD.get(recompute)

    @property
    def recompute(self) -> Recompute:
        """What this pass recomputes (``NONE`` for a plain forward or backward)."""
        for mode, kind in _RECOMPUTED_BACKWARD.items():
            if kind is self:
                return mode
        return Recompute.NONE


_RECOMPUTED_BACKWARD = {
    Recompute.FULL: PassKind.BACKWARD_RECOMPUTE,
    Recompute.SELECTIVE: PassKind.BACKWARD_SELECTIVE,
}


# A kernel launch: the CPU needs 4-6 us to submit one (measured with and without CUDA
# graphs: susun-blog.com "pegainfer (3): From Launch Overhead to CUDA Graph"), and eager
# PyTorch submits each op from Python, so a GPU running short kernels waits for it.
KERNEL_LAUNCH_S = 4e-6
# Flash attention's backward FLOPs over its forward's (PassWork.backward).
ATTENTION_BACKWARD_FACTOR = 2.5


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyCurve:
    # The fraction of the dense peak GEMMs sustain; None: the device's measured
    # ``matmul_efficiency`` (a calibrated curve sets its own).
    max_fraction: float | None = None
    # Streaming kernels reach ~80% of HBM bandwidth (STREAM copy on Azure's A100 80GB:
    # 1.61 of 2.04 TB/s; on its H100: 2.90 of 3.35 TB/s).
    bandwidth_fraction: float = 0.8
    half_saturation_s: float = 0.0  # fixed time per pass beyond the kernel launches
    kernel_s: float = KERNEL_LAUNCH_S
    # Passes over the whole embedding table a backward makes: PyTorch's dense embedding
    # gradient zero-fills the table-sized gradient and accumulates it into .grad. The
    # analytic default leaves it out (0); calibration fits it where measured.
    embedding_table_passes: float = 0.0
    # Fraction of the shorter of GEMM compute and GEMM traffic hidden behind the longer:
    # 1 is the roofline (GPUs overlap loads with math); calibration fits it per device.
    overlap: float = 1.0

    def __post_init__(self) -> None:
        if self.max_fraction is not None and not 0 < self.max_fraction <= 1:
            raise ValueError(f"max_fraction = {self.max_fraction}; expected a fraction in (0, 1]")
        if not 0 < self.bandwidth_fraction <= MAX_BANDWIDTH_FRACTION:
            raise ValueError(
                f"bandwidth_fraction = {self.bandwidth_fraction}; expected "
                f"(0, {MAX_BANDWIDTH_FRACTION:g}]"
            )
        if self.half_saturation_s < 0 or self.kernel_s < 0:
            raise ValueError(f"fixed times must be >= 0: {self}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap = {self.overlap}; expected a fraction in [0, 1]")
        if self.embedding_table_passes < 0:
            raise ValueError(
                f"embedding_table_passes = {self.embedding_table_passes}; expected >= 0"
            )

    def matmul_fraction(self, device: DeviceType, dtype: Dtype) -> float:
        """The fraction of ``device``'s ``dtype`` peak its GEMMs sustain."""
        if self.max_fraction is None:
            return device.sustained_matmul_efficiency(dtype)
        return self.max_fraction

    def attention_fraction(self, device: DeviceType, dtype: Dtype) -> float:
        """The device's attention fraction in ``dtype``; a calibrated GEMM fraction scales
        it by the same factor as the device's GEMM fraction."""
        measured = device.sustained_attention_efficiency(dtype)
        if self.max_fraction is None:
            return measured
        return min(1.0, measured * self.max_fraction / device.sustained_matmul_efficiency(dtype))

    def time_s(self, *, work: PassWork, device: DeviceType, dtype: Dtype) -> float:
        """The time of ``work`` on ``device`` computing in ``dtype`` (module docstring)."""
        if work.is_empty:
            return 0.0
        return self.terms(work=work, device=device, dtype=dtype).total_s

    def terms(self, *, work: PassWork, device: DeviceType, dtype: Dtype) -> PassTerms:
        """:meth:`time_s` term by term (module docstring), for a breakdown beside measured
        kernel times."""
        peak = device.peak_flops(dtype)
        bandwidth = device.memory_bandwidth_bytes_per_s * self.bandwidth_fraction
        gemm_s = work.matmul_flops / (peak * self.matmul_fraction(device, dtype))
        gemm_traffic_s = work.gemm_bytes / bandwidth
        return PassTerms(
            gemm_s=max(gemm_s, gemm_traffic_s) + (1.0 - self.overlap) * min(gemm_s, gemm_traffic_s),
            attention_s=work.attention_flops / (peak * self.attention_fraction(device, dtype)),
            stream_s=work.stream_bytes / bandwidth,
            fixed_s=work.kernels * self.kernel_s + self.half_saturation_s,
        )

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


@dataclass(frozen=True, slots=True, kw_only=True)
class PassTerms:
    """A pass's time by term (:meth:`EfficiencyCurve.terms`)."""

    gemm_s: float  # the GEMMs, their traffic hidden behind them as far as ``overlap`` says
    attention_s: float  # fused attention
    stream_s: float  # memory-bound kernels
    fixed_s: float  # kernel launches and any further fixed time

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.stream_s + self.fixed_s


@dataclass(frozen=True, slots=True, kw_only=True)
class PassWork:
    """What one forward pass of a micro-batch does (module docstring); its backward is
    :meth:`backward`."""

    matmul_flops: float
    attention_flops: float  # causal: the masked half is skipped
    gemm_bytes: float  # weights and GEMM inputs and outputs, hidden behind the math
    stream_bytes: float  # memory-bound kernels, not hidden
    kernels: float

    @property
    def is_empty(self) -> bool:
        return self.matmul_flops == 0 and self.gemm_bytes == 0 and self.stream_bytes == 0

    def backward(self, *, extra_stream_bytes: float = 0.0) -> PassWork:
        """The backward of this forward: twice its GEMMs (input and weight gradients),
        traffic and kernels, and 2.5x its attention FLOPs -- flash attention's backward
        recomputes the scores, five matmuls against the forward's two (Dao 2023,
        "FlashAttention-2", section 3.1.2; its benchmarks count the backward so)."""
        return PassWork(
            matmul_flops=2.0 * self.matmul_flops,
            attention_flops=ATTENTION_BACKWARD_FACTOR * self.attention_flops,
            gemm_bytes=2.0 * self.gemm_bytes,
            stream_bytes=2.0 * self.stream_bytes + extra_stream_bytes,
            kernels=2.0 * self.kernels,
        )


def forward_work(layer: LayerSpec, *, shape: PassShape) -> PassWork:
    """The forward pass of one micro-batch of ``shape`` through ``layer``."""
    tokens = shape.num_tokens
    dtype_bytes = shape.dtype.num_bytes
    ops = layer.ops
    weights = layer.num_params + layer.num_tied_params
    gemm_bytes = 0.0
    if layer.matmul_flops_per_token > 0:  # the embedding gathers rows, it reads no weights
        gemm_bytes = (weights + ops.gemm_io_values_per_token * tokens) * dtype_bytes
    # Causal attention: query t attends to t + 1 positions, (s + 1) / 2 on average.
    causal_positions = (shape.seq_len + 1) / 2.0
    return PassWork(
        matmul_flops=layer.matmul_flops_per_token * tokens,
        attention_flops=layer.attention_flops_per_token_per_position * causal_positions * tokens,
        gemm_bytes=gemm_bytes,
        stream_bytes=ops.stream_bytes_per_token(dtype_bytes=dtype_bytes) * tokens,
        kernels=float(ops.forward_kernels(dtype_bytes=dtype_bytes)),
    )


def layer_forward_time_s(
    layer: LayerSpec, *, shape: PassShape, curve: EfficiencyCurve = DEFAULT_CURVE
) -> float:
    """Forward time of one micro-batch of ``shape`` through ``layer`` (``shape.recompute``
    does not change a forward pass)."""
    measured = curve.measured_time_s(layer, shape=shape, kind=PassKind.FORWARD)
    if measured is not None:
        return measured
    analytic = curve.for_device(
        shape.device, layer_kind=layer.kind, pass_kind=PassKind.FORWARD, layer=layer
    )
    return analytic.time_s(
        work=forward_work(layer, shape=shape), device=shape.device, dtype=shape.dtype
    )


def rerun_work(layer: LayerSpec, *, shape: PassShape) -> PassWork:
    """What one micro-batch's backward through ``layer`` runs again of its forward under
    ``shape.recompute`` (``LayerSpec.rerun``; nothing without recompute or outside the
    blocks)."""
    rerun = layer.rerun(shape.recompute)
    tokens = shape.num_tokens
    dtype_bytes = shape.dtype.num_bytes
    ops = rerun.ops
    causal_positions = (shape.seq_len + 1) / 2.0  # as in forward_work
    attention = layer.attention_flops_per_token_per_position * causal_positions * tokens
    return PassWork(
        matmul_flops=2.0 * rerun.matmul_weights * tokens,
        attention_flops=attention if rerun.attention else 0.0,
        gemm_bytes=(rerun.matmul_weights + ops.gemm_io_values_per_token * tokens) * dtype_bytes,
        stream_bytes=ops.stream_bytes_per_token(dtype_bytes=dtype_bytes) * tokens,
        kernels=float(ops.forward_kernels(dtype_bytes=dtype_bytes)),
    )


def layer_backward_time_s(
    layer: LayerSpec, *, shape: PassShape, curve: EfficiencyCurve = DEFAULT_CURVE
) -> float:
    """Backward time: :meth:`PassWork.backward` of the forward's work, plus what it runs
    again of the forward when the layer is recomputed (``shape.recompute``, blocks only:
    :func:`rerun_work`, priced on the curve's forward pass, after the backward without
    recompute). A profile's measured backward under the shape's recompute is taken as it
    is (profiles from before selective recompute was measured have only the full one)."""
    recomputed = shape.recompute.checkpoints and layer.kind is LayerKind.BLOCK
    kind = PassKind.recomputed_backward(shape.recompute)
    if recomputed and kind is not None:
        measured = curve.measured_time_s(layer, shape=shape, kind=kind)
        if measured is not None:
            return measured
    if recomputed:
        backward_s = layer_backward_time_s(
            layer, shape=replace(shape, recompute=Recompute.NONE), curve=curve
        )
        analytic = curve.for_device(
            shape.device, layer_kind=layer.kind, pass_kind=PassKind.FORWARD, layer=layer
        )
        work = rerun_work(layer, shape=shape)
        return backward_s + analytic.time_s(work=work, device=shape.device, dtype=shape.dtype)
    measured = curve.measured_time_s(layer, shape=shape, kind=PassKind.BACKWARD)
    if measured is not None:
        return measured
    device, dtype = shape.device, shape.dtype
    analytic = curve.for_device(
        device, layer_kind=layer.kind, pass_kind=PassKind.BACKWARD, layer=layer
    )
    table_bytes = 0.0
    if layer.kind is LayerKind.EMBEDDING:
        table_bytes = analytic.embedding_table_passes * layer.num_params * dtype.num_bytes
    work = forward_work(layer, shape=shape).backward(extra_stream_bytes=table_bytes)
    return analytic.time_s(work=work, device=device, dtype=dtype)


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
