"""piebald: plan, simulate and run LLM training on heterogeneous GPU clusters.

The Python API (``piebald.api``) is re-exported here: ``piebald.load_cluster``,
``piebald.plan``, ``piebald.simulate`` and the rest. It is imported on first use, so
``import piebald`` stays cheap for the command line and the training processes, and only
``piebald.emulate``, ``piebald.train`` and the runtime's types (``piebald.TrainConfig``,
``piebald.RunSummary``) import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from piebald.api import (
        ClusterSpec,
        Comparison,
        Dtype,
        Infeasible,
        JobSpec,
        ModelSpec,
        Plan,
        PlanEstimate,
        PlanResult,
        ProfileWarning,
        RunSummary,
        SimulationReport,
        SimulationResult,
        TrainConfig,
        ZeroMode,
        build_job,
        compare,
        emulate,
        estimate,
        explain,
        load_cluster,
        load_model,
        load_plan,
        plan,
        save_plan,
        search_plans,
        simulate,
        simulate_report,
        train,
    )

__all__ = [
    "ClusterSpec",
    "Comparison",
    "Dtype",
    "Infeasible",
    "JobSpec",
    "ModelSpec",
    "Plan",
    "PlanEstimate",
    "PlanResult",
    "ProfileWarning",
    "RunSummary",
    "SimulationReport",
    "SimulationResult",
    "TrainConfig",
    "ZeroMode",
    "__version__",
    "build_job",
    "compare",
    "emulate",
    "estimate",
    "explain",
    "load_cluster",
    "load_model",
    "load_plan",
    "plan",
    "save_plan",
    "search_plans",
    "simulate",
    "simulate_report",
    "train",
]
_API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> object:
    # PEP 562: the API module (and the planner and simulator it imports) loads on the first
    # ``piebald.<name>``, not on ``import piebald`` (which every subpackage import runs).
    if name in _API:
        value = getattr(importlib.import_module("piebald.api"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'piebald' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
