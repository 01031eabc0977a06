"""The planning commands end to end: plan, explain, compare (JSON shape, plot), exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.examples import example_path
from piebald.report.explain import explain_plan
from piebald.specs.plan_io import load_plan
from piebald.specs.recompute import Recompute

SMALL = ["--model", "tiny", "--global-batch", "8", "--seq-len", "64"]


@pytest.mark.slow
def test_plan_writes_a_valid_plan_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, output = run_cli("plan", "--cluster", str(example_path()), *SMALL, "--out", str(out))
    assert code == 0, output
    assert "achievable efficiency" in output and "tokens/s" in output
    plan = load_plan(out)
    assert plan.predicted is not None and plan.upper_bound_tokens_per_s is not None
    assert plan.predicted.tokens_per_s <= plan.upper_bound_tokens_per_s
    before = out.read_bytes()
    code, output = run_cli("plan", "--cluster", str(example_path()), *SMALL, "--out", str(out))
    assert code == 2 and "exists" in output
    assert out.read_bytes() == before
    code, _ = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--out", str(out), "--force"
    )
    assert code == 0


@pytest.mark.slow
def test_plan_json_is_the_plan(tmp_path: Path) -> None:
    code, output = run_cli("plan", "--cluster", str(example_path()), *SMALL, "--json")
    assert code == 0
    data = json.loads(output)
    assert data["version"] == 1 and data["stages"] and "predicted" in data
    assert data["upper_bound_tokens_per_s"] >= data["predicted"]["tokens_per_s"]


@pytest.mark.slow
def test_infeasible_plan_exits_3_with_what_does_not_fit() -> None:
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        "--model",
        "llama-3-70b",
        "--global-batch",
        "8",
        "--seq-len",
        "2048",
    )
    assert code == 3
    assert "llama-3-70b" in output and "smallest fix" in output
    assert "Traceback" not in output


def test_unknown_strategy_is_one_line() -> None:
    code, output = run_cli("plan", "--cluster", str(example_path()), *SMALL, "--strategy", "zorze")
    assert code == 2 and "did you mean 'zorse'" in output


@pytest.mark.slow
def test_explain_names_the_bottleneck_and_every_gpu(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert run_cli("plan", "--cluster", str(example_path()), *SMALL, "--out", str(out))[0] == 0
    code, output = run_cli("explain", str(out))
    assert code == 0, output
    assert "bottleneck" in output and "what limits each GPU" in output
    plan = load_plan(out)
    explanation = explain_plan(plan)
    assert sorted(g.rank for g in explanation.gpus) == sorted(plan.used_ranks)
    assert any(g.verdict.startswith("compute-bound") for g in explanation.gpus)
    total = explanation.estimate.pipeline_s + explanation.estimate.exposed_sync_s
    assert explanation.estimate.step_time_s == pytest.approx(total + explanation.optimizer_s)


@pytest.mark.slow
def test_compare_json_shape_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "compare.png"
    code, output = run_cli(
        "compare", "--cluster", str(example_path()), *SMALL, "--json", "--plot", str(plot)
    )
    assert code == 0, output
    data = json.loads(output)
    assert set(data) == {"results", "upper_bound_tokens_per_s"}
    names = [row["strategy"] for row in data["results"]]
    assert names[0] == "piebald"
    assert {
        "megatron",
        "zero-even",
        "cephalo",
        "poplar",
        "metis",
        "sailor",
        "holmes",
        "zorse",
    } <= set(names)
    for row in data["results"]:
        assert set(row) == {
            "strategy",
            "feasible",
            "tokens_per_s",
            "step_time_s",
            "num_gpus_used",
            "reason",
        }
    feasible = [row["tokens_per_s"] for row in data["results"] if row["feasible"]]
    assert data["results"][0]["tokens_per_s"] == pytest.approx(max(feasible))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("zero", ["none", "optimizer", "gradients", "full"])
@pytest.mark.slow
def test_plan_zero_restricts_every_stage(zero: str, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--zero", zero, "--out", str(out)
    )
    assert code == 0, output
    plan = load_plan(out)
    assert {stage.zero.value for stage in plan.stages} == {zero}
    code, output = run_cli("explain", str(out))
    assert code == 0 and "bottleneck" in output


def test_plan_zero_errors_are_one_line() -> None:
    code, output = run_cli("plan", "--cluster", str(example_path()), *SMALL, "--zero", "zero3")
    assert code == 2 and "--zero" in output and "'gradients'" in output
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--zero", "full", "--strategy", "metis"
    )
    assert code == 2 and "strategy metis can use" in output and "Traceback" not in output


def test_plan_tensor_parallel_restricts_every_stage(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        *SMALL,
        "--tensor-parallel",
        "2",
        "--out",
        str(out),
    )
    assert code == 0, output
    plan = load_plan(out)
    assert {stage.tensor_parallel_degree for stage in plan.stages} == {2}
    for stage in plan.stages:
        for group in stage.tensor_groups:
            assert len({plan.cluster.node_of(rank).index for rank in group}) == 1
    code, output = run_cli("explain", str(out))
    assert code == 0 and "bottleneck" in output


def test_plan_tensor_parallel_errors_are_one_line() -> None:
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--tensor-parallel", "3"
    )
    assert code == 2 and "--tensor-parallel" in output and "[1, 2, 4, 8]" in output
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        *SMALL,
        "--tensor-parallel",
        "2",
        "--strategy",
        "zorse",
    )
    assert code == 2 and "no tensor parallelism" in output and "Traceback" not in output
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        "--model",
        "tiny",
        "--global-batch",
        "8",
        "--seq-len",
        "62",
        "--tensor-parallel",
        "4",
    )
    assert code == 2 and "--tensor-parallel" in output and "sequence length (62)" in output


def test_plan_tensor_parallel_that_cannot_exist_is_bad_input(tmp_path: Path) -> None:
    # A degree the model does not split into, or larger than every node: exit 2 with the
    # reason, where the search found nothing and blamed memory (exit 3).
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--tensor-parallel", "8"
    )  # fmt: skip
    assert code == 2, output
    assert "--tensor-parallel: got 8; expected a degree dividing the model's" in output
    two_gpu_nodes = tmp_path / "two.yaml"
    two_gpu_nodes.write_text(
        "name: two\nnodes:\n"
        "  - {name: a, count: 2, gpu: A100-80GB, gpus_per_node: 2, intra_link: 600GB/s}\n"
    )
    code, output = run_cli(
        "plan", "--cluster", str(two_gpu_nodes), "--model", "gpt2", "--global-batch", "8",
        "--seq-len", "64", "--tensor-parallel", "4",
    )  # fmt: skip
    assert code == 2, output
    assert "expected at most 2: a tensor group sits inside one node" in output


def test_plan_recompute_restricts_every_stage_and_the_plan_trains(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--recompute", "selective",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    plan = load_plan(out)
    assert {stage.recompute for stage in plan.stages} == {Recompute.SELECTIVE}
    assert "│ sel │" in output  # the table's recompute column (the caption names "sel" too)
    code, output = run_cli("explain", str(out))
    assert code == 0 and "selective recompute" in output


def test_plan_recompute_errors_are_one_line() -> None:
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--recompute", "partial"
    )
    assert code == 2 and "--recompute" in output and "'selective'" in output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), *SMALL, "--recompute", "none,selective",
        "--strategy", "zorse",
    )  # fmt: skip
    assert code == 2 and "strategy zorse can use" in output and "['full']" in output


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_workers_must_be_at_least_one(command: str) -> None:
    code, output = run_cli(command, "--cluster", str(example_path()), *SMALL, "--workers", "0")
    assert code == 2 and "--workers" in output and "Traceback" not in output
