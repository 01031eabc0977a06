"""A plan's optional checkpoint interval (``checkpoint_every_steps``): written only where
chosen, read back equal, absent in older plan files (which stay readable), and a bad value
refused naming the field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from piebald.errors import SpecError
from piebald.specs.plan import PLAN_VERSION, Plan
from piebald.specs.plan_io import load_plan, plan_from_dict, plan_to_dict, save_plan
from tensor_plans import tp_plan, tp_stage


def _plan(every: int | None = None) -> Plan:
    plan = tp_plan("tiny", [tp_stage(layers=(0, 6), ranks=range(2), degree=1, num_micro_batches=2)])
    return dataclasses.replace(plan, checkpoint_every_steps=every)


def test_the_interval_round_trips_through_a_plan_file(tmp_path: Path) -> None:
    plan = _plan(240)
    data = plan_to_dict(plan)
    assert data["checkpoint_every_steps"] == 240
    assert data["version"] == PLAN_VERSION  # an optional field: the format's version stays
    assert plan_from_dict(json.loads(json.dumps(data)), source="p.json") == plan
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert load_plan(path).checkpoint_every_steps == 240


def test_a_plan_without_an_interval_writes_none_and_older_files_read_as_none() -> None:
    data = plan_to_dict(_plan())
    assert "checkpoint_every_steps" not in data  # as older plans were written
    assert plan_from_dict(data, source="old.json").checkpoint_every_steps is None
    data["checkpoint_every_steps"] = None  # null reads as absent
    assert plan_from_dict(data, source="old.json").checkpoint_every_steps is None


@pytest.mark.parametrize("value", [0, -5, 2.5, "240", True])
def test_a_bad_interval_in_a_file_names_the_field(value: object) -> None:
    data = plan_to_dict(_plan())
    data["checkpoint_every_steps"] = value
    with pytest.raises(SpecError) as caught:
        plan_from_dict(data, source="p.json")
    message = str(caught.value)
    assert message.startswith("p.json: checkpoint_every_steps") and "\n" not in message


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_a_bad_interval_is_refused_at_construction(value: object) -> None:
    with pytest.raises(SpecError, match="checkpoint_every_steps"):
        _plan(value)  # type: ignore[arg-type]
