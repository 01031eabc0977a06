"""The cost model's view of a profile: measured layer times first, calibrated curves next.

:class:`ProfiledCurve` is what ``piebald plan --profiles`` passes as ``curve`` wherever the
planner takes an :class:`~piebald.cost.compute.EfficiencyCurve` (it is one: its own fields
are the analytic fallback for devices nothing was measured on). It answers

* :meth:`ProfiledCurve.measured_time_s`: the measured time of a (device type, layer, dtype,
  sequence length) at a micro-batch size that was measured; linear interpolation between
  measured sizes (a layer's time is close to affine in its tokens); beyond them, the time at
  the nearest measured size scaled by the calibrated analytic curve's ratio, so the
  extrapolation keeps the curve's saturation shape and meets the measurement at its edge;
* :meth:`ProfiledCurve.for_device`: the curve calibrated for that device type, layer kind
  and pass (``piebald.profiler.calibrate``) -- with a measured layer's own fixed per-pass
  time where it is that layer, the kind's typical one otherwise;
* :meth:`ProfiledCurve.measured_activation_bytes`: the measured bytes one micro-batch keeps
  through a layer for its backward (``LayerTiming.activation_bytes``, with full and
  selective recompute ``activation_recompute_bytes`` and ``activation_selective_bytes``),
  which ``piebald.cost.memory`` uses in place of the
  model's per-token formula. Linear interpolation between measured sizes and linear
  extrapolation beyond them (the line through the two nearest measured sizes; through the
  origin when only one size was measured; never below zero): the saved tensors are the
  micro-batch's tokens times fixed widths, plus a few buffers that do not grow with it
  (rotary tables), so the bytes are affine in the micro-batch size.

The tables are built from rows of measurements (:func:`layer_table_of`,
:func:`activation_table_of`): a profile's ``LayerTiming`` rows (``piebald.profiler.apply``)
or a plan file's recorded numbers (``piebald.cost.recorded_curve``). Torch-free: the
runtime re-prices a plan file with it, and measuring (which needs torch) sits above both.

Frozen and hashable (``pass_times`` is cached on it); the hash is computed once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, Protocol, TypedDict

import numpy as np

from piebald.cost.compute import (
    EfficiencyCurve,
    PassKind,
    layer_backward_time_s,
    layer_forward_time_s,
    rerun_work,
)
from piebald.cost.pass_shape import PassShape
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.model import LayerKind, LayerSpec, ModelSpec
from piebald.specs.recompute import Recompute

__all__ = [
    "ActivationTable",
    "KindCurve",
    "LayerTable",
    "MeasuredLayer",
    "ProfiledCurve",
    "Source",
    "activation_table_of",
    "distinct_layers",
    "layer_key",
    "layer_table_of",
]


class Source(StrEnum):
    MEASURED = "measured"
    INTERPOLATED = "interpolated"
    EXTRAPOLATED = "extrapolated"


def layer_key(layer: LayerSpec) -> tuple[object, ...]:
    """The cost-relevant fields of a layer, without its index: two layers with equal keys
    cost the same (the blocks of one model), so measured times are looked up by it."""
    return (
        layer.kind,
        layer.num_params,
        layer.num_tied_params,
        layer.matmul_flops_per_token,
        layer.attention_flops_per_token_per_position,
        layer.activation_fixed_bytes_per_token,
        layer.activation_values_per_token,
        layer.output_bytes_per_token,
    )


def distinct_layers(model: ModelSpec) -> tuple[LayerSpec, ...]:
    """The first layer of each kind: embedding, one block, head (what a profile times)."""
    seen: dict[LayerKind, LayerSpec] = {}
    for layer in model.layers:
        seen.setdefault(layer.kind, layer)
    return tuple(seen.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTable:
    """Measured times of one layer shape on one device type, by micro-batch size."""

    device: str
    dtype: Dtype
    seq_len: int
    layer: tuple[object, ...]  # layer_key of the model's layer
    layer_kind: LayerKind
    signature: str
    micro_batch_sizes: tuple[int, ...]  # ascending
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    backward_recompute_s: tuple[float, ...] | None  # None unless measured at every size
    backward_selective_s: tuple[float, ...] | None = None  # likewise

    def values(self, kind: PassKind) -> tuple[float, ...] | None:
        if kind is PassKind.FORWARD:
            return self.forward_s
        if kind is PassKind.BACKWARD:
            return self.backward_s
        if kind is PassKind.BACKWARD_SELECTIVE:
            return self.backward_selective_s
        return self.backward_recompute_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationTable:
    """Measured activation bytes of one layer shape on one device type, by micro-batch
    size: what the forward saves for the backward (saved-tensor hooks, each storage once,
    parameters excluded; ``piebald.profiler.measure_compute``), in the dtype measured."""

    device: str
    dtype: Dtype
    seq_len: int
    layer: tuple[object, ...]  # layer_key of the model's layer
    layer_kind: LayerKind
    signature: str
    micro_batch_sizes: tuple[int, ...]  # ascending
    activation_bytes: tuple[float, ...]
    # Under full recompute (blocks: only the checkpointed input); None where not measured
    # at every size, and for layers that are never recomputed (they keep activation_bytes).
    activation_recompute_bytes: tuple[float, ...] | None
    # Under selective recompute (blocks); None likewise, and in profiles measured before
    # piebald measured it (the model's formula prices it then).
    activation_selective_bytes: tuple[float, ...] | None = None

    def values(self, *, recompute: Recompute) -> tuple[float, ...] | None:
        """The measured bytes under ``recompute``; None where not measured."""
        if recompute is Recompute.NONE or self.layer_kind is not LayerKind.BLOCK:
            return self.activation_bytes
        if recompute is Recompute.SELECTIVE:
            return self.activation_selective_bytes
        return self.activation_recompute_bytes


class _Row(Protocol):
    """One measured micro-batch size: a profile's ``LayerTiming`` or a plan's record."""

    @property
    def micro_batch_size(self) -> int: ...


class _TimesRow(_Row, Protocol):
    """A measured size's times."""

    @property
    def forward_s(self) -> float: ...
    @property
    def backward_s(self) -> float: ...
    @property
    def backward_recompute_s(self) -> float | None: ...
    @property
    def backward_selective_s(self) -> float | None: ...


