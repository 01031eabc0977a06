"""Reading and checking what every API call takes: a cluster, a model, a job, a plan, a
profile DB. The other ``piebald.api`` modules accept a path or a loaded object alike."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

from piebald.api.arguments import check_bool, check_instance, check_int, check_path
from piebald.cost.plan_fit import first_memory_overflow
from piebald.cost.recorded_curve import recorded_curve
from piebald.errors import ArgumentError, SpecError
from piebald.profiler.apply import ProfiledInputs
from piebald.profiler.db import ProfileDB
from piebald.profiler.pricing import load_profiles, unmatched_profiles
from piebald.specs import cluster_yaml, plan_io, presets
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import Dtype
from piebald.specs.job import JobSpec, Optimizer, check_job_size
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan
from piebald.specs.units import format_bytes

__all__ = [
    "ProfileWarning",
    "Profiles",
    "Progress",
    "build_job",
    "load_cluster",
    "load_model",
    "load_plan",
    "save_plan",
]

Profiles = str | Path | ProfileDB
Progress = Callable[[float, str], None]


class ProfileWarning(UserWarning):
    """Measurements in a profile DB that the cluster cannot use (those parts are priced
    analytically). ``detail``: which, without the DB's name (the CLI names its flag)."""

    def __init__(self, message: str, *, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def load_cluster(path: str | Path) -> ClusterSpec:
    """A cluster YAML file, validated (``piebald check-cluster`` shows one); a ``path``
    that is not a str or PathLike is an ArgumentError naming ``path``."""
    return cluster_yaml.load_cluster(check_path("path", path))


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A preset by name (``piebald models`` lists them: ``"gpt2"``, ``"llama-3-8b"``, ...),
    or a Hugging Face ``config.json`` or the directory holding it; anything else (not a
    str or PathLike, a name too long for the file system) is an ArgumentError naming
    ``name_or_path``."""
    return presets.load_model(str(check_path("name_or_path", name_or_path)))


def build_job(
    *,
    global_batch: int,
    seq_len: int,
    precision: str | Dtype = Dtype.BF16,
    optimizer: str | Optimizer = Optimizer.ADAMW,
    seed: int = 0,
) -> JobSpec:
    """A :class:`JobSpec` from the CLI's words: ``global_batch`` sequences of ``seq_len``
    tokens per optimizer step (``--global-batch``; the dataclass field and the plan file's
    key are ``global_batch_size``), precision and optimizer by name; a value out of range is
    an ArgumentError naming the argument.

    >>> build_job(global_batch=8, seq_len=128, precision="fp16").global_batch_size
    8
    """
    check_job_size(global_batch=global_batch, seq_len=seq_len)
    check_int("seed", seed, minimum=0)
    return JobSpec(
        global_batch_size=global_batch,
        seq_len=seq_len,
        precision=Dtype(_choice("precision", precision, [d.value for d in Dtype])),
        optimizer=Optimizer(_choice("optimizer", optimizer, [o.value for o in Optimizer])),
        seed=seed,
    )


def load_plan(path: str | Path) -> Plan:
    """A plan JSON file (``piebald plan --out``), as every command reads one: validated
    against its embedded cluster and model, and re-priced (with the measurements it
    records, if it was made from a profile DB) to check that every rank still fits its
    GPU's memory. A rank that does not is a SpecError naming the file: the plan's cluster
    or model was edited after it was made, and a new plan is the fix. A ``path`` that is
    not a str or PathLike is an ArgumentError naming ``path``."""
    path = check_path("path", path)
    plan = plan_io.load_plan(path)
    overflow = first_memory_overflow(plan, curve=recorded_curve(plan, source=str(path)))
    if overflow is not None:
        raise SpecError(
            source=str(path),
            field=f"stages[{overflow.stage_index}]",
            has_value=False,
            expected=f"every rank to fit its GPU's memory: rank {overflow.rank} "
            f"({overflow.device_name}) needs {format_bytes(overflow.need_bytes)} at its peak, "
            f"its GPU has {format_bytes(overflow.capacity_bytes)} (was the plan's cluster or "
            "model edited after it was made? plan again with `piebald plan`)",
        )
    return plan


def save_plan(plan: Plan, path: str | Path, *, overwrite: bool = False) -> None:
    """Write ``plan`` as JSON, atomically (a temporary file beside it, then a rename). An
    existing file is kept unless ``overwrite``; even then only a regular file is replaced."""
    check_instance("plan", plan, Plan, expected="a Plan (from piebald.plan or piebald.load_plan)")
    check_bool("overwrite", overwrite)
    plan_io.save_plan(
        plan,
        check_path("path", path),
        overwrite=overwrite,
        flag="save_plan",
        hint="pass overwrite=True to replace it",
    )


def _choice(argument: str, value: object, allowed: list[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ArgumentError(argument=argument, value=value, expected=f"one of {allowed}")
    return value


def as_cluster(cluster: str | Path | ClusterSpec) -> ClusterSpec:
    """A ClusterSpec, or the cluster YAML at a path; anything else names ``cluster``."""
    if isinstance(cluster, ClusterSpec):
        return cluster
    return cluster_yaml.load_cluster(check_path("cluster", cluster))


def as_model(model: str | Path | ModelSpec) -> ModelSpec:
    """A ModelSpec, a preset's name or a config path; anything else names ``model``."""
    if isinstance(model, ModelSpec):
        return model
    return presets.load_model(str(check_path("model", model)))


def check_job(job: JobSpec) -> None:
    """``job`` is a :class:`JobSpec` (a dict or the CLI's words are not)."""
    if not isinstance(job, JobSpec):
        raise ArgumentError(
            argument="job",
            value=type(job).__name__,
            expected="a JobSpec (piebald.build_job(global_batch=..., seq_len=...))",
        )


def as_plan(plan: Plan | str | Path) -> Plan:
    """A plan, or the plan JSON file at a path (:func:`load_plan`)."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return load_plan(plan)
    raise ArgumentError(
        argument="plan",
        value=type(plan).__name__,
        expected="a Plan (from piebald.plan or load_plan) or the path of a plan JSON file",
    )


def check_profiles(profiles: object) -> None:
    """``profiles`` is a profile DB directory's path or a loaded ProfileDB, or None."""
    if profiles is None or isinstance(profiles, ProfileDB):
        return
    if not isinstance(profiles, (str, os.PathLike)):
        raise ArgumentError(
            argument="profiles",
            value=profiles,
            expected="a profile DB directory (str or pathlib.Path), a ProfileDB, or None",
        )
    check_path("profiles", profiles)


def warn_unmatched(
    profiles: Profiles, inputs: ProfiledInputs, *, cluster: ClusterSpec
) -> tuple[str, ...]:
    """What ``profiles`` holds that ``cluster`` cannot use (those parts are priced
    analytically): a :class:`ProfileWarning` each, and the lines returned."""
    where = inputs.db.root if isinstance(profiles, ProfileDB) else str(profiles)
    lines = unmatched_profiles(inputs, cluster=cluster)
    for line in lines:
        warnings.warn(ProfileWarning(f"profile DB {where}: {line}", detail=line), stacklevel=4)
    return lines


def profiled(
    profiles: Profiles | None, *, cluster: ClusterSpec, model: ModelSpec, job: JobSpec
) -> tuple[ProfiledInputs | None, tuple[str, ...]]:
    """``profiles`` applied to ``cluster``, and the lines of what it cannot price
    (:func:`warn_unmatched`)."""
    if profiles is None:
        return None, ()
    check_profiles(profiles)
    inputs = load_profiles(profiles, cluster=cluster, model=model, precision=job.precision)
    return inputs, warn_unmatched(profiles, inputs, cluster=cluster)
