"""``piebald simulate`` and ``piebald plan --simulate`` end to end: JSON shape, pictures,
refusing to overwrite, bad input as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.examples import example_path
from piebald.specs.plan_io import load_plan

SMALL = ["--model", "tiny", "--global-batch", "8", "--seq-len", "64"]


def _plan(tmp_path: Path) -> Path:
    out = tmp_path / "plan.json"
    code, output = run_cli("plan", "--cluster", str(example_path()), *SMALL, "--out", str(out))
    assert code == 0, output
    return out


@pytest.mark.slow
def test_simulate_json_has_the_issue_fields_and_pictures_are_written(tmp_path: Path) -> None:
    plan_file = _plan(tmp_path)
    trace, gantt = tmp_path / "trace.json", tmp_path / "gantt.png"
    code, output = run_cli(
        "simulate", "--plan", str(plan_file), "--trace", str(trace), "--gantt", str(gantt), "--json"
    )
    assert code == 0, output
    data = json.loads(output)
    assert data["deadlock"] is None
    assert data["step_time_s"] > 0 and data["tokens_per_s"] > 0
    assert 0 <= data["bubble_fraction"] < 1
    plan = load_plan(plan_file)
    assert data["tokens_per_s"] * data["step_time_s"] == pytest.approx(plan.job.tokens_per_step)
    assert set(data["peak_memory_bytes"]) == {str(rank) for rank in plan.used_ranks}
    for rank, peak in data["peak_memory_bytes"].items():
        assert peak <= data["predicted"]["peak_memory_bytes"][rank] * (1 + 1e-12)
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {
        f"rank {rank} · {plan.cluster.device_of(rank).name} · stage {plan.stage_of_rank[rank]}"
        for rank in plan.used_ranks
    }
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_simulate_table_and_no_silent_overwrite(tmp_path: Path) -> None:
    plan_file = _plan(tmp_path)
    gantt = tmp_path / "gantt.png"
    gantt.write_bytes(b"mine")
    code, output = run_cli("simulate", "--plan", str(plan_file), "--gantt", str(gantt))
    assert code == 2 and "exists" in output
    assert gantt.read_bytes() == b"mine"
    code, output = run_cli("simulate", "--plan", str(plan_file), "--gantt", str(gantt), "--force")
    assert code == 0, output
    assert "simulated step" in output and "planner predicted" in output


def test_simulate_bad_plan_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1}')
    code, output = run_cli("simulate", "--plan", str(bad))
    assert code == 2
    assert "Traceback" not in output and "error" in output


@pytest.mark.slow
def test_plan_simulate_verifies_the_top_candidates(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--simulate", "--out", str(out)
    )
    assert code == 0, output
    assert "verified in the simulator" in output and "*" in output
    plan = load_plan(out)
    assert plan.predicted is not None and plan.upper_bound_tokens_per_s is not None
