"""Planning and simulating with a profile DB: the cluster and curve a DB prices a job with,
what of the DB a cluster cannot use, the plan recording what priced it, and the prices a
plan file is simulated with.

Torch-free, like the rest of what planning needs (``profiler.apply``); the measuring
modules (``measure_*``) are the only ones that import torch. Nothing here prints: what the
DB cannot price comes back as lines of text, which the Python API issues as
``piebald.api.ProfileWarning`` (and the CLI prints as warnings).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.recorded_curve import recorded_curve
from piebald.errors import ArgumentError
from piebald.profiler.apply import ProfiledInputs, cost_inputs_for, profiled_inputs
from piebald.profiler.db import ProfileDB, load_profile_db
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import Dtype
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan

__all__ = [
    "PlanPrices",
    "PriceBasis",
    "load_profiles",
    "plan_prices",
    "plan_with_cost_inputs",
    "planning_prices",
    "unmatched_profiles",
]


def load_profiles(
    profiles: str | Path | ProfileDB, *, cluster: ClusterSpec, model: ModelSpec, precision: Dtype
) -> ProfiledInputs:
    """A profile DB (a directory, or one already loaded) applied to ``cluster``: measured
    links, and the curve that prices ``model``'s layers in ``precision`` from the DB's
    measurements. A DB that holds no profile is an ArgumentError (``profiles``)."""
    db = profiles if isinstance(profiles, ProfileDB) else load_profile_db(profiles)
    if db.num_files == 0:
        raise ArgumentError(
            argument="profiles",
            value=db.root if isinstance(profiles, ProfileDB) else str(profiles),
            expected="a profile DB directory holding profile files (*.json, made by "
            "piebald profile compute / network); this one holds none",
        )
    return profiled_inputs(db, cluster=cluster, model=model, precision=precision)


def _pairs(pairs: tuple[tuple[str, Dtype], ...]) -> str:
    return ", ".join(f"{name} in {dtype}" for name, dtype in pairs)


def unmatched_profiles(inputs: ProfiledInputs, *, cluster: ClusterSpec) -> tuple[str, ...]:
    """One line per kind of measurement the DB holds but ``cluster`` cannot use (the
    planner prices those parts analytically): never ignored silently."""
    db, lines = inputs.db, []
    if db.compute_runs and inputs.unmeasured_devices:
        measured = inputs.unused_devices or tuple(
            sorted({(key.device, key.dtype) for key in db.compute_runs})
        )
        types = {group.device.name for group in cluster.node_groups}
        none_used = len(inputs.unmeasured_devices) == len(types)
        lines.append(
            f"no compute profile of {_pairs(inputs.unmeasured_devices)} "
            f"(the GPU types of {cluster.name} and the dtype each trains in; the DB measured "
            f"{_pairs(measured)}): "
            + ("compute is" if none_used else "those GPUs are")
            + " priced from the analytic model"
        )
    if db.network_runs and not inputs.links:
        groups = sorted({name for key in db.network_runs for name in key.groups})
        lines.append(
            f"no network profile is between node groups of {cluster.name} (the DB measured "
            f"groups {', '.join(groups)}): links are priced from the cluster file"
        )
    return tuple(lines)


def planning_prices(
    inputs: ProfiledInputs | None, *, cluster: ClusterSpec
) -> tuple[ClusterSpec, EfficiencyCurve]:
    """The cluster and curve to plan with: ``cluster`` and the analytic model, or, with a
    DB's ``inputs``, the cluster with its links measured and the measured curve."""
    if inputs is None:
        return cluster, DEFAULT_CURVE
    return inputs.cluster, inputs.curve


def plan_with_cost_inputs(plan: Plan, inputs: ProfiledInputs | None) -> Plan:
    """``plan`` recording the measured numbers it was priced with (if any)."""
    if inputs is None:
        return plan
    return dataclasses.replace(plan, cost_inputs=cost_inputs_for(plan, inputs))


class PriceBasis(StrEnum):
    PROFILE_DB = "profile DB"  # a DB given now
    RECORDED = "recorded"  # the measurements the plan file records (made from a DB)
    ANALYTIC = "analytic"  # the analytic cost model


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanPrices:
    plan: Plan  # with a DB: its cluster's links measured
    curve: EfficiencyCurve
    basis: PriceBasis
    # With a DB given: it is not the one the plan was made with (by digest).
    other_db: bool = False
    inputs: ProfiledInputs | None = None  # the DB's inputs, with a DB given


def plan_prices(
    plan: Plan, *, profiles: str | Path | ProfileDB | None = None, source: str = "plan"
) -> PlanPrices:
    """What to simulate or estimate ``plan`` with: a profile DB's measurements when one is
    given; otherwise the measurements the plan records (a plan made with a DB), so the
    simulation and the prediction it is compared with use the numbers the planner used;
    otherwise the analytic model. ``source`` names the plan file in errors about the
    measurements it records."""
    if profiles is not None:
        inputs = load_profiles(
            profiles, cluster=plan.cluster, model=plan.model, precision=plan.job.precision
        )
        recorded = plan.cost_inputs
        return PlanPrices(
            plan=dataclasses.replace(plan, cluster=inputs.cluster),
            curve=inputs.curve,
            basis=PriceBasis.PROFILE_DB,
            other_db=recorded is not None and recorded.profile_db_digest != inputs.db.digest,
            inputs=inputs,
        )
    if plan.cost_inputs is not None:
        return PlanPrices(
            plan=plan, curve=recorded_curve(plan, source=source), basis=PriceBasis.RECORDED
        )
    return PlanPrices(plan=plan, curve=DEFAULT_CURVE, basis=PriceBasis.ANALYTIC)
