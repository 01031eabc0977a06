"""``piebald plan --checkpoint-every`` and ``piebald simulate --mtbf`` end to end: the plan
file records the interval, the output says it and why in one line, the simulation prices a
failure (text and JSON), and every bad flag is one line and exit 2, before any search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run_cli
from cluster_builders import CPU_LAB_YAML
from piebald.cost.failure import (
    DEFAULT_DETECT_S,
    DEFAULT_REPLAN_S,
    DEFAULT_RESTART_S,
    FailureModel,
    price_failures,
)
from piebald.specs.plan_io import load_plan

SMALL = ["--model", "tiny", "--global-batch", "8", "--seq-len", "64"]


@pytest.fixture(scope="module")
def cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "cpu-lab.yaml"
    path.write_text(CPU_LAB_YAML)
    return path


@pytest.fixture(scope="module")
def auto_plan(cluster_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A plan made with --checkpoint-every auto --mtbf 24h, and what plan printed."""
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    code, output = run_cli(
        "plan",
        "--cluster",
        str(cluster_file),
        *SMALL,
        "--checkpoint-every",
        "auto",
        "--mtbf",
        "24h",
        "--out",
        str(out),
    )
    assert code == 0, output
    return out, output


def _one_line_error(code: int, output: str, *words: str) -> None:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert code == 2, output
    assert len(lines) == 1 and "Traceback" not in output, output
    assert lines[0].startswith("error:"), output
    for word in words:
        assert word in lines[0], output


# -- plan --------------------------------------------------------------------------------------


def test_plan_auto_records_daly_interval_and_says_why(auto_plan: tuple[Path, str]) -> None:
    path, output = auto_plan
    plan = load_plan(path)
    assert plan.predicted is not None
    expected = price_failures(
        plan, model=FailureModel(mtbf_s=86400.0), step_time_s=plan.predicted.step_time_s
    )
    assert plan.checkpoint_every_steps == expected.daly_steps
    lines = [line for line in output.splitlines() if line.startswith("checkpoint every")]
    assert len(lines) == 1, output
    assert f"checkpoint every {expected.daly_steps} steps" in lines[0]
    assert "Daly's for MTBF 24 h" in lines[0] and "Young's" in lines[0]
    assert json.loads(path.read_text())["checkpoint_every_steps"] == expected.daly_steps


def test_plan_records_a_given_interval(cluster_file: Path) -> None:
    code, output = run_cli(
        "plan", "--cluster", str(cluster_file), *SMALL, "--checkpoint-every", "25", "--json"
    )
    assert code == 0, output
    assert json.loads(output)["checkpoint_every_steps"] == 25


def test_plan_given_interval_with_mtbf_compares_it_with_daly(cluster_file: Path) -> None:
    code, output = run_cli(
        "plan", "--cluster", str(cluster_file), *SMALL, "--checkpoint-every", "25", "--mtbf", "3h"
    )
    assert code == 0, output
    line = next(line for line in output.splitlines() if line.startswith("checkpoint every"))
    assert "checkpoint every 25 steps" in line and "--checkpoint-every" in line
    assert "Daly's for MTBF 3 h" in line


def test_plan_without_an_interval_records_none(cluster_file: Path) -> None:
    code, output = run_cli("plan", "--cluster", str(cluster_file), *SMALL, "--json")
    assert code == 0, output
    assert "checkpoint_every_steps" not in json.loads(output)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--checkpoint-every", "auto"], ["--checkpoint-every", "--mtbf"]),
        (["--checkpoint-every", "0"], ["--checkpoint-every", "whole number"]),
        (["--checkpoint-every", "2.5"], ["--checkpoint-every"]),
        (["--checkpoint-every", "often"], ["--checkpoint-every"]),
        (["--checkpoint-every", "9" * 40], ["--checkpoint-every"]),
        (["--mtbf", "24"], ["--mtbf", "'24h'"]),
        (["--mtbf", "0h"], ["--mtbf", "> 0"]),
        (["--mtbf", "-3h"], ["--mtbf"]),
        (["--mtbf", "24h", "--storage-write", "fast"], ["--storage-write", "Gb/s"]),
        (["--mtbf", "24h", "--storage-write", "0GB/s"], ["--storage-write", "> 0"]),
        (["--storage-write", "2GB/s"], ["--storage-write", "--mtbf"]),
    ],
)
def test_plan_bad_checkpoint_flags_are_one_line(
    cluster_file: Path, flags: list[str], words: list[str]
) -> None:
    code, output = run_cli("plan", "--cluster", str(cluster_file), *SMALL, *flags)
    _one_line_error(code, output, *words)


