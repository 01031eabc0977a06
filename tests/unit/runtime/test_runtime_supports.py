"""The runtime refuses what it cannot execute yet (tensor-parallel stages) with one line
naming the field, before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.errors import SpecError
from piebald.examples import example_path
from piebald.runtime.training.supported import check_runtime_supports
from piebald.specs.plan_io import load_plan


def test_a_tensor_parallel_plan_is_refused_by_train(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        "--model",
        "tiny",
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        "--tensor-parallel",
        "2",
        "--out",
        str(out),
    )
    assert code == 0, output
    with pytest.raises(SpecError) as caught:
        check_runtime_supports(load_plan(out))
    assert caught.value.field == "stages[0].tensor_parallel_degree"
    code, output = run_cli("train", "--plan", str(out), "--emulate", "--steps", "1")
    assert code == 2 and "tensor_parallel_degree" in output and "Traceback" not in output
