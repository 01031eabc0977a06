"""From a ProfileDB to what the planner prices with, and back to what a plan records.

:func:`profiled_inputs` turns a DB into the cluster (measured links applied) and the curve
(measured layer times of the model, curves calibrated per device type) that ``plan``,
``compare`` and ``simulate`` pass on when given ``--profiles DIR``. :func:`cost_inputs_for`
lists, for a finished plan, every measured number that priced it -- per device type, layer
kind and micro-batch size, whether it was measured, interpolated or extrapolated: layer
times, activation bytes (what ``piebald.cost.memory`` prices activations with) -- and the
DB's identity, for the plan file's ``cost_inputs``. ``piebald.cost.recorded_curve`` turns
those numbers back into a curve, without the DB.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, PassKind
from piebald.cost.pass_shape import PassShape
from piebald.cost.profiled_curve import (
    ActivationTable,
    KindCurve,
    LayerTable,
    MeasuredLayer,
    ProfiledCurve,
    activation_table_of,
    distinct_layers,
    layer_table_of,
)
from piebald.profiler.db import ProfileDB
from piebald.profiler.keys import layer_signature
from piebald.profiler.network_model import apply_network_profiles, measured_links
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.model import LayerKind, ModelSpec
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
]

log = logging.getLogger(__name__)


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
    # Here, not at the top: calibrating imports scipy.optimize (0.4 s), which planning
    # without a profile DB never needs (``piebald plan`` imports this module).
    from piebald.profiler.calibrate import calibrate_device, observations_of

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
                of = MeasuredLayer(
                    device=name,
                    dtype=dtype,
                    seq_len=profile.key.seq_len,
                    layer=layer,
                    signature=signature,
                )
                tables.append(layer_table_of(of, profile.timings))
                activation_tables.append(activation_table_of(of, profile.timings))
    return ProfiledCurve.over(
        base,
        tables=tuple(tables),
        kind_curves=tuple(kind_curves),
        activation_tables=tuple(activation_tables),
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