# -- simulate ----------------------------------------------------------------------------------


def test_simulate_mtbf_json_prices_a_failure_at_the_plans_interval(
    auto_plan: tuple[Path, str],
) -> None:
    path, _ = auto_plan
    plan = load_plan(path)
    code, output = run_cli(
        "simulate", "--plan", str(path), "--mtbf", "24h", "--replan-time", "1min", "--json"
    )
    assert code == 0, output
    data = json.loads(output)
    failure = data["failure"]
    assert failure["mtbf_s"] == 86400.0
    assert failure["step_time_s"] == data["step_time_s"]
    assert failure["checkpoint_every_source"] == "plan"
    assert failure["checkpoint_every_steps"] == plan.checkpoint_every_steps
    cost = failure["cost"]
    assert (cost["detect_s"], cost["restart_s"], cost["replan_s"]) == (
        DEFAULT_DETECT_S,
        DEFAULT_RESTART_S,
        60.0,
    )
    assert cost["lost_work_s"] == pytest.approx(
        failure["checkpoint_every_steps"] / 2 * data["step_time_s"]
    )
    parts = ("detect_s", "restart_s", "replan_s", "restore_s", "lost_work_s")
    assert cost["total_s"] == pytest.approx(sum(cost[name] for name in parts))
    assert failure["save_s"] == pytest.approx(
        failure["checkpoint_bytes"] / failure["write_bytes_per_s"]
    )
    assert failure["young_steps"] >= failure["daly_steps"] >= 1


def test_simulate_without_a_recorded_interval_prices_daly(
    auto_plan: tuple[Path, str], tmp_path: Path
) -> None:
    data = json.loads(auto_plan[0].read_text())
    del data["checkpoint_every_steps"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    code, output = run_cli(
        "simulate", "--plan", str(bare), "--mtbf", "6h", "--storage-write", "1GB/s", "--json"
    )
    assert code == 0, output
    failure = json.loads(output)["failure"]
    assert failure["checkpoint_every_source"] == "daly"
    assert failure["checkpoint_every_steps"] == failure["daly_steps"]
    assert failure["write_bytes_per_s"] == failure["read_bytes_per_s"] == 1e9
    assert failure["cost"]["replan_s"] == DEFAULT_REPLAN_S


def test_simulate_mtbf_text_says_the_price_and_the_interval(auto_plan: tuple[Path, str]) -> None:
    code, output = run_cli("simulate", "--plan", str(auto_plan[0]), "--mtbf", "24h")
    assert code == 0, output
    assert "a failure costs" in output
    for part in ("detect", "restart", "re-plan", "restore", "lost work"):
        assert part in output
    assert "checkpoint every" in output and "Daly's for MTBF 24 h" in output


def test_simulate_without_mtbf_has_no_failure(auto_plan: tuple[Path, str]) -> None:
    code, output = run_cli("simulate", "--plan", str(auto_plan[0]), "--json")
    assert code == 0, output
    assert "failure" not in json.loads(output)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--mtbf", "soon"], ["--mtbf"]),
        (["--mtbf", "24h", "--detect-time", "-1s"], ["--detect-time"]),
        (["--mtbf", "24h", "--restart-time", "1"], ["--restart-time"]),
        (["--mtbf", "24h", "--storage-read", "1GB"], ["--storage-read"]),
        (["--detect-time", "10min"], ["--detect-time", "--mtbf"]),
        (["--replan-time", "1s"], ["--replan-time", "--mtbf"]),
    ],
)
def test_simulate_bad_failure_flags_are_one_line(
    auto_plan: tuple[Path, str], flags: list[str], words: list[str]
) -> None:
    code, output = run_cli("simulate", "--plan", str(auto_plan[0]), *flags)
    _one_line_error(code, output, *words)
