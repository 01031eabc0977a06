"""piebald from Python: describe a cluster, a model and a job; plan; estimate and simulate
a plan; compare strategies; save and load plans; emulate or train under a plan; measure
and calibrate profiles; prepare training data.

The ``piebald`` command line is a client of this package: each command parses its flags,
calls one function here and renders what it returns, so what the CLI shows as tables
comes back as dataclasses (:class:`PlanResult`, :class:`Comparison`,
:class:`SimulationReport`, ...). Planning, estimating and simulating never import torch;
training and measuring import it when called, and the runtime's types
(:class:`TrainConfig`, :class:`RunSummary`, ...) when first named. Every name here loads
its module on first use, so a process imports only what it calls (``piebald plan`` the
planner, not the profiler's scipy.optimize or the simulator).

>>> import piebald
>>> from piebald.examples import example_path
>>> cluster = piebald.load_cluster(example_path())  # the lab-mix example: 6 GPUs, 3 types
>>> model = piebald.load_model("tiny")
>>> job = piebald.build_job(global_batch=8, seq_len=64)
>>> plan = piebald.plan(cluster, model, job)
>>> plan.predicted.tokens_per_s > 0
True
>>> piebald.simulate(plan).step_time_s > 0
True

Bad arguments raise :class:`~piebald.errors.ArgumentError` (a ``ValueError``) naming the
argument; bad files raise :class:`~piebald.errors.SpecError` naming the file and field;
no plan fitting memory raises :class:`Infeasible`.

The modules, one per concern: :mod:`piebald.api.inputs` (loading and saving),
:mod:`~piebald.api.planning`, :mod:`~piebald.api.simulation`,
:mod:`~piebald.api.training`, :mod:`~piebald.api.profiling` and :mod:`~piebald.api.data`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piebald.api.data import prepare_data
    from piebald.api.inputs import (
        Profiles,
        ProfileWarning,
        Progress,
        build_job,
        load_cluster,
        load_model,
        load_plan,
        save_plan,
    )
    from piebald.api.planning import (
        Comparison,
        ComparisonRow,
        Explanation,
        FallbackPlans,
        Infeasible,
        PlanResult,
        ScoredPlan,
        Verification,
        VerifiedCandidate,
        compare,
        explain,
        fallback_plans,
        plan,
        search_plans,
    )
    from piebald.api.profiling import (
        Calibration,
        ComputeProfile,
        NetworkProfile,
        ProfileDB,
        calibrate,
        load_profile_db,
        merge_profile_dbs,
        profile_compute,
        profile_network,
        write_profile,
    )
    from piebald.api.simulation import (
        PriceBasis,
        SimulationReport,
        SimulationResult,
        estimate,
        plot_gantt,
        simulate,
        simulate_report,
        write_trace,
    )
    from piebald.api.training import (
        DEFAULT_MAX_EMULATED_PARAMS,
        MISSING_PACKAGE,
        ComputeDtype,
        LrDecay,
        LrSchedule,
        OptimizerConfig,
        RunSummary,
        TrainConfig,
        check_hf_weights,
        emulate,
        emulated_model,
        tensorboard_available,
        train,
        train_reference,
        under_torchrun,
    )
    from piebald.cost.failure import FailureModel
    from piebald.cost.plan_estimate import PlanEstimate
    from piebald.specs.cluster import ClusterSpec
    from piebald.specs.devices import Dtype
    from piebald.specs.job import JobSpec
    from piebald.specs.model import ModelSpec
    from piebald.specs.plan import Plan, ZeroMode

__all__ = [
    "DEFAULT_MAX_EMULATED_PARAMS",
    "MISSING_PACKAGE",
    "Calibration",
    "ClusterSpec",
    "Comparison",
    "ComparisonRow",
    "ComputeDtype",
    "ComputeProfile",
    "Dtype",
    "Explanation",
    "FailureModel",
    "FallbackPlans",
    "Infeasible",
    "JobSpec",
    "LrDecay",
    "LrSchedule",
    "ModelSpec",
    "NetworkProfile",
    "OptimizerConfig",
    "Plan",
    "PlanEstimate",
    "PlanResult",
    "PriceBasis",
    "ProfileDB",
    "ProfileWarning",
    "Profiles",
    "Progress",
    "RunSummary",
    "ScoredPlan",
    "SimulationReport",
    "SimulationResult",
    "TrainConfig",
    "Verification",
    "VerifiedCandidate",
    "ZeroMode",
    "build_job",
    "calibrate",
    "check_hf_weights",
    "compare",
    "emulate",
    "emulated_model",
    "estimate",
    "explain",
    "fallback_plans",
    "load_cluster",
    "load_model",
    "load_plan",
    "load_profile_db",
    "merge_profile_dbs",
    "plan",
    "plot_gantt",
    "prepare_data",
    "profile_compute",
    "profile_network",
    "save_plan",
    "search_plans",
    "simulate",
    "simulate_report",
    "tensorboard_available",
    "train",
    "train_reference",
    "under_torchrun",
    "write_profile",
    "write_trace",
]


# Where each name of __all__ lives (the imports above, for type checkers and the docs).
_HOMES = {
    "piebald.api.data": ("prepare_data",),
    "piebald.api.inputs": (
        "ProfileWarning",
        "Profiles",
        "Progress",
        "build_job",
        "load_cluster",
        "load_model",
        "load_plan",
        "save_plan",
    ),
    "piebald.api.planning": (
        "Comparison",
        "ComparisonRow",
        "Explanation",
        "FallbackPlans",
        "Infeasible",
        "PlanResult",
        "ScoredPlan",
        "Verification",
        "VerifiedCandidate",
        "compare",
        "explain",
        "fallback_plans",
        "plan",
        "search_plans",
    ),
    "piebald.api.profiling": (
        "Calibration",
        "ComputeProfile",
        "NetworkProfile",
        "ProfileDB",
        "calibrate",
        "load_profile_db",
        "merge_profile_dbs",
        "profile_compute",
        "profile_network",
        "write_profile",
    ),
    "piebald.api.simulation": (
        "PriceBasis",
        "SimulationReport",
        "SimulationResult",
        "estimate",
        "plot_gantt",
        "simulate",
        "simulate_report",
        "write_trace",
    ),
    "piebald.api.training": (
        "DEFAULT_MAX_EMULATED_PARAMS",
        "MISSING_PACKAGE",
        "ComputeDtype",
        "LrDecay",
        "LrSchedule",
        "OptimizerConfig",
        "RunSummary",
        "TrainConfig",
        "check_hf_weights",
        "emulate",
        "emulated_model",
        "tensorboard_available",
        "train",
        "train_reference",
        "under_torchrun",
    ),
    "piebald.cost.failure": ("FailureModel",),
    "piebald.cost.plan_estimate": ("PlanEstimate",),
    "piebald.specs.cluster": ("ClusterSpec",),
    "piebald.specs.devices": ("Dtype",),
    "piebald.specs.job": ("JobSpec",),
    "piebald.specs.model": ("ModelSpec",),
    "piebald.specs.plan": ("Plan", "ZeroMode"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
_SUBMODULES = frozenset(
    ("arguments", "data", "inputs", "planning", "profiling", "simulation", "training")
)


def __getattr__(name: str) -> object:
    # PEP 562: each name loads its module on first use, not with ``import piebald.api``, so
    # a process imports only what it calls: ``piebald plan`` the planner, not the profiler's
    # scipy.optimize or the runtime's torch. Not cached: the module stays the one place
    # each name lives.
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
