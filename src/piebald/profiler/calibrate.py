"""Calibration: fit the analytic efficiency curve of a device type to its measurements.

For one device type and dtype, and separately for each layer kind (embedding, block, head)
and pass (forward, backward), find the :class:`~piebald.cost.compute.EfficiencyCurve`
parameters -- sustained fraction of peak, fraction of memory bandwidth, overlap of compute
with memory traffic, and (embedding backward) passes over the table, shared by every
measured layer of the kind; and a fixed per-pass time per measured layer, held near the
kind's typical one by a ridge -- that minimise the squared log ratio of analytic to
measured time over every measured (model, micro-batch size, sequence length) (scipy
``least_squares``, trust-region reflective, bounded, from a few starts). The rates are the
device's; the fixed time (kernel launches, dispatch, cold caches) is the layer
implementation's, so layers that were not measured get the kind's typical one. A weak
prior pulls each shared parameter towards the analytic default, so a parameter the data
cannot see (the bandwidth fraction of purely compute-bound layers) stays where it was.
Backward with recompute is not fitted: it is priced as the fitted backward plus forward,
and its error is reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from piebald.cost.compute import (
    DEFAULT_CURVE,
    EfficiencyCurve,
    PassKind,
    layer_backward_time_s,
    layer_forward_time_s,
)
from piebald.cost.pass_shape import PassShape
from piebald.cost.profiled_curve import KindCurve, ProfiledCurve, layer_key
from piebald.profiler.records import ComputeProfile
from piebald.specs.devices import MAX_BANDWIDTH_FRACTION, DeviceType, Dtype
from piebald.specs.model import LayerKind, LayerSpec

__all__ = [
    "ErrorRow",
    "Observation",
    "calibrate_device",
    "error_table",
    "observations_of",
    "predict_s",
]

_PRIOR_WEIGHT = 0.02  # residual per e-fold away from the default: far below real misfit
# Residual per e-fold between a measured layer's fixed time and its kind's: a layer's
# fixed time (kernel launches, dispatch, cold caches) follows from how many kernels its
# implementation runs (GPT-2's embedding adds learned positions: three more), so each
# measured layer has its own, but only as far as its measurements demand -- where a rate
# explains a time as well (a 154 MB weight read), the rate does, not the fixed time.
_LAYER_FIXED_WEIGHT = 0.3
_MIN_FRACTION = 1e-4
# Where the fixed time per pass starts (and the prior pulls it) when the starting curve
# has none beyond its kernel launches: a few tens of microseconds of dispatch and cold
# caches per layer pass on a CPU.
_TYPICAL_FIXED_S = 30e-6
_MIN_TIME_S = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """One measured time: a layer, a shape, a pass."""

    model: str
    layer: LayerSpec
    seq_len: int
    micro_batch_size: int
    pass_kind: PassKind
    measured_s: float


def observations_of(profiles: Iterable[ComputeProfile]) -> list[Observation]:
    out: list[Observation] = []
    for profile in profiles:
        layer = next(layer for layer in profile.model.layers if layer.kind is profile.layer_kind)
        for timing in profile.timings:
            passes = [(PassKind.FORWARD, timing.forward_s), (PassKind.BACKWARD, timing.backward_s)]
            if layer.kind is LayerKind.BLOCK:
                for kind, value in (
                    (PassKind.BACKWARD_RECOMPUTE, timing.backward_recompute_s),
                    (PassKind.BACKWARD_SELECTIVE, timing.backward_selective_s),
                ):
                    if value is not None:
                        passes.append((kind, value))
            out.extend(
                Observation(
                    model=profile.model.name,
                    layer=layer,
                    seq_len=profile.key.seq_len,
                    micro_batch_size=timing.micro_batch_size,
                    pass_kind=kind,
                    measured_s=value,
                )
                for kind, value in passes
            )
    return out


def predict_s(
    observation: Observation, *, device: DeviceType, dtype: Dtype, curve: EfficiencyCurve
) -> float:
    """The analytic time of an observation's pass under ``curve`` (which may route per kind)."""
    shape = PassShape(
        device=device,
        dtype=dtype,
        micro_batch_size=observation.micro_batch_size,
        seq_len=observation.seq_len,
        recompute=observation.pass_kind.recompute,
    )
    if observation.pass_kind is PassKind.FORWARD:
        return layer_forward_time_s(observation.layer, shape=shape, curve=curve)
    return layer_backward_time_s(observation.layer, shape=shape, curve=curve)


# The shared parameters, in order: log max_fraction, log bandwidth_fraction, log
# half_saturation_s (the kind's typical fixed time), overlap (a fraction, fitted as is),
# and for the embedding's backward log embedding_table_passes; then one log fixed time
# per measured layer.
_NUM_SHARED = 4


