"""Calibration: fit the analytic efficiency curve of a device type to its measurements.

For one device type and dtype, and separately for each layer kind (embedding, block, head)
and pass (forward, backward), find the :class:`~piebald.cost.compute.EfficiencyCurve`
parameters -- sustained fraction of peak, fraction of memory bandwidth, fixed per-pass
time, overlap of compute with memory traffic, and (embedding backward) passes over the
table -- that minimise the squared log
ratio of analytic to measured time over every measured (model, micro-batch size, sequence
length) (scipy ``least_squares``, trust-region reflective, bounded, from a few starts).
A weak prior pulls each parameter towards the analytic default, so a parameter the data
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
from piebald.profiler.compute_model import KindCurve, ProfiledCurve
from piebald.profiler.records import ComputeProfile
from piebald.specs.devices import DeviceType, Dtype
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
_MIN_FRACTION = 1e-4
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
            if timing.backward_recompute_s is not None and layer.kind is LayerKind.BLOCK:
                passes.append((PassKind.BACKWARD_RECOMPUTE, timing.backward_recompute_s))
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
    if observation.pass_kind is PassKind.FORWARD:
        return layer_forward_time_s(
            observation.layer,
            device=device,
            dtype=dtype,
            micro_batch_size=observation.micro_batch_size,
            seq_len=observation.seq_len,
            curve=curve,
        )
    return layer_backward_time_s(
        observation.layer,
        device=device,
        dtype=dtype,
        micro_batch_size=observation.micro_batch_size,
        seq_len=observation.seq_len,
        recompute=observation.pass_kind is PassKind.BACKWARD_RECOMPUTE,
        curve=curve,
    )


# The fitted parameters, in order: log max_fraction, log bandwidth_fraction,
# log half_saturation_s, overlap (a fraction, fitted as is), and for the embedding's
# backward log embedding_table_passes.
_NUM_PARAMS = 4


def _curve_of(params: np.ndarray, *, with_table: bool) -> EfficiencyCurve:
    return EfficiencyCurve(
        max_fraction=float(min(1.0, math.exp(params[0]))),
        bandwidth_fraction=float(min(1.0, math.exp(params[1]))),
        half_saturation_s=float(math.exp(params[2])),
        overlap=float(min(1.0, max(0.0, params[3]))),
        embedding_table_passes=float(math.exp(params[4])) if with_table else 0.0,
    )


def _fit_one(
    observations: Sequence[Observation],
    *,
    device: DeviceType,
    dtype: Dtype,
    start: EfficiencyCurve,
    with_table: bool,
) -> EfficiencyCurve:
    measured = np.array([o.measured_s for o in observations])
    size = _NUM_PARAMS + 1 if with_table else _NUM_PARAMS
    default = np.array(
        [
            math.log(start.max_fraction),
            math.log(start.bandwidth_fraction),
            math.log(max(start.half_saturation_s, _MIN_TIME_S)),
            start.overlap,
            0.0,  # one pass over the table
        ]
    )[:size]

    def residuals(params: np.ndarray) -> np.ndarray:
        curve = _curve_of(params, with_table=with_table)
        predicted = np.array(
            [predict_s(o, device=device, dtype=dtype, curve=curve) for o in observations]
        )
        misfit = np.log(np.maximum(predicted, _MIN_TIME_S) / measured)
        prior = _PRIOR_WEIGHT * (params - default)
        return np.concatenate([misfit, prior])

    lower = np.array(
        [
            math.log(_MIN_FRACTION),
            math.log(_MIN_FRACTION),
            math.log(_MIN_TIME_S),
            0.0,
            math.log(1e-3),
        ]
    )[:size]
    upper = np.array([0.0, 0.0, math.log(10.0), 1.0, math.log(1e3)])[:size]
    # Starts: the default (roofline); the default without overlap (a sum); overhead-bound
    # (half the smallest time is fixed cost); slow and overhead-bound.
    fixed = math.log(float(measured.min()) / 2)
    starts = [
        default,
        np.array([default[0], default[1], default[2], 0.0, 0.0])[:size],
        np.array([default[0], default[1], fixed, 0.5, 0.0])[:size],
        np.array([math.log(0.05), math.log(0.1), math.log(float(measured.min()) / 10), 0.0, 1.0])[
            :size
        ],
    ]
    best = None
    for x0 in starts:
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        result = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale=1.0)
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    return _curve_of(best.x, with_table=with_table)


def calibrate_device(
    observations: Sequence[Observation],
    *,
    device: DeviceType,
    dtype: Dtype,
    start: EfficiencyCurve = DEFAULT_CURVE,
) -> tuple[KindCurve, ...]:
    """A fitted curve per (layer kind, forward/backward) with observations for it."""
    curves: list[KindCurve] = []
    for layer_kind in LayerKind:
        for pass_kind in (PassKind.FORWARD, PassKind.BACKWARD):
            chosen = [
                o for o in observations if o.layer.kind is layer_kind and o.pass_kind is pass_kind
            ]
            if not chosen:
                continue
            with_table = layer_kind is LayerKind.EMBEDDING and pass_kind is PassKind.BACKWARD
            curve = _fit_one(chosen, device=device, dtype=dtype, start=start, with_table=with_table)
            curves.append(
                KindCurve(
                    device=device.name, layer_kind=layer_kind, pass_kind=pass_kind, curve=curve
                )
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
    return ProfiledCurve(
        max_fraction=base.max_fraction,
        bandwidth_fraction=base.bandwidth_fraction,
        half_saturation_s=base.half_saturation_s,
        embedding_table_passes=base.embedding_table_passes,
        overlap=base.overlap,
        kind_curves=tuple(kind_curves),
    )
