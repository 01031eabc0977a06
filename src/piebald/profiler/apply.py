"""From a ProfileDB to what the planner prices with, and back to what a plan records.

:func:`profiled_inputs` turns a DB into the cluster (measured links applied) and the curve
(measured layer times of the model, curves calibrated per device type) that ``plan``,
``compare`` and ``simulate`` pass on when given ``--profiles DIR``. :func:`cost_inputs_for`
lists, for a finished plan, every measured number that priced it -- per device type, layer
kind and micro-batch size, whether it was measured, interpolated or extrapolated -- and
the DB's identity, for the plan file's ``cost_inputs``. :func:`recorded_curve` turns those
numbers back into a curve, so ``simulate`` and ``explain`` re-price a plan file exactly as
the planner priced it, without the DB (the measured links are already in the plan's
cluster).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, PassKind
from piebald.errors import SpecError
from piebald.profiler.calibrate import calibrate_device, observations_of
from piebald.profiler.compute_model import KindCurve, LayerTable, ProfiledCurve
from piebald.profiler.db import ProfileDB
from piebald.profiler.keys import distinct_layers, layer_key, layer_signature
from piebald.profiler.network_model import apply_network_profiles, measured_links
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.plan import CalibratedCurve, CostInputs, MeasuredLayerTime, MeasuredLink, Plan

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
    """Measured tables of ``model``'s layers and per-kind calibrated curves for every
    device type of ``devices`` that the DB has measurements of, in the dtype that device
    trains in for a ``precision`` job. Other devices are priced by ``base``."""
    tables: list[LayerTable] = []
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
                recompute = [t.backward_recompute_s for t in profile.timings]
                tables.append(
                    LayerTable(
                        device=name,
                        dtype=dtype,
                        seq_len=profile.key.seq_len,
                        layer=layer_key(layer),
                        layer_kind=layer.kind,
                        signature=signature,
                        micro_batch_sizes=tuple(t.micro_batch_size for t in profile.timings),
                        forward_s=tuple(t.forward_s for t in profile.timings),
                        backward_s=tuple(t.backward_s for t in profile.timings),
                        backward_recompute_s=(
                            tuple(v for v in recompute if v is not None)
                            if all(v is not None for v in recompute)
                            else None
                        ),
                    )
                )
    return ProfiledCurve.over(base, tables=tuple(tables), kind_curves=tuple(kind_curves))


def profiled_inputs(
    db: ProfileDB, *, cluster: ClusterSpec, model: ModelSpec, precision: Dtype
) -> ProfiledInputs:
    measured_cluster = apply_network_profiles(cluster, db)
    curve = profiled_curve(db, model=model, devices=_device_types(cluster), precision=precision)
    unused = sorted(set(db.devices) - set(_device_types(cluster)))
    if unused:
        log.info("profiles of %s are not used: no such GPU type in %s", unused, cluster.name)
    return ProfiledInputs(
        cluster=measured_cluster,
        curve=curve,
        db=db,
        links=measured_links(db, cluster),
    )


def cost_inputs_for(plan: Plan, inputs: ProfiledInputs) -> CostInputs:
    """Every measured number ``plan`` was priced with, and the DB's identity."""
    curve, job = inputs.curve, plan.job
    layer_times: dict[tuple[object, ...], MeasuredLayerTime] = {}
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
                found = {
                    kind: curve.lookup(
                        layer,
                        device=device,
                        dtype=dtype,
                        micro_batch_size=size,
                        seq_len=job.seq_len,
                        kind=kind,
                    )
                    for kind in PassKind
                }
                forward, backward = found[PassKind.FORWARD], found[PassKind.BACKWARD]
                if forward is None or backward is None:
                    continue
                recompute = found[PassKind.BACKWARD_RECOMPUTE]
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
                    backward_recompute_s=(
                        recompute[0]
                        if recompute is not None and layer.kind is LayerKind.BLOCK
                        else None
                    ),
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
                        max_fraction=applied.max_fraction,
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
    )


def _recorded_enum(value: str, field: str, allowed: list[_E]) -> _E:
    """``value`` as a member of ``allowed``, or a SpecError naming the plan field."""
    for member in allowed:
        if member.value == value:
            return member
    raise SpecError(
        source="plan", field=field, value=value, expected=f"one of {[m.value for m in allowed]}"
    )


def recorded_curve(plan: Plan, *, base: EfficiencyCurve = DEFAULT_CURVE) -> EfficiencyCurve:
    """The curve ``plan`` was priced with, rebuilt from its ``cost_inputs`` alone: each
    recorded (device type, layer kind) becomes a table of its recorded micro-batch sizes
    (the ones the plan uses, so every lookup hits a recorded number), and the recorded
    calibrated curves price the layers nothing was measured for. ``base`` (the analytic
    curve) when the plan records nothing, or for devices it records nothing of."""
    inputs = plan.cost_inputs
    if inputs is None:
        return base
    layer_of = {layer.kind: layer for layer in distinct_layers(plan.model)}
    grouped: dict[tuple[str, Dtype, LayerKind, int], list[MeasuredLayerTime]] = defaultdict(list)
    for index, entry in enumerate(inputs.layer_times):
        where = f"cost_inputs.layer_times[{index}]"
        kind = _recorded_enum(entry.layer_kind, f"{where}.layer_kind", list(layer_of))
        dtype = _recorded_enum(entry.dtype, f"{where}.dtype", list(Dtype))
        grouped[entry.device, dtype, kind, entry.seq_len].append(entry)
    tables: list[LayerTable] = []
    for (device, dtype, kind, seq_len), entries in sorted(grouped.items(), key=str):
        entries.sort(key=lambda entry: entry.micro_batch_size)
        layer = layer_of[kind]
        recompute = [entry.backward_recompute_s for entry in entries]
        tables.append(
            LayerTable(
                device=device,
                dtype=dtype,
                seq_len=seq_len,
                layer=layer_key(layer),
                layer_kind=layer.kind,
                signature=entries[0].signature,
                micro_batch_sizes=tuple(entry.micro_batch_size for entry in entries),
                forward_s=tuple(entry.forward_s for entry in entries),
                backward_s=tuple(entry.backward_s for entry in entries),
                backward_recompute_s=(
                    tuple(value for value in recompute if value is not None)
                    if all(value is not None for value in recompute)
                    else None
                ),
            )
        )
    kind_curves = tuple(
        KindCurve(
            device=c.device,
            layer_kind=_recorded_enum(
                c.layer_kind, f"cost_inputs.curves[{index}].layer_kind", list(LayerKind)
            ),
            pass_kind=_recorded_enum(
                c.pass_kind,
                f"cost_inputs.curves[{index}].pass_kind",
                [PassKind.FORWARD, PassKind.BACKWARD],
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
    return ProfiledCurve.over(base, tables=tuple(tables), kind_curves=kind_curves)
