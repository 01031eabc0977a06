"""From a ProfileDB to what the planner prices with, and back to what a plan records.

:func:`profiled_inputs` turns a DB into the cluster (measured links applied) and the curve
(measured layer times of the model, curves calibrated per device type) that ``plan``,
``compare`` and ``simulate`` pass on when given ``--profiles DIR``. :func:`cost_inputs_for`
lists, for a finished plan, every measured number that priced it -- per device type, layer
kind and micro-batch size, whether it was measured, interpolated or extrapolated: layer
times, activation bytes (what ``piebald.cost.memory`` prices activations with) -- and the
DB's identity, for the plan file's ``cost_inputs``. :func:`recorded_curve` turns those
numbers back into a curve, so ``simulate`` and ``explain`` re-price a plan file's time and
memory exactly as the planner priced them, without the DB (the measured links are already
in the plan's cluster).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypedDict, TypeVar

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, PassKind
from piebald.cost.pass_shape import PassShape
from piebald.errors import SpecError
from piebald.profiler.calibrate import calibrate_device, observations_of
from piebald.profiler.compute_model import ActivationTable, KindCurve, LayerTable, ProfiledCurve
from piebald.profiler.db import ProfileDB
from piebald.profiler.keys import distinct_layers, layer_key, layer_signature
from piebald.profiler.network_model import apply_network_profiles, measured_links
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.model import LayerKind, LayerSpec, ModelSpec
from piebald.specs.plan import (
    CalibratedCurve,
    CostInputs,
    MeasuredActivation,
    MeasuredLayerTime,
    MeasuredLink,
    Plan,
)
from piebald.specs.recompute import Recompute

__all__ = [
    "ProfiledInputs",
    "cost_inputs_for",
    "profiled_curve",
    "profiled_inputs",
    "recorded_curve",
]

log = logging.getLogger(__name__)

_E = TypeVar("_E", bound=StrEnum)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfiledInputs:
    cluster: ClusterSpec  # measured links applied
    curve: ProfiledCurve
    db: ProfileDB
    links: tuple[MeasuredLink, ...]
    # What the DB could not price, so the CLI can say so instead of falling back silently:
    # the cluster's (device type, dtype it trains in) pairs the DB has no compute profile
    # of, and the DB's measured (device type, dtype) pairs no GPU of the cluster matches.
    unmeasured_devices: tuple[tuple[str, Dtype], ...] = ()
    unused_devices: tuple[tuple[str, Dtype], ...] = ()


def _device_types(cluster: ClusterSpec) -> dict[str, DeviceType]:
    return {group.device.name: group.device for group in cluster.node_groups}


def profiled_curve(
    db: ProfileDB,
    *,
    model: ModelSpec,
    devices: dict[str, DeviceType],
    precision: Dtype,
    base: EfficiencyCurve = DEFAULT_CURVE,
) -> ProfiledCurve:
    """Measured tables (times and activation bytes) of ``model``'s layers and per-kind
    calibrated curves for every device type of ``devices`` that the DB has measurements
    of, in the dtype that device trains in for a ``precision`` job. Other devices are
    priced by ``base``."""
    tables: list[LayerTable] = []
    activation_tables: list[ActivationTable] = []
    kind_curves: list[KindCurve] = []
    for name, device in sorted(devices.items()):
        dtype = device.training_dtype(precision)
        profiles = [
            profile
            for key in db.compute_runs
            if key.device == name
            and key.dtype is dtype
            and (profile := db.compute(key)) is not None
        ]
        if not profiles:
            continue
        kind_curves.extend(
            calibrate_device(observations_of(profiles), device=device, dtype=dtype, start=base)
        )
        for layer in distinct_layers(model):
            signature = layer_signature(model.arch, layer.kind)
            for profile in profiles:
                if profile.key.signature != signature:
                    continue
                of = _Measured(
                    device=name,
                    dtype=dtype,
                    seq_len=profile.key.seq_len,
                    layer=layer,
                    signature=signature,
                )
                tables.append(_layer_table(of, profile.timings))
                activation_tables.append(_activation_table(of, profile.timings))
    return ProfiledCurve.over(
        base,
        tables=tuple(tables),
        kind_curves=tuple(kind_curves),
        activation_tables=tuple(activation_tables),
    )


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
class _Measured:
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
    """What a ``LayerTable`` and an ``ActivationTable`` are of (``_Measured.header``)."""

    device: str
    dtype: Dtype
    seq_len: int
    layer: tuple[object, ...]
    layer_kind: LayerKind
    signature: str
    micro_batch_sizes: tuple[int, ...]


def _layer_table(of: _Measured, rows: Sequence[_TimesRow]) -> LayerTable:
    """Rows of ascending micro-batch sizes as a table of times."""
    return LayerTable(
        **of.header(rows),
        forward_s=tuple(row.forward_s for row in rows),
        backward_s=tuple(row.backward_s for row in rows),
        backward_recompute_s=_column([row.backward_recompute_s for row in rows]),
        backward_selective_s=_column([row.backward_selective_s for row in rows]),
    )


def _activation_table(of: _Measured, rows: Sequence[_BytesRow]) -> ActivationTable:
    """Rows of ascending micro-batch sizes as a table of activation bytes."""
    return ActivationTable(
        **of.header(rows),
        activation_bytes=tuple(row.activation_bytes for row in rows),
        activation_recompute_bytes=_column([row.activation_recompute_bytes for row in rows]),
        activation_selective_bytes=_column([row.activation_selective_bytes for row in rows]),
    )


def profiled_inputs(
    db: ProfileDB, *, cluster: ClusterSpec, model: ModelSpec, precision: Dtype
) -> ProfiledInputs:
    measured_cluster = apply_network_profiles(cluster, db)
    devices = _device_types(cluster)
    curve = profiled_curve(db, model=model, devices=devices, precision=precision)
    wanted = {(name, device.training_dtype(precision)) for name, device in devices.items()}
    measured = {(key.device, key.dtype) for key in db.compute_runs}
    unused = sorted(measured - wanted)
    if unused:
        log.info("profiles of %s are not used: no such GPU type in %s", unused, cluster.name)
    return ProfiledInputs(
        cluster=measured_cluster,
        curve=curve,
        db=db,
        links=measured_links(db, cluster),
        unmeasured_devices=tuple(sorted(wanted - measured)),
        unused_devices=tuple(unused),
    )


def cost_inputs_for(plan: Plan, inputs: ProfiledInputs) -> CostInputs:
    """Every measured number ``plan`` was priced with, and the DB's identity."""
    curve, job = inputs.curve, plan.job
    layer_times: dict[tuple[object, ...], MeasuredLayerTime] = {}
    activations: dict[tuple[object, ...], MeasuredActivation] = {}
    devices: set[str] = set()
    for stage in plan.stages:
        kinds = {
            layer.kind: layer for layer in plan.model.layers[stage.layer_start : stage.layer_end]
        }
        for rank, size in zip(stage.ranks, stage.micro_batch_size, strict=True):
            device = plan.cluster.device_of(rank)
            dtype = device.training_dtype(job.precision)
            devices.add(device.name)
            for layer in kinds.values():
                kept = {
                    recompute: curve.activation_lookup(
                        layer,
                        shape=PassShape.for_job(
                            job, device=device, micro_batch_size=size, recompute=recompute
                        ),
                    )
                    for recompute in Recompute
                }
                plain = kept[Recompute.NONE]
                if plain is not None:
                    table_of = curve.activation_table(
                        layer, device=device, dtype=dtype, seq_len=job.seq_len
                    )
                    assert table_of is not None
                    block = layer.kind is LayerKind.BLOCK
                    recomputed = kept[Recompute.FULL] if block else None
                    selective = kept[Recompute.SELECTIVE] if block else None
                    activations[(device.name, layer.kind, size)] = MeasuredActivation(
                        device=device.name,
                        layer_kind=layer.kind.value,
                        signature=table_of.signature,
                        seq_len=job.seq_len,
                        dtype=dtype.value,
                        micro_batch_size=size,
                        source=plain[1].value,
                        activation_bytes=plain[0],
                        activation_recompute_bytes=(
                            recomputed[0] if recomputed is not None else None
                        ),
                        activation_selective_bytes=(
                            selective[0] if selective is not None else None
                        ),
                    )
                # The pass kind says whether it recomputes, not the shape.
                shape = PassShape.for_job(
                    job, device=device, micro_batch_size=size, recompute=Recompute.NONE
                )
                found = {kind: curve.lookup(layer, shape=shape, kind=kind) for kind in PassKind}
                forward, backward = found[PassKind.FORWARD], found[PassKind.BACKWARD]
                if forward is None or backward is None:
                    continue
                block = layer.kind is LayerKind.BLOCK
                recompute = found[PassKind.BACKWARD_RECOMPUTE] if block else None
                selective = found[PassKind.BACKWARD_SELECTIVE] if block else None
                table = curve.table(layer, device=device, dtype=dtype, seq_len=job.seq_len)
                assert table is not None
                layer_times[(device.name, layer.kind, size)] = MeasuredLayerTime(
                    device=device.name,
                    layer_kind=layer.kind.value,
                    signature=table.signature,
                    seq_len=job.seq_len,
                    dtype=dtype.value,
                    micro_batch_size=size,
                    source=forward[1].value,
                    forward_s=forward[0],
                    backward_s=backward[0],
                    backward_recompute_s=recompute[0] if recompute is not None else None,
                    backward_selective_s=selective[0] if selective is not None else None,
                )
    # Per device type, the calibrated curve each layer kind of this plan's model is priced
    # with (the measured layer's own where it was measured): one per kind and pass.
    calibrated: list[CalibratedCurve] = []
    device_of = {
        plan.cluster.device_of(rank).name: plan.cluster.device_of(rank) for rank in plan.used_ranks
    }
    for name in sorted(devices):
        for layer in distinct_layers(plan.model):
            for pass_kind in (PassKind.FORWARD, PassKind.BACKWARD):
                applied = curve.calibrated(
                    device_of[name], layer_kind=layer.kind, pass_kind=pass_kind, layer=layer
                )
                if applied is None:
                    continue
                calibrated.append(
                    CalibratedCurve(
                        device=name,
                        layer_kind=layer.kind.value,
                        pass_kind=pass_kind.value,
                        max_fraction=applied.matmul_fraction(
                            device_of[name], device_of[name].training_dtype(job.precision)
                        ),
                        bandwidth_fraction=applied.bandwidth_fraction,
                        half_saturation_s=applied.half_saturation_s,
                        embedding_table_passes=applied.embedding_table_passes,
                        overlap=applied.overlap,
                    )
                )
    curves = tuple(calibrated)
    return CostInputs(
        profile_db=inputs.db.root,
        profile_db_digest=inputs.db.digest,
        layer_times=tuple(layer_times[key] for key in sorted(layer_times, key=str)),
        curves=curves,
        links=inputs.links,
        activations=tuple(activations[key] for key in sorted(activations, key=str)),
    )