def _curve_of(params: np.ndarray, *, with_table: bool, fixed_s: float) -> EfficiencyCurve:
    return EfficiencyCurve(
        max_fraction=float(min(1.0, math.exp(params[0]))),
        bandwidth_fraction=float(min(MAX_BANDWIDTH_FRACTION, math.exp(params[1]))),
        half_saturation_s=fixed_s,
        overlap=float(min(1.0, max(0.0, params[3]))),
        embedding_table_passes=float(math.exp(params[4])) if with_table else 0.0,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Fit:
    kind_curve: EfficiencyCurve  # the typical fixed time, for layers not measured
    layer_curves: dict[tuple[object, ...], EfficiencyCurve]  # by layer_key
    model_of: dict[tuple[object, ...], str]


def _fit_one(
    observations: Sequence[Observation],
    *,
    device: DeviceType,
    dtype: Dtype,
    start: EfficiencyCurve,
    with_table: bool,
) -> _Fit:
    measured = np.array([o.measured_s for o in observations])
    layers = sorted({layer_key(o.layer) for o in observations}, key=str)
    layer_index = np.array([layers.index(layer_key(o.layer)) for o in observations])
    num_shared = _NUM_SHARED + 1 if with_table else _NUM_SHARED
    default_fixed = math.log(start.half_saturation_s or _TYPICAL_FIXED_S)
    default = np.array(
        [
            math.log(start.matmul_fraction(device, dtype)),
            math.log(start.bandwidth_fraction),
            default_fixed,
            start.overlap,
            0.0,  # one pass over the table
        ]
    )[:num_shared]

    def curves(params: np.ndarray) -> list[EfficiencyCurve]:
        shared = params[:num_shared]
        return [
            _curve_of(shared, with_table=with_table, fixed_s=float(math.exp(value)))
            for value in params[num_shared:]
        ]

    def residuals(params: np.ndarray) -> np.ndarray:
        per_layer = curves(params)
        predicted = np.array(
            [
                predict_s(o, device=device, dtype=dtype, curve=per_layer[i])
                for o, i in zip(observations, layer_index, strict=True)
            ]
        )
        misfit = np.log(np.maximum(predicted, _MIN_TIME_S) / measured)
        prior = _PRIOR_WEIGHT * (params[:num_shared] - default)
        spread = _LAYER_FIXED_WEIGHT * (params[num_shared:] - params[2])
        return np.concatenate([misfit, prior, spread])

    shared_lower = [math.log(_MIN_FRACTION), math.log(_MIN_FRACTION), math.log(_MIN_TIME_S)]
    shared_upper = [0.0, math.log(MAX_BANDWIDTH_FRACTION), math.log(10.0)]
    lower = np.array(
        [*shared_lower, 0.0, math.log(1e-3)][:num_shared] + [math.log(_MIN_TIME_S)] * len(layers)
    )
    upper = np.array(
        [*shared_upper, 1.0, math.log(1e3)][:num_shared] + [math.log(10.0)] * len(layers)
    )
    # Starts: the default (roofline); the default without overlap (a sum); overhead-bound
    # (half the smallest time is fixed cost); slow and overhead-bound.
    half = math.log(float(measured.min()) / 2)
    tenth = math.log(float(measured.min()) / 10)
    starts = [
        (default, default_fixed),
        (np.array([default[0], default[1], default_fixed, 0.0, 0.0])[:num_shared], default_fixed),
        (np.array([default[0], default[1], half, 0.5, 0.0])[:num_shared], half),
        (np.array([math.log(0.05), math.log(0.1), tenth, 0.0, 1.0])[:num_shared], tenth),
    ]
    best = None
    for shared, fixed in starts:
        x0 = np.concatenate([shared, np.full(len(layers), fixed)])
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        result = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale=1.0)
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    per_layer = curves(best.x)
    return _Fit(
        kind_curve=_curve_of(
            best.x[:num_shared], with_table=with_table, fixed_s=float(math.exp(best.x[2]))
        ),
        layer_curves=dict(zip(layers, per_layer, strict=True)),
        model_of={layer_key(o.layer): o.model for o in observations},
    )


def calibrate_device(
    observations: Sequence[Observation],
    *,
    device: DeviceType,
    dtype: Dtype,
    start: EfficiencyCurve = DEFAULT_CURVE,
) -> tuple[KindCurve, ...]:
    """Fitted curves per (layer kind, forward/backward) with observations for it: one per
    measured layer (its own fixed time) and one for the kind's other layers."""
    curves: list[KindCurve] = []
    for layer_kind in LayerKind:
        for pass_kind in (PassKind.FORWARD, PassKind.BACKWARD):
            chosen = [
                o for o in observations if o.layer.kind is layer_kind and o.pass_kind is pass_kind
            ]
            if not chosen:
                continue
            with_table = layer_kind is LayerKind.EMBEDDING and pass_kind is PassKind.BACKWARD
            fit = _fit_one(chosen, device=device, dtype=dtype, start=start, with_table=with_table)
            curves.extend(
                KindCurve(
                    device=device.name,
                    layer_kind=layer_kind,
                    pass_kind=pass_kind,
                    curve=curve,
                    layer=key,
                    model=fit.model_of[key] if key is not None else "",
                )
                for key, curve in [(None, fit.kind_curve), *fit.layer_curves.items()]
            )
    return tuple(curves)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorRow:
    """Analytic-versus-measured relative error of one (layer kind, pass) group."""

    layer_kind: LayerKind
    pass_kind: PassKind
    num_points: int
    mean_abs_error: float  # mean |analytic / measured - 1|
    max_abs_error: float


def error_table(
    observations: Sequence[Observation],
    *,
    device: DeviceType,
    dtype: Dtype,
    curve: EfficiencyCurve,
) -> list[ErrorRow]:
    rows: list[ErrorRow] = []
    for layer_kind in LayerKind:
        for pass_kind in PassKind:
            chosen = [
                o for o in observations if o.layer.kind is layer_kind and o.pass_kind is pass_kind
            ]
            if not chosen:
                continue
            errors = [
                abs(predict_s(o, device=device, dtype=dtype, curve=curve) / o.measured_s - 1.0)
                for o in chosen
            ]
            rows.append(
                ErrorRow(
                    layer_kind=layer_kind,
                    pass_kind=pass_kind,
                    num_points=len(chosen),
                    mean_abs_error=float(np.mean(errors)),
                    max_abs_error=float(np.max(errors)),
                )
            )
    return rows


def calibrated_curve(
    kind_curves: Sequence[KindCurve], *, base: EfficiencyCurve = DEFAULT_CURVE
) -> ProfiledCurve:
    """A curve that prices with the calibrated per-kind curves and no measured tables."""
    return ProfiledCurve.over(base, kind_curves=tuple(kind_curves))