class _BytesRow(_Row, Protocol):
    """A measured size's activation bytes."""

    @property
    def activation_bytes(self) -> float: ...
    @property
    def activation_recompute_bytes(self) -> float | None: ...
    @property
    def activation_selective_bytes(self) -> float | None: ...


def _column(values: Sequence[float | None]) -> tuple[float, ...] | None:
    """A table column, only where every row has a value (a recompute mode measured at
    every size)."""
    present = tuple(value for value in values if value is not None)
    return present if len(present) == len(values) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredLayer:
    """What a table of measurements is of: a layer on a device type, in a dtype, at a
    sequence length (``signature``: the profile's layer signature)."""

    device: str
    dtype: Dtype
    seq_len: int
    layer: LayerSpec
    signature: str

    def header(self, rows: Sequence[_Row]) -> _Header:
        """The fields every table of these rows starts with."""
        return _Header(
            device=self.device,
            dtype=self.dtype,
            seq_len=self.seq_len,
            layer=layer_key(self.layer),
            layer_kind=self.layer.kind,
            signature=self.signature,
            micro_batch_sizes=tuple(row.micro_batch_size for row in rows),
        )


class _Header(TypedDict):
    """What a ``LayerTable`` and an ``ActivationTable`` are of (``MeasuredLayer.header``)."""

    device: str
    dtype: Dtype
    seq_len: int
    layer: tuple[object, ...]
    layer_kind: LayerKind
    signature: str
    micro_batch_sizes: tuple[int, ...]


def layer_table_of(of: MeasuredLayer, rows: Sequence[_TimesRow]) -> LayerTable:
    """Rows of ascending micro-batch sizes as a table of times."""
    return LayerTable(
        **of.header(rows),
        forward_s=tuple(row.forward_s for row in rows),
        backward_s=tuple(row.backward_s for row in rows),
        backward_recompute_s=_column([row.backward_recompute_s for row in rows]),
        backward_selective_s=_column([row.backward_selective_s for row in rows]),
    )


def activation_table_of(of: MeasuredLayer, rows: Sequence[_BytesRow]) -> ActivationTable:
    """Rows of ascending micro-batch sizes as a table of activation bytes."""
    return ActivationTable(
        **of.header(rows),
        activation_bytes=tuple(row.activation_bytes for row in rows),
        activation_recompute_bytes=_column([row.activation_recompute_bytes for row in rows]),
        activation_selective_bytes=_column([row.activation_selective_bytes for row in rows]),
    )


