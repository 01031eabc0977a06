"""``piebald demo`` end to end (what ``make demo`` runs), with one emulated training step per
plan instead of three: every stage runs and leaves its artefacts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from piebald.cli import app
from piebald.specs.plan_io import load_plan


@pytest.mark.slow
@pytest.mark.distributed
def test_demo_plans_compares_simulates_and_trains(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--out-dir", str(out), "--train-steps", "1"])
    assert result.exit_code == 0, result.output
    for heading in (
        "1. describe",
        "2. plan",
        "3. explain",
        "4. compare",
        "5. simulate",
        "6. train",
    ):
        assert heading in result.output
    plan = load_plan(out / "plan.json")
    assert plan.predicted is not None
    trace = json.loads((out / "trace.json").read_text())
    assert trace["traceEvents"]
    assert (out / "gantt.png").stat().st_size > 10_000
    assert (out / "compare.png").stat().st_size > 10_000
    metrics = [
        json.loads(line) for line in (out / "metrics-piebald.jsonl").read_text().splitlines()
    ]
    assert len(metrics) == 1 and metrics[0]["step"] == 1
    assert "measured / predicted" in result.output
