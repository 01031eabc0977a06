"""A plan made from profiles is re-checked against its cluster's memory with the prices it
was made with: the activations its ``cost_inputs`` record, not
the formula's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piebald.cli.common import load_checked_plan
from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.in_flight import stage_in_flight
from piebald.cost.memory import GIB, framework_reserve_bytes, plan_rank_memory
from piebald.cost.plan_fit import first_memory_overflow
from piebald.cost.recorded_curve import recorded_curve
from piebald.errors import SpecError
from piebald.specs.plan import Plan
from piebald.specs.plan_io import load_plan

from .test_measured_memory import _plan_file, _write_db


def _largest_need_beyond_reserve(plan: Plan, curve: EfficiencyCurve) -> float:
    """The most any rank needs besides the framework reserve (which grows with capacity)."""
    most = 0.0
    for index, stage in enumerate(plan.stages):
        budgets = stage_in_flight(plan, index)
        for position, rank in enumerate(stage.ranks):
            total = plan_rank_memory(
                plan, stage_index=index, position=position, num_in_flight=budgets[position],
                curve=curve,
            ).total_bytes  # fmt: skip
            most = max(most, total - framework_reserve_bytes(plan.cluster.device_of(rank)))
    return most


def test_a_profiled_plan_is_rechecked_with_its_recorded_activations(tmp_path: Path) -> None:
    db = _write_db(tmp_path / "db", block_bytes_per_sequence=0.05 * GIB)
    code, output, plan_file = _plan_file(tmp_path, db)
    assert code == 0, output
    plan = load_checked_plan(plan_file)  # what the planner accepted loads
    assert plan.cost_inputs is not None and plan.cost_inputs.activations
    measured = _largest_need_beyond_reserve(plan, recorded_curve(plan))
    formula = _largest_need_beyond_reserve(plan, DEFAULT_CURVE)
    assert measured > formula
    # A capacity M fits a rank needing X beside the reserve when M >= 1 GiB + 0.05 M + X:
    # choose one between the formula's threshold and the measurements'.
    threshold = [(1.0 * GIB + need) / 0.95 for need in (formula, measured)]
    capacity = sum(threshold) / 2
    data = json.loads(plan_file.read_text())
    data["cluster"]["gpu_types"][0]["memory"] = f"{capacity!r}B"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    shrunk = load_plan(edited)
    assert first_memory_overflow(shrunk, curve=DEFAULT_CURVE) is None  # the formula fits
    with pytest.raises(SpecError, match=r"stages\[\d+\]: expected every rank to fit"):
        load_checked_plan(edited)