def _recorded_enum(value: str, field: str, allowed: list[_E], *, source: str) -> _E:
    """``value`` as a member of ``allowed``, or a SpecError naming the plan file's field."""
    for member in allowed:
        if member.value == value:
            return member
    raise SpecError(
        source=source, field=field, value=value, expected=f"one of {[m.value for m in allowed]}"
    )


def recorded_curve(
    plan: Plan, *, base: EfficiencyCurve = DEFAULT_CURVE, source: str = "plan"
) -> EfficiencyCurve:
    """The curve ``plan`` was priced with, rebuilt from its ``cost_inputs`` (see
    :func:`_recorded_curve`); a recorded number the tables refuse (sizes out of order,
    a negative time) is a SpecError naming ``source``, the plan file it was read from."""
    try:
        return _recorded_curve(plan, base=base, source=source)
    except SpecError:
        raise
    except ValueError as error:  # a table or curve invariant: the file was edited
        raise SpecError(
            source=source, field="cost_inputs", has_value=False, expected=str(error)
        ) from None


def _recorded_curve(plan: Plan, *, base: EfficiencyCurve, source: str) -> EfficiencyCurve:
    """The curve ``plan`` was priced with, rebuilt from its ``cost_inputs`` alone: each
    recorded (device type, layer kind) becomes a table of its recorded micro-batch sizes
    (the ones the plan uses, so every lookup hits a recorded number) -- of layer times and
    of activation bytes -- and the recorded calibrated curves price the layers nothing was
    measured for. ``base`` (the analytic curve) when the plan records nothing, or for
    devices it records nothing of; analytic memory for plans that record no activations
    (made before memory was measured)."""
    inputs = plan.cost_inputs
    if inputs is None:
        return base
    layer_of = {layer.kind: layer for layer in distinct_layers(plan.model)}
    grouped: dict[tuple[str, Dtype, LayerKind, int], list[MeasuredLayerTime]] = defaultdict(list)
    for index, entry in enumerate(inputs.layer_times):
        where = f"cost_inputs.layer_times[{index}]"
        kind = _recorded_enum(
            entry.layer_kind, f"{where}.layer_kind", list(layer_of), source=source
        )
        dtype = _recorded_enum(entry.dtype, f"{where}.dtype", list(Dtype), source=source)
        grouped[entry.device, dtype, kind, entry.seq_len].append(entry)
    tables: list[LayerTable] = []
    for (device, dtype, kind, seq_len), entries in sorted(grouped.items(), key=str):
        entries.sort(key=lambda entry: entry.micro_batch_size)
        of = _Measured(
            device=device,
            dtype=dtype,
            seq_len=seq_len,
            layer=layer_of[kind],
            signature=entries[0].signature,
        )
        tables.append(_layer_table(of, entries))
    kept: dict[tuple[str, Dtype, LayerKind, int], list[MeasuredActivation]] = defaultdict(list)
    for index, activation in enumerate(inputs.activations):
        where = f"cost_inputs.activations[{index}]"
        kind = _recorded_enum(
            activation.layer_kind, f"{where}.layer_kind", list(layer_of), source=source
        )
        dtype = _recorded_enum(activation.dtype, f"{where}.dtype", list(Dtype), source=source)
        kept[activation.device, dtype, kind, activation.seq_len].append(activation)
    activation_tables = []
    for (device, dtype, kind, seq_len), recorded in sorted(kept.items(), key=str):
        recorded.sort(key=lambda entry: entry.micro_batch_size)
        activation_tables.append(
            _activation_table(
                _Measured(
                    device=device,
                    dtype=dtype,
                    seq_len=seq_len,
                    layer=layer_of[kind],
                    signature=recorded[0].signature,
                ),
                recorded,
            )
        )
    kind_curves = tuple(
        KindCurve(
            device=c.device,
            layer_kind=_recorded_enum(
                c.layer_kind,
                f"cost_inputs.curves[{index}].layer_kind",
                list(LayerKind),
                source=source,
            ),
            pass_kind=_recorded_enum(
                c.pass_kind,
                f"cost_inputs.curves[{index}].pass_kind",
                [PassKind.FORWARD, PassKind.BACKWARD],
                source=source,
            ),
            curve=EfficiencyCurve(
                max_fraction=c.max_fraction,
                bandwidth_fraction=c.bandwidth_fraction,
                half_saturation_s=c.half_saturation_s,
                embedding_table_passes=c.embedding_table_passes,
                overlap=c.overlap,
            ),
        )
        for index, c in enumerate(inputs.curves)
    )
    return ProfiledCurve.over(
        base,
        tables=tuple(tables),
        kind_curves=kind_curves,
        activation_tables=tuple(activation_tables),
    )