def _affine_lookup(
    sizes: tuple[int, ...], values: tuple[float, ...], size: int
) -> tuple[float, Source]:
    """``values`` at ``size``: as measured, interpolated, or extrapolated along the line
    through the two nearest measured sizes (through the origin from a single size)."""
    if size in sizes:
        return values[sizes.index(size)], Source.MEASURED
    if sizes[0] < size < sizes[-1]:
        return float(np.interp(size, sizes, values)), Source.INTERPOLATED
    if len(sizes) == 1:
        return values[0] * size / sizes[0], Source.EXTRAPOLATED
    i, j = (0, 1) if size < sizes[0] else (len(sizes) - 2, len(sizes) - 1)
    slope = (values[j] - values[i]) / (sizes[j] - sizes[i])
    return max(0.0, values[i] + slope * (size - sizes[i])), Source.EXTRAPOLATED


@dataclass(frozen=True, slots=True, kw_only=True)
class KindCurve:
    """The curve calibrated for one (device type, layer kind, pass), either for one
    measured layer (its own fixed per-pass time, the kind's rates) or, with ``layer`` None,
    for every other layer of the kind (the kind's typical fixed time)."""

    device: str
    layer_kind: LayerKind
    pass_kind: PassKind  # FORWARD or BACKWARD (recompute = both)
    curve: EfficiencyCurve
    layer: tuple[object, ...] | None = None  # layer_key
    model: str = ""  # the measured model the layer is from, for reports


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfiledCurve(EfficiencyCurve):
    tables: tuple[LayerTable, ...] = ()
    kind_curves: tuple[KindCurve, ...] = ()
    activation_tables: tuple[ActivationTable, ...] = ()
    _table_of: Mapping[tuple[object, ...], LayerTable] = field(
        init=False, repr=False, compare=False, hash=False
    )
    _activation_table_of: Mapping[tuple[object, ...], ActivationTable] = field(
        init=False, repr=False, compare=False, hash=False
    )
    _curve_of: Mapping[
        tuple[str, LayerKind, PassKind, tuple[object, ...] | None], EfficiencyCurve
    ] = field(init=False, repr=False, compare=False, hash=False)
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    @classmethod
    def over(
        cls,
        base: EfficiencyCurve,
        *,
        tables: tuple[LayerTable, ...] = (),
        kind_curves: tuple[KindCurve, ...] = (),
        activation_tables: tuple[ActivationTable, ...] = (),
    ) -> ProfiledCurve:
        """Measured tables and calibrated kind curves, ``base`` wherever they are silent."""
        return cls(
            **_curve_fields(base),
            tables=tables,
            kind_curves=kind_curves,
            activation_tables=activation_tables,
        )

    def __post_init__(self) -> None:
        EfficiencyCurve.__post_init__(self)  # zero-argument super() fails in slots classes
        table_of = {(t.device, t.dtype, t.seq_len, t.layer): t for t in self.tables}
        if len(table_of) != len(self.tables):
            raise ValueError("two measured tables for one (device, dtype, seq_len, layer)")
        object.__setattr__(self, "_table_of", table_of)
        activation_table_of = {
            (t.device, t.dtype, t.seq_len, t.layer): t for t in self.activation_tables
        }
        if len(activation_table_of) != len(self.activation_tables):
            raise ValueError("two activation tables for one (device, dtype, seq_len, layer)")
        object.__setattr__(self, "_activation_table_of", activation_table_of)
        object.__setattr__(
            self,
            "_curve_of",
            {(c.device, c.layer_kind, c.pass_kind, c.layer): c.curve for c in self.kind_curves},
        )
        base = (
            self.max_fraction,
            self.bandwidth_fraction,
            self.half_saturation_s,
            self.embedding_table_passes,
            self.overlap,
        )
        object.__setattr__(
            self, "_hash", hash((base, self.tables, self.kind_curves, self.activation_tables))
        )

    def __hash__(self) -> int:
        return self._hash

    def table(
        self, layer: LayerSpec, *, device: DeviceType, dtype: Dtype, seq_len: int
    ) -> LayerTable | None:
        return self._table_of.get((device.name, dtype, seq_len, layer_key(layer)))

    def activation_table(
        self, layer: LayerSpec, *, device: DeviceType, dtype: Dtype, seq_len: int
    ) -> ActivationTable | None:
        return self._activation_table_of.get((device.name, dtype, seq_len, layer_key(layer)))

    def activation_lookup(
        self, layer: LayerSpec, *, shape: PassShape
    ) -> tuple[float, Source] | None:
        """The measured (or interpolated, or extrapolated) activation bytes of one
        micro-batch of ``shape`` through ``layer`` and where they came from; None where not
        measured."""
        table = self.activation_table(
            layer, device=shape.device, dtype=shape.dtype, seq_len=shape.seq_len
        )
        values = table.values(recompute=shape.recompute) if table is not None else None
        if table is None or values is None:
            return None
        return _affine_lookup(table.micro_batch_sizes, values, shape.micro_batch_size)

    def measured_activation_bytes(self, layer: LayerSpec, *, shape: PassShape) -> float | None:
        found = self.activation_lookup(layer, shape=shape)
        return None if found is None else found[0]

    def for_device(
        self,
        device: DeviceType,
        *,
        layer_kind: LayerKind | None = None,
        pass_kind: PassKind | None = None,
        layer: LayerSpec | None = None,
    ) -> EfficiencyCurve:
        if layer_kind is None or pass_kind is None:
            return EfficiencyCurve(**_curve_fields(self))
        found = self.calibrated(device, layer_kind=layer_kind, pass_kind=pass_kind, layer=layer)
        return found if found is not None else self.for_device(device)

    def calibrated(
        self,
        device: DeviceType,
        *,
        layer_kind: LayerKind,
        pass_kind: PassKind,
        layer: LayerSpec | None = None,
    ) -> EfficiencyCurve | None:
        """The calibrated curve for ``layer`` (its own, else its kind's), or None where
        ``device`` has no calibration of that kind and pass."""
        if layer is not None:
            own = self._curve_of.get((device.name, layer_kind, pass_kind, layer_key(layer)))
            if own is not None:
                return own
        return self._curve_of.get((device.name, layer_kind, pass_kind, None))

    def _analytic_s(self, layer: LayerSpec, *, shape: PassShape, kind: PassKind) -> float:
        """The calibrated analytic time of pass ``kind`` (not ``shape.recompute``), never a
        measured one (used to extrapolate)."""
        shape = replace(shape, recompute=Recompute.NONE)
        forward_curve = self.for_device(
            shape.device, layer_kind=layer.kind, pass_kind=PassKind.FORWARD, layer=layer
        )
        forward_s = layer_forward_time_s(layer, shape=shape, curve=forward_curve)
        if kind is PassKind.FORWARD:
            return forward_s
        backward_s = layer_backward_time_s(
            layer,
            shape=shape,
            curve=self.for_device(
                shape.device, layer_kind=layer.kind, pass_kind=PassKind.BACKWARD, layer=layer
            ),
        )
        if kind is PassKind.BACKWARD:
            return backward_s
        rerun = rerun_work(layer, shape=replace(shape, recompute=kind.recompute))
        return backward_s + forward_curve.time_s(work=rerun, device=shape.device, dtype=shape.dtype)

    def lookup(
        self, layer: LayerSpec, *, shape: PassShape, kind: PassKind
    ) -> tuple[float, Source] | None:
        """The measured (or interpolated, or extrapolated) time of pass ``kind`` (not
        ``shape.recompute``) and where it came from."""
        table = self.table(layer, device=shape.device, dtype=shape.dtype, seq_len=shape.seq_len)
        values = table.values(kind) if table is not None else None
        if table is None or values is None:
            return None
        sizes = table.micro_batch_sizes
        micro_batch_size = shape.micro_batch_size
        if micro_batch_size in sizes:
            return values[sizes.index(micro_batch_size)], Source.MEASURED
        if sizes[0] < micro_batch_size < sizes[-1]:
            return float(np.interp(micro_batch_size, sizes, values)), Source.INTERPOLATED
        edge = 0 if micro_batch_size < sizes[0] else len(sizes) - 1
        at_edge = replace(shape, micro_batch_size=sizes[edge])
        scale = self._analytic_s(layer, shape=shape, kind=kind) / self._analytic_s(
            layer, shape=at_edge, kind=kind
        )
        return values[edge] * scale, Source.EXTRAPOLATED

    def measured_time_s(
        self, layer: LayerSpec, *, shape: PassShape, kind: PassKind
    ) -> float | None:
        found = self.lookup(layer, shape=shape, kind=kind)
        return None if found is None else found[0]


def _curve_fields(curve: EfficiencyCurve) -> dict[str, Any]:
    """The plain curve's fields of ``curve`` (a ProfiledCurve's rates without its tables)."""
    return {f.name: getattr(curve, f.name) for f in fields(EfficiencyCurve)}
