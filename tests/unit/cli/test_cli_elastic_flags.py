"""``piebald train``'s elastic flags refused where they cannot mean anything (one line, exit
2, before any process starts), and the plan's checkpoint interval taken when
--checkpoint-every is not given."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cli_runner import last_json, run_cli
from piebald.api import build_job, plan
from piebald.examples import example_path
from piebald.specs.plan_io import save_plan


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    save_plan(plan(example_path(), "tiny", build_job(global_batch=8, seq_len=64)), path)
    return path


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--emulate", "--elastic"], "--checkpoint-dir"),
        (["--emulate", "--membership", "m.yaml", "--checkpoint-dir", "CK"], "--membership"),
        (["--emulate", "--fallbacks", "F", "--checkpoint-dir", "CK"], "--fallbacks"),
        (
            ["--emulate", "--elastic", "--node-name", "a100-0", "--checkpoint-dir", "CK"],
            "--node-name",
        ),
        (["--elastic", "--membership", "m.yaml", "--checkpoint-dir", "CK"], "--membership"),
        (["--collective-timeout", "0.5", "--emulate"], "--collective-timeout"),
    ],
)
def test_an_elastic_flag_without_its_meaning_is_one_line(
    tmp_path: Path, plan_file: Path, flags: list[str], named: str
) -> None:
    flags = [str(tmp_path / f) if f in ("m.yaml", "F", "CK") else f for f in flags]
    code, output = run_cli("train", "--plan", str(plan_file), *flags)
    assert code == 2, output
    assert named in output and "Traceback" not in output


def test_an_elastic_flag_needs_a_plan() -> None:
    code, output = run_cli(
        "train", "--model", "tiny", "--global-batch", "2", "--seq-len", "8", "--elastic"
    )
    assert code == 2 and "--elastic" in output


def test_a_membership_file_naming_an_unknown_node_is_one_line(
    tmp_path: Path, plan_file: Path
) -> None:
    membership = tmp_path / "membership.yaml"
    membership.write_text("nodes: [a100-0, h100-7]\n")
    code, output = run_cli(
        "train", "--plan", str(plan_file), "--emulate", "--elastic", "--membership",
        str(membership), "--checkpoint-dir", str(tmp_path / "ckpt"),
    )  # fmt: skip
    assert code == 2, output
    assert str(membership) in output and "h100-7" in output


@pytest.mark.distributed
def test_the_plans_checkpoint_interval_holds_unless_given(tmp_path: Path) -> None:
    chosen = plan(example_path(), "tiny", build_job(global_batch=4, seq_len=32))
    path = tmp_path / "plan.json"
    save_plan(dataclasses.replace(chosen, checkpoint_every_steps=2), path)
    for given, expected in (
        ([], ["step-00000002", "step-00000003"]),
        (["--checkpoint-every", "0"], ["step-00000003"]),
    ):
        checkpoints = tmp_path / f"ckpt{len(given)}"
        code, output = run_cli(
            "train", "--plan", str(path), "--emulate", "--steps", "3", "--json",
            "--checkpoint-dir", str(checkpoints), *given,
        )  # fmt: skip
        assert code == 0, output
        assert last_json(output)["steps"] == 3
        assert sorted(p.name for p in checkpoints.glob("step-*")) == expected
