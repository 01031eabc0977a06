"""The curve a plan file records: its ``cost_inputs`` turned back into a curve.

A plan made from profiles records every measured number that priced it (layer times,
activation bytes, calibrated curves; ``piebald.profiler.apply.cost_inputs_for``).
:func:`recorded_curve` rebuilds the curve from those numbers alone, so ``simulate``,
``explain`` and the training runtime re-price a plan file's time and memory exactly as the
planner priced them, without the profile DB (the measured links are already in the plan's
cluster). Torch-free and DB-free: it needs the plan file only.
"""

from __future__ import annotations

from collections import defaultdict
from enum import StrEnum
from typing import TypeVar

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve, PassKind
from piebald.cost.profiled_curve import (
    KindCurve,
    LayerTable,
    MeasuredLayer,
    ProfiledCurve,
    activation_table_of,
    distinct_layers,
    layer_table_of,
)
from piebald.errors import SpecError
from piebald.specs.devices import Dtype
from piebald.specs.model import LayerKind
from piebald.specs.plan import MeasuredActivation, MeasuredLayerTime, Plan

__all__ = ["recorded_curve"]

_E = TypeVar("_E", bound=StrEnum)


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
        of = MeasuredLayer(
            device=device,
            dtype=dtype,
            seq_len=seq_len,
            layer=layer_of[kind],
            signature=entries[0].signature,
        )
        tables.append(layer_table_of(of, entries))
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
            activation_table_of(
                MeasuredLayer(
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
