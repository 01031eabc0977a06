"""``piebald plan --fallbacks DIR``: after the plan, the plan for the loss of any one node,
one file per node group, a line as each is made; a bad directory refused before planning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.examples import example_path
from piebald.planner.fallback import find_fallback_plan, single_loss_memberships
from piebald.specs.plan_io import load_plan

SMALL = ["--model", "tiny", "--global-batch", "8", "--seq-len", "64"]


@pytest.mark.slow
def test_plan_writes_a_fallback_plan_per_node_group(tmp_path: Path) -> None:
    out, fallbacks = tmp_path / "plan.json", tmp_path / "fallbacks"
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--out", str(out),
        "--fallbacks", str(fallbacks),
    )  # fmt: skip
    assert code == 0, output
    assert "plan written to" in output
    for node in ("a100-0", "v100-0", "ws-0"):
        assert f"without {node}: " in output
    assert f"3 fallback plans written to {fallbacks}" in output
    plan = load_plan(out)
    assert len(list(fallbacks.glob("fallback-*.json"))) == 3
    for membership in single_loss_memberships(plan.cluster):
        found = find_fallback_plan(fallbacks, membership, plan=plan)
        assert found is not None and found.cluster == membership.sub_cluster()


@pytest.mark.slow
def test_fallback_lines_keep_the_json_on_stdout_whole(tmp_path: Path) -> None:
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--json",
        "--fallbacks", str(tmp_path / "fallbacks"),
    )  # fmt: skip
    assert code == 0, output
    text = output[: output.index("fallback plan")]  # the lines after it are stderr's
    assert json.loads(text)["stages"]


def test_a_file_as_fallbacks_is_refused_before_planning(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--fallbacks", str(file)
    )
    assert code == 2
    assert "--fallbacks" in output and "a directory" in output
    assert "Traceback" not in output
