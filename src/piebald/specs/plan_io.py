"""Plan files: JSON in, JSON out, versioned, self-contained, validated on load.

Writing goes through ``piebald.outputs``: atomic (a temporary file renamed into place), never
replacing an existing file unless asked, and then only a regular file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from piebald.errors import SpecError
from piebald.outputs import FORCE_HINT, write_atomic
from piebald.specs.cluster_yaml import cluster_to_dict, parse_cluster
from piebald.specs.devices import MAX_BANDWIDTH_FRACTION
from piebald.specs.fields import Fields
from piebald.specs.job import job_from_dict, job_to_dict
from piebald.specs.json_file import read_json
from piebald.specs.limits import MAX_GLOBAL_BATCH, MAX_SEQ_LEN
from piebald.specs.plan import (
    PLAN_VERSION,
    CalibratedCurve,
    CostInputs,
    MeasuredActivation,
    MeasuredLayerTime,
    MeasuredLink,
    Plan,
    Prediction,
    RunnerUp,
    Schedule,
    Stage,
    ZeroMode,
)
from piebald.specs.presets import model_from_dict, model_to_dict
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

__all__ = [
    "cost_inputs_to_dict",
    "load_plan",
    "plan_from_dict",
    "plan_to_dict",
    "save_plan",
]


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    stages = [_stage_to_dict(plan, stage) for stage in plan.stages]
    out: dict[str, Any] = {
        "version": plan.version,
        "schedule": plan.schedule.value,
        "num_layers": plan.model.num_layers,
        "stages": stages,
        "idle_ranks": list(plan.idle_ranks),
        "routes": [list(route) for route in plan.routes],
    }
    if plan.predicted is not None:
        out["predicted"] = {
            "step_time_s": plan.predicted.step_time_s,
            "tokens_per_s": plan.predicted.tokens_per_s,
            "peak_memory_bytes": {
                str(rank): value for rank, value in plan.predicted.peak_memory_bytes.items()
            },
        }
    if plan.upper_bound_tokens_per_s is not None:
        out["upper_bound_tokens_per_s"] = plan.upper_bound_tokens_per_s
    if plan.predicted is not None and plan.upper_bound_tokens_per_s:
        out["achievable_efficiency"] = plan.predicted.tokens_per_s / plan.upper_bound_tokens_per_s
    out["notes"] = list(plan.notes)
    out["runners_up"] = [
        {"description": r.description, "tokens_per_s": r.tokens_per_s, "step_time_s": r.step_time_s}
        for r in plan.runners_up
    ]
    if plan.cost_inputs is not None:
        out["cost_inputs"] = cost_inputs_to_dict(plan.cost_inputs)
    if plan.checkpoint_every_steps is not None:  # absent: not chosen (older plans too)
        out["checkpoint_every_steps"] = plan.checkpoint_every_steps
    out["cluster"] = cluster_to_dict(plan.cluster)
    out["model"] = model_to_dict(plan.model)
    out["job"] = job_to_dict(plan.job)
    return out


def _stage_to_dict(plan: Plan, stage: Stage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "layers": [stage.layer_start, stage.layer_end],
        "ranks": list(stage.ranks),
        "devices": [plan.cluster.device_of(rank).name for rank in stage.ranks],
        "micro_batch_size": list(stage.micro_batch_size),
        "num_micro_batches": list(stage.num_micro_batches),
        "shard_fraction": list(stage.shard_fraction),
        "zero": stage.zero.value,
        "recompute": stage.recompute.value,
    }
    if stage.max_in_flight is not None:  # absent: the Little's-law budget (older plans too)
        out["max_in_flight"] = list(stage.max_in_flight)
    if stage.tensor_parallel_degree > 1:  # absent: 1 (older plans too)
        out["tensor_parallel_degree"] = stage.tensor_parallel_degree
    if stage.tensor_layout is not TensorLayout.BLOCKS:  # absent: blocks (older plans too)
        out["tensor_layout"] = stage.tensor_layout.value
    return out


def cost_inputs_to_dict(inputs: CostInputs) -> dict[str, Any]:
    return {
        "profile_db": inputs.profile_db,
        "profile_db_digest": inputs.profile_db_digest,
        "layer_times": [
            {
                "device": t.device,
                "layer_kind": t.layer_kind,
                "signature": t.signature,
                "seq_len": t.seq_len,
                "dtype": t.dtype,
                "micro_batch_size": t.micro_batch_size,
                "source": t.source,
                "forward_s": t.forward_s,
                "backward_s": t.backward_s,
                "backward_recompute_s": t.backward_recompute_s,
                "backward_selective_s": t.backward_selective_s,
            }
            for t in inputs.layer_times
        ],
        "curves": [
            {
                "device": c.device,
                "layer_kind": c.layer_kind,
                "pass_kind": c.pass_kind,
                "max_fraction": c.max_fraction,
                "bandwidth_fraction": c.bandwidth_fraction,
                "half_saturation_s": c.half_saturation_s,
                "embedding_table_passes": c.embedding_table_passes,
                "overlap": c.overlap,
            }
            for c in inputs.curves
        ],
        "links": [
            {
                "between": list(link.between),
                "scope": link.scope,
                "latency_s": link.latency_s,
                "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
            }
            for link in inputs.links
        ],
        "activations": [
            {
                "device": a.device,
                "layer_kind": a.layer_kind,
                "signature": a.signature,
                "seq_len": a.seq_len,
                "dtype": a.dtype,
                "micro_batch_size": a.micro_batch_size,
                "source": a.source,
                "activation_bytes": a.activation_bytes,
                "activation_recompute_bytes": a.activation_recompute_bytes,
                "activation_selective_bytes": a.activation_selective_bytes,
            }
            for a in inputs.activations
        ],
    }


def _cost_inputs_from(fields: Fields) -> CostInputs:
    """The ``cost_inputs`` of a plan made with ``--profiles`` (older plans have none)."""
    fields.reject_unknown(_COST_INPUT_KEYS)
    layer_times = tuple(
        MeasuredLayerTime(
            device=entry.string("device"),
            layer_kind=entry.string("layer_kind"),
            signature=entry.string("signature"),
            seq_len=entry.integer("seq_len", minimum=1, maximum=MAX_SEQ_LEN),
            dtype=entry.string("dtype"),
            micro_batch_size=entry.integer("micro_batch_size", minimum=1, maximum=MAX_GLOBAL_BATCH),
            source=entry.choice("source", ["measured", "interpolated", "extrapolated"]),
            forward_s=entry.number("forward_s"),
            backward_s=entry.number("backward_s"),
            backward_recompute_s=entry.optional_number("backward_recompute_s"),
            backward_selective_s=entry.optional_number("backward_selective_s"),
        )
        for entry in _entries(fields, "layer_times", _LAYER_TIME_KEYS)
    )
    curves = tuple(
        CalibratedCurve(
            device=entry.string("device"),
            layer_kind=entry.string("layer_kind"),
            pass_kind=entry.string("pass_kind"),
            max_fraction=entry.number("max_fraction", strictly_positive=True, maximum=1.0),
            bandwidth_fraction=entry.number(
                "bandwidth_fraction", strictly_positive=True, maximum=MAX_BANDWIDTH_FRACTION
            ),
            half_saturation_s=entry.number("half_saturation_s"),
            embedding_table_passes=entry.number("embedding_table_passes", default=0.0),
            overlap=entry.number("overlap", default=1.0, maximum=1.0),
        )
        for entry in _entries(fields, "curves", _CURVE_KEYS)
    )
    links: list[MeasuredLink] = []
    for entry in _entries(fields, "links", _LINK_KEYS):
        between = entry.items("between")
        if len(between) != 2 or not all(isinstance(name, str) for name in between):
            raise entry.error("between", between, "two node group names")
        links.append(
            MeasuredLink(
                between=(between[0], between[1]),
                scope=entry.choice("scope", ["intra-node", "inter-node"]),
                latency_s=entry.number("latency_s"),
                bandwidth_bytes_per_s=entry.number("bandwidth_bytes_per_s", strictly_positive=True),
            )
        )
    activations = tuple(  # plans made before memory was measured have none
        MeasuredActivation(
            device=entry.string("device"),
            layer_kind=entry.string("layer_kind"),
            signature=entry.string("signature"),
            seq_len=entry.integer("seq_len", minimum=1, maximum=MAX_SEQ_LEN),
            dtype=entry.string("dtype"),
            micro_batch_size=entry.integer("micro_batch_size", minimum=1, maximum=MAX_GLOBAL_BATCH),
            source=entry.choice("source", ["measured", "interpolated", "extrapolated"]),
            activation_bytes=entry.number("activation_bytes"),
            activation_recompute_bytes=entry.optional_number("activation_recompute_bytes"),
            activation_selective_bytes=entry.optional_number("activation_selective_bytes"),
        )
        for entry in _entries(fields, "activations", _ACTIVATION_KEYS)
    )
    return CostInputs(
        profile_db=fields.string("profile_db"),
        profile_db_digest=fields.string("profile_db_digest"),
        layer_times=layer_times,
        curves=curves,
        links=tuple(links),
        activations=activations,
    )


def _int_list(fields: Fields, name: str) -> tuple[int, ...]:
    values = fields.items(name)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise fields.error(name, values, "a list of whole numbers")
    return tuple(values)


def _float_list(fields: Fields, name: str) -> tuple[float, ...]:
    values = fields.items(name)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise fields.error(name, values, "a list of numbers")
    return tuple(float(v) for v in values)


def _recompute(fields: Fields) -> Recompute:
    """A stage's ``recompute``: one of the modes; older plans wrote true (whole blocks) or
    false."""
    value = fields.raw("recompute", Recompute.NONE.value)
    if isinstance(value, bool):
        return Recompute.FULL if value else Recompute.NONE
    if not isinstance(value, str) or value not in set(Recompute):
        raise fields.error("recompute", value, f"one of {[mode.value for mode in Recompute]}")
    return Recompute(value)


def _stage_from(fields: Fields) -> Stage:
    fields.reject_unknown(_STAGE_KEYS)
    layers = _int_list(fields, "layers")
    if len(layers) != 2:
        raise fields.error("layers", list(layers), "[start, end)")
    return Stage(
        layer_start=layers[0],
        layer_end=layers[1],
        ranks=_int_list(fields, "ranks"),
        micro_batch_size=_int_list(fields, "micro_batch_size"),
        num_micro_batches=_int_list(fields, "num_micro_batches"),
        shard_fraction=_float_list(fields, "shard_fraction"),
        zero=ZeroMode(fields.choice("zero", [z.value for z in ZeroMode], "none")),
        recompute=_recompute(fields),
        max_in_flight=_int_list(fields, "max_in_flight") if fields.has("max_in_flight") else None,
        tensor_parallel_degree=fields.integer("tensor_parallel_degree", default=1, minimum=1),
        tensor_layout=TensorLayout(
            fields.choice(
                "tensor_layout",
                [layout.value for layout in TensorLayout],
                TensorLayout.BLOCKS.value,
            )
        ),
    )


def _prediction_from(fields: Fields) -> Prediction:
    fields.reject_unknown(_PREDICTION_KEYS)
    memory = fields.sub("peak_memory_bytes")
    peaks: dict[int, float] = {}
    for key in memory.data:
        if not key.isdigit():
            raise memory.error(key, key, "rank numbers as keys")
        peaks[int(key)] = memory.number(key)
    return Prediction(
        step_time_s=fields.number("step_time_s"),
        tokens_per_s=fields.number("tokens_per_s"),
        peak_memory_bytes=peaks,
    )


# Every key plan_to_dict writes, so a misspelt one (``"zer0": "full"``) is refused rather
# than read as its default. Derived keys (num_layers, idle_ranks, devices,
# achievable_efficiency) are written for people reading the file and not read back.
_TOP_KEYS = (
    "version",
    "schedule",
    "num_layers",
    "stages",
    "idle_ranks",
    "routes",
    "predicted",
    "upper_bound_tokens_per_s",
    "achievable_efficiency",
    "notes",
    "runners_up",
    "cost_inputs",
    "checkpoint_every_steps",
    "cluster",
    "model",
    "job",
)
_STAGE_KEYS = (
    "layers",
    "ranks",
    "devices",
    "micro_batch_size",
    "num_micro_batches",
    "shard_fraction",
    "zero",
    "recompute",
    "max_in_flight",
    "tensor_parallel_degree",
    "tensor_layout",
)
_PREDICTION_KEYS = ("step_time_s", "tokens_per_s", "peak_memory_bytes")
_RUNNER_UP_KEYS = ("description", "tokens_per_s", "step_time_s")
_COST_INPUT_KEYS = (
    "profile_db",
    "profile_db_digest",
    "layer_times",
    "curves",
    "links",
    "activations",
)
_LAYER_TIME_KEYS = (
    "device",
    "layer_kind",
    "signature",
    "seq_len",
    "dtype",
    "micro_batch_size",
    "source",
    "forward_s",
    "backward_s",
    "backward_recompute_s",
    "backward_selective_s",
)
_CURVE_KEYS = (
    "device",
    "layer_kind",
    "pass_kind",
    "max_fraction",
    "bandwidth_fraction",
    "half_saturation_s",
    "embedding_table_passes",
    "overlap",
)
_LINK_KEYS = ("between", "scope", "latency_s", "bandwidth_bytes_per_s")
_ACTIVATION_KEYS = (
    "device",
    "layer_kind",
    "signature",
    "seq_len",
    "dtype",
    "micro_batch_size",
    "source",
    "activation_bytes",
    "activation_recompute_bytes",
    "activation_selective_bytes",
)


def _entries(fields: Fields, name: str, keys: tuple[str, ...]) -> list[Fields]:
    """The mappings of list ``name``, each holding only ``keys``."""
    entries = fields.sub_list(name, default_empty=True)
    for entry in entries:
        entry.reject_unknown(keys)
    return entries


def plan_from_dict(data: object, *, source: str) -> Plan:
    """Parse and validate a plan mapping; every problem is one SpecError naming ``source``."""
    try:
        top = Fields(data, source=source)
        top.reject_unknown(_TOP_KEYS)
        version = top.integer("version")
        if version != PLAN_VERSION:
            raise top.error("version", version, f"plan format version {PLAN_VERSION}")
        routes = top.items("routes")
        if not all(
            isinstance(route, list)
            and all(isinstance(r, int) and not isinstance(r, bool) for r in route)
            for route in routes
        ):
            raise top.error("routes", "...", "a list of lists of ranks")
        upper = (
            top.number("upper_bound_tokens_per_s") if top.has("upper_bound_tokens_per_s") else None
        )
        notes = top.items("notes", default_empty=True)
        runners_up = tuple(
            RunnerUp(
                description=entry.string("description"),
                tokens_per_s=entry.number("tokens_per_s"),
                step_time_s=entry.number("step_time_s"),
            )
            for entry in _entries(top, "runners_up", _RUNNER_UP_KEYS)
        )
        plan = Plan(
            cluster=parse_cluster(top.raw("cluster"), source=f"{source} (cluster)"),
            model=model_from_dict(top.raw("model"), source=source),
            job=job_from_dict(top.raw("job"), source=source),
            stages=tuple(_stage_from(stage) for stage in top.sub_list("stages", non_empty=True)),
            routes=tuple(tuple(route) for route in routes),
            schedule=Schedule(top.choice("schedule", [s.value for s in Schedule])),
            predicted=_prediction_from(top.sub("predicted")) if top.has("predicted") else None,
            upper_bound_tokens_per_s=upper,
            notes=tuple(str(n) for n in notes),
            runners_up=runners_up,
            cost_inputs=(
                _cost_inputs_from(top.sub("cost_inputs")) if top.has("cost_inputs") else None
            ),
            checkpoint_every_steps=(
                top.integer("checkpoint_every_steps", minimum=1)
                if top.has("checkpoint_every_steps")
                else None
            ),
        )
    except SpecError as error:
        raise (error if error.source.startswith(source) else error.with_source(source)) from None
    except ValueError as error:  # a dataclass invariant (JobSpec, ModelArch)
        raise SpecError(
            source=source, field="", has_value=False, expected=f"a consistent plan ({error})"
        ) from None
    return plan


def load_plan(path: str | Path) -> Plan:
    file = Path(path)
    return plan_from_dict(read_json(file, expected="a readable plan JSON file"), source=str(file))


def save_plan(
    plan: Plan,
    path: str | Path,
    *,
    overwrite: bool = False,
    flag: str = "--out",
    hint: str = FORCE_HINT,
) -> None:
    """Write the plan JSON atomically (``piebald.outputs``); an existing file is kept
    unless ``overwrite``, and even then only a regular file is replaced. ``hint``: what
    a refusal tells the caller to do."""
    text = json.dumps(plan_to_dict(plan), indent=1) + "\n"
    write_atomic(path, text, flag=flag, force=overwrite, hint=hint)
